"""Decode attention over a KV cache (flash-decoding): append kernel, split-KV attention kernel, combine kernel.

Decoding has a handful of query tokens (seqlen_q = 1, or a few for speculative decoding) against a long
cache, so the FlashAttention-2 grid (one program per query block and head) would have batch x heads tiny
programs that each stream a whole cache: too few programs to fill the GPU, and the q tile is 1 row.
Two changes (flash-decoding, Dao et al. 2023):

1. One program per (batch, kv head, row tile, split) handles every query head of its GQA group together:
   rows r = i_q * group + g (query token i_q, head g of the group), so the K/V tile it loads serves all
   group x seqlen_q rows (K/V are read once per kv head, not once per query head), and the rows fill a
   tl.dot tile (padded to >= 16).
2. The visible keys are cut into ``num_splits`` block-aligned chunks, one program each. Every split
   writes its partial result normalized by its own softmax, plus its log-sum-exp:

       O_s = sum_{j in s} exp(x_j - lse_s) v_j,          lse_s = log sum_{j in s} exp(x_j)

   and the combine kernel merges them exactly:

       lse = log sum_s exp(lse_s),        O = sum_s exp(lse_s - lse) O_s

   (an empty split has lse_s = -inf and weight 0). With num_splits = 1 the attention kernel writes the
   final output directly.

Keys are addressed by their logical index j in [0, seqlen_k), seqlen_k = cache_seqlens[b] + seqlen_new -
leftpad[b]; the key sits at cache position p = leftpad[b] + j. A contiguous cache holds it at row p of
cache entry cache_batch_idx[b] (or b); a paged cache at row p % page_size of page block_table[b, p //
page_size] (page_size a power of two: shifts and masks; the lookup is per key, so any page size works
with any BLOCK_N). Causal / window / softcap / ALiBi come from _flash_common.score_mod on logical indices
(flash-attn's semantics: the diagonal is bottom-right aligned, left padding is not part of the sequence).

Inference only: no backward (flash-attn's flash_attn_with_kvcache has none either).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..._env import INTERPRET
from .._triton import cdiv, dot, next_power_of_2, sm_count
from ._flash_common import LOG2E, key_block_phases, score_mod

# ----------------------------------------------------------------------------------------------------
# Append: write the new keys / values into the cache in place
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _kv_append_kernel(
    p_k, p_v, p_kc, p_vc, p_seqlens, p_batch_idx, p_block_table,
    stride_k_b, stride_k_s, stride_k_h, stride_v_b, stride_v_s, stride_v_h,
    stride_kc_b, stride_kc_s, stride_kc_h, stride_vc_b, stride_vc_s, stride_vc_h,
    stride_bt_b, nheads_k, head_dim, log2_page,
    HAS_BATCH_IDX: tl.constexpr, PAGED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """k/v: [batch, seqlen_new, nheads_k, head_dim] -> cache row cache_seqlens[b] + i of sequence b.
    Grid: (seqlen_new, batch, head tiles); each program copies a [BLOCK_H, BLOCK_D] tile of one token."""
    i_s = tl.program_id(0).to(tl.int64)
    i_b = tl.program_id(1).to(tl.int64)
    i_t = tl.program_id(2).to(tl.int64)
    pos = tl.load(p_seqlens + i_b).to(tl.int64) + i_s                     # cache position of this token
    if PAGED:
        page = tl.load(p_block_table + i_b * stride_bt_b + (pos >> log2_page)).to(tl.int64)
        row = pos & ((1 << log2_page) - 1)
        kc_base = p_kc + page * stride_kc_b + row * stride_kc_s
        vc_base = p_vc + page * stride_vc_b + row * stride_vc_s
    else:
        entry = i_b
        if HAS_BATCH_IDX:
            entry = tl.load(p_batch_idx + i_b).to(tl.int64)
        kc_base = p_kc + entry * stride_kc_b + pos * stride_kc_s
        vc_base = p_vc + entry * stride_vc_b + pos * stride_vc_s
    o_h = i_t * BLOCK_H + tl.arange(0, BLOCK_H)                           # [BLOCK_H]
    o_d = tl.arange(0, BLOCK_D)                                           # [BLOCK_D]
    m = (o_h[:, None] < nheads_k) & (o_d[None, :] < head_dim)
    b_k = tl.load(p_k + i_b * stride_k_b + i_s * stride_k_s + o_h[:, None] * stride_k_h + o_d[None, :], mask=m)
    b_v = tl.load(p_v + i_b * stride_v_b + i_s * stride_v_s + o_h[:, None] * stride_v_h + o_d[None, :], mask=m)
    tl.store(kc_base + o_h[:, None] * stride_kc_h + o_d[None, :], b_k.to(p_kc.dtype.element_ty), mask=m)
    tl.store(vc_base + o_h[:, None] * stride_vc_h + o_d[None, :], b_v.to(p_vc.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------------
# Split-KV attention
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _decode_key_blocks(acc, l_i, m_i, q, kc_base, vc_base, p_bt, start, end, leftpad, i_q, o_d, m_d,
                       seqlen_q, seqlen_k, stride_kc_b, stride_kc_s, stride_vc_b, stride_vc_s,
                       log2_page, window_left, window_right, qk_scale, softcap_scale, softcap_log2,
                       alibi_slope_log2, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
                       HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                       PAGED: tl.constexpr, PAGE_ALIGNED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Online softmax over the key blocks [start, end) (logical indices); MASKED phases check each key."""
    for start_n in range(start, end, BLOCK_N):
        o_n = start_n + tl.arange(0, BLOCK_N)                             # [BLOCK_N] logical key index
        pos = (o_n + leftpad).to(tl.int64)                                # cache position
        if MASKED:
            m_n = o_n < seqlen_k
            m_kv = m_n[:, None] & m_d[None, :]                            # [BLOCK_N, BLOCK_D]
        else:
            m_kv = m_d[None, :]
        if PAGED and PAGE_ALIGNED:
            # The block lies in one page (BLOCK_N divides page_size, blocks start at multiples of BLOCK_N,
            # no left padding): one lookup, affine addresses. start_n < seqlen_k: a page in use.
            page = tl.load(p_bt + (start_n >> log2_page)).to(tl.int64)
            row = (start_n & ((1 << log2_page) - 1)) + tl.arange(0, BLOCK_N)
            off_k = page * stride_kc_b + row * stride_kc_s                # [BLOCK_N]
            off_v = page * stride_vc_b + row * stride_vc_s
        elif PAGED:
            # Any page size: one lookup per key (the table row stays in L1).
            if MASKED:
                page = tl.load(p_bt + (pos >> log2_page), mask=m_n, other=0).to(tl.int64)   # [BLOCK_N]
            else:
                page = tl.load(p_bt + (pos >> log2_page)).to(tl.int64)
            row = pos & ((1 << log2_page) - 1)
            off_k = page * stride_kc_b + row * stride_kc_s                # [BLOCK_N]
            off_v = page * stride_vc_b + row * stride_vc_s
        else:
            off_k = pos * stride_kc_s
            off_v = pos * stride_vc_s
        b_k = tl.load(kc_base + off_k[:, None] + o_d[None, :], mask=m_kv, other=0.0)
        qk = dot(q, tl.trans(b_k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32))  # [BLOCK_M, BLOCK_N]
        s2, _ = score_mod(qk, i_q[:, None], o_n[None, :], seqlen_q, seqlen_k, window_left, window_right,
                          qk_scale, softcap_scale, softcap_log2, alibi_slope_log2, kc_base, 0, 0,
                          MASKED, HAS_LEFT, HAS_RIGHT, True, HAS_SOFTCAP, HAS_ALIBI, False)
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        if MASKED:
            # A row may still have seen nothing but -inf: subtract 0, not -inf (which would give NaN).
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s2 - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        b_v = tl.load(vc_base + off_v[:, None] + o_d[None, :], mask=m_kv, other=0.0)
        acc = dot(p.to(b_v.dtype), b_v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _decode_attn_kernel(
    p_q, p_kc, p_vc, p_o, p_lse, p_seqlens, p_leftpad, p_batch_idx, p_block_table, p_alibi,
    stride_q_b, stride_q_s, stride_q_h,
    stride_kc_b, stride_kc_s, stride_kc_h,
    stride_vc_b, stride_vc_s, stride_vc_h,
    stride_o_split, stride_o_b, stride_o_s, stride_o_h,
    stride_lse_split, stride_lse_b, stride_lse_h,
    stride_bt_b, stride_alibi_b,
    nheads_k, group, seqlen_q, seqlen_new, head_dim, log2_page, num_splits,
    qk_scale, softcap_scale, softcap_log2, window_left, window_right,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_LEFTPAD: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, PAGED: tl.constexpr, PAGE_ALIGNED: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """q: [batch, seqlen_q, nheads_q, D]; caches: [entries or pages, rows, nheads_k, D].
    Grid: (batch * nheads_k * row tiles, num_splits). SPLIT: write fp32 partials O_s [split, batch,
    seqlen_q, nheads_q, D] and lse_s (-inf when empty) for the combine kernel; else the final out and
    lse (+inf for a row that sees no key, flash-attn's convention)."""
    n_row_tiles = tl.cdiv(group * seqlen_q, BLOCK_M)
    i_bhm = tl.program_id(0)
    i_split = tl.program_id(1)
    i_b = (i_bhm // (nheads_k * n_row_tiles)).to(tl.int64)
    i_hk = (i_bhm // n_row_tiles) % nheads_k
    i_m = i_bhm % n_row_tiles

    # Rows of this tile: query token i_q, head i_h = i_hk * group + g.
    o_r = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                           # [BLOCK_M]
    m_r = o_r < group * seqlen_q
    i_q = o_r // group
    i_h = i_hk * group + o_r % group
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < head_dim
    m_q = m_r[:, None] & m_d[None, :]
    q = tl.load(p_q + i_b * stride_q_b + i_q[:, None] * stride_q_s + i_h[:, None] * stride_q_h + o_d[None, :],
                mask=m_q, other=0.0)                                     # [BLOCK_M, BLOCK_D]

    leftpad = 0
    if HAS_LEFTPAD:
        leftpad = tl.load(p_leftpad + i_b)
    seqlen_k = tl.load(p_seqlens + i_b) + seqlen_new - leftpad           # visible keys of sequence b
    if PAGED:
        p_bt = p_block_table + i_b * stride_bt_b
        kc_base = p_kc + i_hk * stride_kc_h
        vc_base = p_vc + i_hk * stride_vc_h
    else:
        p_bt = p_block_table
        entry = i_b
        if HAS_BATCH_IDX:
            entry = tl.load(p_batch_idx + i_b).to(tl.int64)
        kc_base = p_kc + entry * stride_kc_b + i_hk * stride_kc_h
        vc_base = p_vc + entry * stride_vc_b + i_hk * stride_vc_h
    alibi_slope_log2 = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if HAS_ALIBI:
        slope = tl.load(p_alibi + i_b * stride_alibi_b + i_h, mask=m_r, other=0.0)
        alibi_slope_log2 = slope[:, None] * LOG2E                        # [BLOCK_M, 1] per-row head slope

    # Visible key blocks of the tile's queries [i_q0, ...] (key_block_phases with m0 = the first query:
    # its last row m0 + BLOCK_M - 1 >= the tile's last query, a safe superset), then this split's share.
    lo, full_lo, full_hi, hi = key_block_phases((i_m * BLOCK_M) // group, seqlen_q, seqlen_k, window_left,
                                                window_right, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, True)
    blocks_per_split = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), num_splits)
    s_lo = tl.minimum(lo + i_split * blocks_per_split * BLOCK_N, hi)
    s_hi = tl.minimum(s_lo + blocks_per_split * BLOCK_N, hi)
    p1 = tl.minimum(tl.maximum(full_lo, s_lo), s_hi)
    p2 = tl.minimum(tl.maximum(full_hi, p1), s_hi)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    acc, l_i, m_i = _decode_key_blocks(
        acc, l_i, m_i, q, kc_base, vc_base, p_bt, s_lo, p1, leftpad, i_q, o_d, m_d, seqlen_q, seqlen_k,
        stride_kc_b, stride_kc_s, stride_vc_b, stride_vc_s, log2_page, window_left, window_right, qk_scale,
        softcap_scale, softcap_log2, alibi_slope_log2, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
        PAGED, PAGE_ALIGNED, BLOCK_N)
    acc, l_i, m_i = _decode_key_blocks(
        acc, l_i, m_i, q, kc_base, vc_base, p_bt, p1, p2, leftpad, i_q, o_d, m_d, seqlen_q, seqlen_k,
        stride_kc_b, stride_kc_s, stride_vc_b, stride_vc_s, log2_page, window_left, window_right, qk_scale,
        softcap_scale, softcap_log2, alibi_slope_log2, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
        PAGED, PAGE_ALIGNED, BLOCK_N)
    acc, l_i, m_i = _decode_key_blocks(
        acc, l_i, m_i, q, kc_base, vc_base, p_bt, p2, s_hi, leftpad, i_q, o_d, m_d, seqlen_q, seqlen_k,
        stride_kc_b, stride_kc_s, stride_vc_b, stride_vc_s, log2_page, window_left, window_right, qk_scale,
        softcap_scale, softcap_log2, alibi_slope_log2, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI,
        PAGED, PAGE_ALIGNED, BLOCK_N)

    empty = l_i == 0.0                                                    # rows that saw no key
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) / LOG2E
    if SPLIT:
        lse = tl.where(empty, float("-inf"), lse)                         # weight 0 in the combine
    else:
        lse = tl.where(empty, float("inf"), lse)
    p_o += i_split.to(tl.int64) * stride_o_split + i_b * stride_o_b
    tl.store(p_o + i_q[:, None] * stride_o_s + i_h[:, None] * stride_o_h + o_d[None, :],
             out.to(p_o.dtype.element_ty), mask=m_q)
    p_lse += i_split.to(tl.int64) * stride_lse_split + i_b * stride_lse_b
    tl.store(p_lse + i_h * stride_lse_h + i_q, lse, mask=m_r)


# ----------------------------------------------------------------------------------------------------
# Combine the splits
# ----------------------------------------------------------------------------------------------------


@triton.jit
def _decode_combine_kernel(
    p_o_part, p_lse_part, p_o, p_lse,
    stride_op_split, stride_op_b, stride_op_s, stride_op_h,
    stride_lp_split, stride_lp_b, stride_lp_h,
    stride_o_b, stride_o_s, stride_o_h, stride_lse_b, stride_lse_h,
    nheads_q, seqlen_q, head_dim, num_splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (batch, query token, head): lse = log sum_s exp(lse_s), O = sum_s exp(lse_s - lse) O_s.
    Rows where every split is empty get O = 0, lse = +inf."""
    i_row = tl.program_id(0)
    i_b = (i_row // (seqlen_q * nheads_q)).to(tl.int64)
    i_q = (i_row // nheads_q) % seqlen_q
    i_h = i_row % nheads_q
    p_lse_row = p_lse_part + i_b * stride_lp_b + i_h * stride_lp_h + i_q
    o_s = tl.arange(0, BLOCK_S)                                           # [BLOCK_S]
    lse_s = tl.load(p_lse_row + o_s * stride_lp_split, mask=o_s < num_splits, other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)                         # every split empty: no NaN
    total = tl.sum(tl.exp2((lse_s - m_safe) * LOG2E), 0)                  # exp(-inf) = 0 for empty splits
    lse = m_safe + tl.log2(tl.where(total == 0.0, 1.0, total)) / LOG2E
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < head_dim
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    p_part = p_o_part + i_b * stride_op_b + i_q * stride_op_s + i_h * stride_op_h
    for _ in range(0, num_splits):                                        # pointers advance: 64-bit offsets
        lse_i = tl.load(p_lse_row)
        if lse_i > float("-inf"):                                         # an empty split: nothing to read
            b_o = tl.load(p_part + o_d, mask=m_d, other=0.0)              # [BLOCK_D]
            acc += tl.exp2((lse_i - lse) * LOG2E) * b_o
        p_lse_row += stride_lp_split
        p_part += stride_op_split
    lse = tl.where(total == 0.0, float("inf"), lse)
    tl.store(p_o + i_b * stride_o_b + i_q * stride_o_s + i_h * stride_o_h + o_d, acc.to(p_o.dtype.element_ty),
             mask=m_d)
    tl.store(p_lse + i_b * stride_lse_b + i_h * stride_lse_h + i_q, lse)


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------

MAX_SPLITS = 128      # flash-attn's cap: past it the combine reads more than the splits save
PROGRAMS_PER_SM = 2   # resident decode programs per SM that the split count aims for (num_splits_heuristic)


def num_splits_heuristic(device: torch.device, batch: int, nheads_k: int, row_tiles: int,
                         max_seqlen_k: int, block_n: int) -> int:
    """Enough programs to fill PROGRAMS_PER_SM waves' worth of slots. With ``ctas = batch * nheads_k *
    row_tiles`` programs per split, ``n`` splits fill ``ctas * n / slots`` waves at an efficiency of
    waves / ceil(waves); pick the smallest n within 85% of the best efficiency, at most one key block per
    split and MAX_SPLITS. A grid that already fills 80% of the slots gets 1 split.

    flash-attn sizes the splits for one program per SM; this kernel needs two resident per SM to keep
    enough K/V bytes in flight: measured on an H200 (32q/8kv heads, hd 128, bf16), one program per SM
    streamed a long cache at 52-59% of copy bandwidth (batch 1-16) while the grids of batch >= 64, 2-4
    programs per SM, reached 87-91%."""
    sms = sm_count(device) if device.type == "cuda" else 8   # the interpreter: any small number exercises the split path
    slots = PROGRAMS_PER_SM * sms
    ctas = batch * nheads_k * row_tiles
    n_blocks = cdiv(max(max_seqlen_k, 1), block_n)
    if ctas >= 0.8 * slots or n_blocks <= 1:
        return 1
    max_splits = min(MAX_SPLITS, n_blocks, slots)
    eff = []
    for n in range(1, max_splits + 1):
        waves = ctas * n / slots
        eff.append(waves / math.ceil(waves))
    best = max(eff)
    return next(n for n, e in enumerate(eff, start=1) if e >= 0.85 * best)


def decode_config(head_dim_block: int, rows: int, page_size: int = 0, leftpad: bool = False) -> dict:
    """Tiles: BLOCK_M covers the whole GQA group x seqlen_q when it fits (one K/V read per kv head), from
    16 (tl.dot's smallest M) to 64 rows. BLOCK_N = 64 keys per block, 8 warps, 2 stages: a decode program
    is bound by the K/V stream; with 4 warps or 3 stages the [64, 128] tiles spill (ptxas, sm_90), with
    8 warps and 2 stages nothing spills. D = 256 halves BLOCK_N to stay in registers. The interpreter gets
    BLOCK_N = 32: several blocks even for short test caches, so every masking phase runs.

    Paged caches: a block that lies in one page (page_size >= BLOCK_N, no left padding) is addressed with
    one page lookup (PAGE_ALIGNED); smaller pages take a lookup per key."""
    block_m = min(64, next_power_of_2(rows, 16))
    if INTERPRET:
        cfg = dict(BLOCK_M=block_m, BLOCK_N=32, num_warps=4, num_stages=1)
    else:
        cfg = dict(BLOCK_M=block_m, BLOCK_N=64 if head_dim_block <= 128 else 32, num_warps=8, num_stages=2)
    cfg["PAGE_ALIGNED"] = page_size >= cfg["BLOCK_N"] and not leftpad
    return cfg


def kv_append(k, v, k_cache, v_cache, cache_seqlens, *, cache_batch_idx=None, block_table=None) -> None:
    """Write k, v (batch, seqlen_new, nheads_k, D) into the caches at rows cache_seqlens[b] + i (in place).
    No checks here: flash_attn_with_kvcache validates everything before calling."""
    batch, seqlen_new, nheads_k, head_dim = k.shape
    if batch == 0 or seqlen_new == 0 or nheads_k == 0:
        return
    block_d = next_power_of_2(head_dim)
    # [BLOCK_H, BLOCK_D] tile of <= 2048 elements (16 per thread with 4 warps): one program per token
    # covers a whole Llama kv row (8 heads x 128), more heads take several programs.
    block_h = min(next_power_of_2(nheads_k), max(1, 2048 // block_d))
    paged = block_table is not None
    log2_page = int(k_cache.shape[1]).bit_length() - 1 if paged else 0
    grid = (seqlen_new, batch, cdiv(nheads_k, block_h))
    _kv_append_kernel[grid](
        k, v, k_cache, v_cache, cache_seqlens,
        cache_batch_idx if cache_batch_idx is not None else cache_seqlens,
        block_table if paged else cache_seqlens,
        *k.stride()[:3], *v.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
        block_table.stride(0) if paged else 0, nheads_k, head_dim, log2_page,
        HAS_BATCH_IDX=cache_batch_idx is not None, PAGED=paged, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=4)


def decode_attention(q, k_cache, v_cache, cache_seqlens, *, seqlen_new: int, softmax_scale: float,
                     window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                     alibi_slopes=None, cache_leftpad=None, cache_batch_idx=None, block_table=None,
                     num_splits: int = 1):
    """Attention of q (batch, seqlen_q, nheads_q, D) over the caches, whose sequence b has
    seqlen_k = cache_seqlens[b] + seqlen_new - leftpad[b] keys (the new ones already appended).
    Returns (out like q, lse (batch, nheads_q, seqlen_q) fp32). num_splits >= 1 (the caller resolves 0)."""
    batch, seqlen_q, nheads_q, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    group = nheads_q // nheads_k
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, nheads_q, seqlen_q, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse.fill_(float("inf"))
    block_d = max(16, next_power_of_2(head_dim))
    paged = block_table is not None
    cfg = decode_config(block_d, group * seqlen_q, k_cache.shape[1] if paged else 0, cache_leftpad is not None)
    row_tiles = cdiv(group * seqlen_q, cfg["BLOCK_M"])
    split = num_splits > 1
    if split:
        o_buf = torch.empty(num_splits, *q.shape, dtype=torch.float32, device=q.device)
        lse_buf = torch.empty(num_splits, batch, nheads_q, seqlen_q, dtype=torch.float32, device=q.device)
        o_strides, lse_strides = o_buf.stride()[:4], lse_buf.stride()[:3]
    else:
        o_buf, lse_buf = out, lse
        o_strides, lse_strides = (0, *out.stride()[:3]), (0, *lse.stride()[:2])
    log2_page = int(k_cache.shape[1]).bit_length() - 1 if paged else 0
    has_softcap = softcap > 0.0
    dummy = cache_seqlens
    _decode_attn_kernel[(batch * nheads_k * row_tiles, num_splits)](
        q, k_cache, v_cache, o_buf, lse_buf, cache_seqlens,
        cache_leftpad if cache_leftpad is not None else dummy,
        cache_batch_idx if cache_batch_idx is not None else dummy,
        block_table if paged else dummy,
        alibi_slopes if alibi_slopes is not None else dummy,
        *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3], *o_strides, *lse_strides,
        block_table.stride(0) if paged else 0,
        alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
        nheads_k, group, seqlen_q, seqlen_new, head_dim, log2_page, num_splits,
        softmax_scale * LOG2E.value, (softmax_scale / softcap) if has_softcap else 0.0,
        softcap * LOG2E.value, window_left, window_right,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, HAS_SOFTCAP=has_softcap,
        HAS_ALIBI=alibi_slopes is not None, HAS_LEFTPAD=cache_leftpad is not None,
        HAS_BATCH_IDX=cache_batch_idx is not None, PAGED=paged, SPLIT=split, BLOCK_D=block_d, **cfg)
    if split:
        _decode_combine_kernel[(batch * seqlen_q * nheads_q,)](
            o_buf, lse_buf, out, lse, *o_buf.stride()[:4], *lse_buf.stride()[:3], *out.stride()[:3],
            *lse.stride()[:2], nheads_q, seqlen_q, head_dim, num_splits,
            BLOCK_S=next_power_of_2(num_splits), BLOCK_D=block_d, num_warps=4 if block_d >= 128 else 2)
    return out, lse
