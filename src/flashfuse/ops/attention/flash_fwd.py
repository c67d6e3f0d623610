"""FlashAttention-2 forward: tiled attention with an online softmax, O(S) extra memory.

For one query block Q_b [BLOCK_M, D] the kernel streams key/value blocks K_j, V_j [BLOCK_N, D] and keeps
three running values per row (all fp32, scores in the log2 domain, see _flash_common):

    s     = score_mod(Q_b K_j^T)                       [BLOCK_M, BLOCK_N]
    m_new = max(m, rowmax(s))                          running max
    p     = exp2(s - m_new)
    l     = l * exp2(m - m_new) + rowsum(p)            running normalizer
    acc   = acc * exp2(m - m_new) + (p * keep / (1 - dropout_p)) V_j
    ...
    O_b   = acc / l,    lse = (m + log2 l) * ln 2      natural-log LSE, saved for the backward

Rescaling acc whenever the max grows is the "online softmax": one pass over K and V, and S x S never
exists anywhere. Rows with no visible key keep m = -inf and l = 0: they store O = 0 and lse = +inf, so
the backward's exp(s - lse) is 0 for them.

Head dims that are not a power of two (diffusion models: 40, 72, 80, 160) are split into a power-of-two
main part and a small tail, S = Q_a K_a^T + Q_t K_t^T and O = [P V_a, P V_t], instead of padding to the
next power of two (72 = 64 + 16: 80 columns of tensor-core work, not 128). Their row strides (72 or 40
elements) are not multiples of 16, so the launcher asserts the 16-byte alignment it checked (VEC) for
vectorized, pipelined loads. See forward_config for the tile table and benchmarks/tune_attention_small.py.

Long sequences without the rarer features take a second kernel (_flash_fwd_fast_kernel, FAST_FORWARD) at
head dim 128: tensor-descriptor (TMA) tiles; see its comment block and benchmarks/tune_flash_fwd.py. On
Hopper with triton 3.6, head dims 64 and 128 go to a warp-specialized Gluon kernel instead where its table
says (flash_fwd_hopper.py: a producer warp and two consumer warpgroups, asynchronous wgmma, the softmax
beside the P V product).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..._env import INTERPRET
from .._triton import cdiv, dot, ensure_tma_allocator, next_power_of_2, sm_count
from ._flash_common import (LOG2E, empty_packed, kernel_options, key_block_phases, score_mod, score_scales,
                            seq_bounds)
from .dropout import dropout_keep
from . import flash_fwd_hopper


@triton.jit
def _multiple(x, VEC: tl.constexpr):
    """x, known by the launcher to be a multiple of VEC, in a form the compiler can see is one
    (tl.multiple_of has no effect on kernel arguments)."""
    return (x // VEC) * VEC


@triton.jit
def _fwd_key_blocks(acc, acc2, l_i, m_i, q, q2, k_base, v_base, start, end, o_m, o_d, m_d, o_d2, m_d2, i_bh,
                    seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale,
                    softcap_scale, softcap_log2, alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n,
                    p_rng, dropout_p, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
                    HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D2: tl.constexpr):
    """One phase of the key loop over key blocks [start, end); MASKED phases check every element.
    With BLOCK_D2 > 0 the head dim is split: columns o_d in q / acc, the tail o_d2 in q2 / acc2."""
    for start_n in range(start, end, BLOCK_N):
        o_n = start_n + tl.arange(0, BLOCK_N)
        if MASKED:
            m_kv = (o_n[:, None] < seqlen_k) & m_d[None, :]                          # [BLOCK_N, BLOCK_D]
            m_kv2 = (o_n[:, None] < seqlen_k) & m_d2[None, :]                        # [BLOCK_N, BLOCK_D2]
        else:
            m_kv = m_d[None, :]
            m_kv2 = m_d2[None, :]
        b_k = tl.load(k_base + o_n[:, None] * stride_k_s + o_d[None, :], mask=m_kv, other=0.0)
        qk = dot(q, tl.trans(b_k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32))  # [BLOCK_M, BLOCK_N]
        if BLOCK_D2 > 0:
            b_k2 = tl.load(k_base + o_n[:, None] * stride_k_s + o_d2[None, :], mask=m_kv2, other=0.0)
            qk = dot(q2, tl.trans(b_k2), qk)
        s2, _ = score_mod(qk, o_m[:, None], o_n[None, :], seqlen_q, seqlen_k, window_left, window_right,
                          qk_scale, softcap_scale, softcap_log2, alibi_slope_log2, p_bias, stride_bias_m,
                          stride_bias_n, MASKED, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP,
                          HAS_ALIBI, HAS_BIAS)
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        if MASKED or HAS_BIAS:
            # A row may still have seen nothing but -inf: subtract 0, not -inf (which would give NaN).
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s2 - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            p = tl.where(dropout_keep(p_rng, i_bh, o_m[:, None], o_n[None, :], dropout_p), p, 0.0)
        b_v = tl.load(v_base + o_n[:, None] * stride_v_s + o_d[None, :], mask=m_kv, other=0.0)
        acc = dot(p.to(b_v.dtype), b_v, acc)
        if BLOCK_D2 > 0:
            b_v2 = tl.load(v_base + o_n[:, None] * stride_v_s + o_d2[None, :], mask=m_kv2, other=0.0)
            acc2 = dot(p.to(b_v2.dtype), b_v2, acc2 * alpha[:, None])
        m_i = m_new
    return acc, acc2, l_i, m_i


@triton.jit
def _flash_fwd_kernel(
    p_q, p_k, p_v, p_o, p_lse, p_cu_seqlens_q, p_cu_seqlens_k, p_alibi, p_bias, p_rng,
    stride_q_b, stride_q_s, stride_q_h,
    stride_k_b, stride_k_s, stride_k_h,
    stride_v_b, stride_v_s, stride_v_h,
    stride_o_b, stride_o_s, stride_o_h,
    stride_lse_b, stride_lse_h, stride_alibi_b,
    stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
    nheads_q, group, seqlen_q, seqlen_k, head_dim,
    qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    BLOCK_D2: tl.constexpr, VEC: tl.constexpr,
):
    # Head dims: columns [0, BLOCK_D) in q / acc (masked to head_dim unless EVEN_D), and when BLOCK_D2 > 0
    # a tail [BLOCK_D, BLOCK_D + BLOCK_D2) in q2 / acc2, masked to head_dim (72 = 64 + 16 instead of 128).
    # VEC: the launcher checked that head_dim and every q/k/v/o stride are multiples of VEC elements
    # (<= 16 bytes); rebuilt as (x // VEC) * VEC they say so to the compiler, which then moves 16-byte
    # vectors (cp.async) instead of single elements (head dims 40, 72 have strides that Triton's
    # divisibility-by-16 argument specialization does not cover).
    stride_q_b, stride_q_s = _multiple(stride_q_b, VEC), _multiple(stride_q_s, VEC)
    stride_k_b, stride_k_s = _multiple(stride_k_b, VEC), _multiple(stride_k_s, VEC)
    stride_v_b, stride_v_s = _multiple(stride_v_b, VEC), _multiple(stride_v_s, VEC)
    stride_o_b, stride_o_s = _multiple(stride_o_b, VEC), _multiple(stride_o_s, VEC)
    stride_q_h, stride_k_h = _multiple(stride_q_h, VEC), _multiple(stride_k_h, VEC)
    stride_v_h, stride_o_h = _multiple(stride_v_h, VEC), _multiple(stride_o_h, VEC)
    head_dim = _multiple(head_dim, VEC)
    # Heaviest query blocks first (under a causal mask the last rows see the most keys), so the tail
    # of the grid is made of short programs.
    i_m = tl.num_programs(0) - 1 - tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // nheads_q
    i_h = i_bh % nheads_q
    i_hk = i_h // group                                        # GQA: the kv head of this query head
    q_start, seqlen_q = seq_bounds(p_cu_seqlens_q, i_b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = seq_bounds(p_cu_seqlens_k, i_b, seqlen_k, IS_VARLEN)
    m0 = i_m * BLOCK_M
    if m0 >= seqlen_q:
        return

    i_b64 = i_b.to(tl.int64)
    q_base = p_q + i_b64 * stride_q_b + q_start * stride_q_s + i_h * stride_q_h
    k_base = p_k + i_b64 * stride_k_b + k_start * stride_k_s + i_hk * stride_k_h
    v_base = p_v + i_b64 * stride_v_b + k_start * stride_v_s + i_hk * stride_v_h
    o_m = m0 + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    if EVEN_D:
        m_d = o_d < BLOCK_D                                    # all true; folded away by the compiler
    else:
        m_d = o_d < head_dim
    m_q = (o_m[:, None] < seqlen_q) & m_d[None, :]
    q = tl.load(q_base + o_m[:, None] * stride_q_s + o_d[None, :], mask=m_q, other=0.0)  # [BLOCK_M, BLOCK_D]
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # Without a tail the *2 names alias the main part; the key loop never touches them then.
    o_d2, m_d2, m_q2, q2, acc2 = o_d, m_d, m_q, q, acc
    if BLOCK_D2 > 0:
        o_d2 = BLOCK_D + tl.arange(0, BLOCK_D2)
        m_d2 = o_d2 < head_dim
        m_q2 = (o_m[:, None] < seqlen_q) & m_d2[None, :]
        q2 = tl.load(q_base + o_m[:, None] * stride_q_s + o_d2[None, :], mask=m_q2, other=0.0)
        acc2 = tl.zeros([BLOCK_M, BLOCK_D2], dtype=tl.float32)                  # [BLOCK_M, BLOCK_D2]

    alibi_slope_log2 = 0.0
    if HAS_ALIBI:
        alibi_slope_log2 = tl.load(p_alibi + i_b * stride_alibi_b + i_h) * LOG2E
    if HAS_BIAS:
        p_bias += i_b64 * stride_bias_b + i_h * stride_bias_h

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_block_phases(m0, seqlen_q, seqlen_k, window_left, window_right,
                                                BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT)
    # Masked boundary blocks on the left (sliding window), unmasked interior, masked blocks on the right
    # (causal diagonal, window, ragged seqlen_k).
    acc, acc2, l_i, m_i = _fwd_key_blocks(
        acc, acc2, l_i, m_i, q, q2, k_base, v_base, lo, full_lo, o_m, o_d, m_d, o_d2, m_d2, i_bh,
        seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale, softcap_scale,
        softcap_log2, alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n, p_rng, dropout_p, True, HAS_LEFT,
        HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, BLOCK_N, BLOCK_D2)
    acc, acc2, l_i, m_i = _fwd_key_blocks(
        acc, acc2, l_i, m_i, q, q2, k_base, v_base, full_lo, full_hi, o_m, o_d, m_d, o_d2, m_d2, i_bh,
        seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale, softcap_scale,
        softcap_log2, alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n, p_rng, dropout_p, False, HAS_LEFT,
        HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, BLOCK_N, BLOCK_D2)
    acc, acc2, l_i, m_i = _fwd_key_blocks(
        acc, acc2, l_i, m_i, q, q2, k_base, v_base, full_hi, hi, o_m, o_d, m_d, o_d2, m_d2, i_bh,
        seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale, softcap_scale,
        softcap_log2, alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n, p_rng, dropout_p, True, HAS_LEFT,
        HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, BLOCK_N, BLOCK_D2)

    empty = l_i == 0.0                                         # rows that saw no key
    l_safe = tl.where(empty, 1.0, l_i)
    inv_l = 1.0 / l_safe
    if HAS_DROPOUT:
        inv_l = inv_l / (1.0 - dropout_p)
    out = acc * inv_l[:, None]
    o_base = p_o + i_b64 * stride_o_b + q_start * stride_o_s + i_h * stride_o_h
    tl.store(o_base + o_m[:, None] * stride_o_s + o_d[None, :], out.to(p_o.dtype.element_ty), mask=m_q)
    if BLOCK_D2 > 0:
        out2 = acc2 * inv_l[:, None]
        tl.store(o_base + o_m[:, None] * stride_o_s + o_d2[None, :], out2.to(p_o.dtype.element_ty), mask=m_q2)
    lse = tl.where(empty, float("inf"), (m_i + tl.log2(l_safe)) / LOG2E)
    p_lse += i_b64 * stride_lse_b + i_h * stride_lse_h + q_start
    tl.store(p_lse + o_m, lse, mask=o_m < seqlen_q)


# ----------------------------------------------------------------------------------------------------
# Fast path for long sequences (Hopper): tensor-descriptor (TMA) tiles
# ----------------------------------------------------------------------------------------------------
# The same online softmax as above, for the common case only: no dropout, ALiBi, softcap, bias, left
# window or varlen, head dim a power of two. What changes is how tiles move:
# - Q, K, V tiles are read and O written through tensor descriptors (TMA on sm_90): one instruction per
#   tile instead of per-thread address arithmetic, and rows past seqlen read as zeros / are not written,
#   so no load or store carries a mask; only the score mask of the last (diagonal, ragged) key blocks.
# - SPLIT_M: the row block is two independent halves [BLOCK_M / 2, D] sharing each K / V tile: one half's
#   softmax can overlap the other half's tensor-core work (FlashAttention-3's ping-pong, here left to
#   the scheduler). Measured no faster (hd64: 394-410 vs 389-414 TFLOP/s of the pointer kernel); a knob.
# Warp specialization (tl.range(..., warp_specialize=True), triton 3.6) was tried on this loop and dropped:
# on the H200 it returned NaN at hd 64 and 20% error under a causal mask at hd 128 (tune_flash_fwd.py,
# session 5); NOTES.md has the numbers.


@triton.jit
def _fwd_fast_tile(acc, l_i, m_i, q, b_k, b_v, o_m, start_n, seqlen_q, seqlen_k, window_right, qk_scale,
                   p_any, MASKED: tl.constexpr, HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """One online-softmax step of a row block q [ROWS, D] against one key tile b_k, b_v [BLOCK_N, D]."""
    qk = dot(q, tl.trans(b_k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32))     # [ROWS, BLOCK_N]
    o_n = start_n + tl.arange(0, BLOCK_N)
    s2, _ = score_mod(qk, o_m[:, None], o_n[None, :], seqlen_q, seqlen_k, 0, window_right, qk_scale, 0.0,
                      0.0, 0.0, p_any, 0, 0, MASKED, False, HAS_RIGHT, BOTTOM_RIGHT, False, False, False)
    m_new = tl.maximum(m_i, tl.max(s2, 1))
    if MASKED:
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows with no visible key yet (see above)
    p = tl.exp2(s2 - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    acc = dot(p.to(b_v.dtype), b_v, acc * alpha[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)                           # after the dot: p's registers free sooner
    return acc, l_i, m_new


@triton.jit
def _load_rows(src, row0, seqlen, stride_s, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """Rows [row0, row0 + BLOCK) of a [seqlen, BLOCK_D] matrix (zeros past seqlen): src is a tensor
    descriptor (USE_TMA) or the matrix's base pointer."""
    if USE_TMA:
        return src.load([row0, 0])
    else:
        o_r = row0 + tl.arange(0, BLOCK)
        return tl.load(src + o_r[:, None] * stride_s + tl.arange(0, BLOCK_D)[None, :],
                       mask=o_r[:, None] < seqlen, other=0.0)


@triton.jit
def _fwd_fast_key_blocks(acc0, l0, m0, acc1, l1, m1, q0, q1, k_src, v_src, start, end, o_m0, o_m1,
                         seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_right, qk_scale, p_any,
                         MASKED: tl.constexpr, HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT_M: tl.constexpr,
                         USE_TMA: tl.constexpr):
    """Key blocks [start, end) for both row halves (the second one only when SPLIT_M)."""
    for start_n in range(start, end, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        b_k = _load_rows(k_src, start_n, seqlen_k, stride_k_s, BLOCK_N, BLOCK_D, USE_TMA)   # [BLOCK_N, BLOCK_D]
        b_v = _load_rows(v_src, start_n, seqlen_k, stride_v_s, BLOCK_N, BLOCK_D, USE_TMA)
        acc0, l0, m0 = _fwd_fast_tile(acc0, l0, m0, q0, b_k, b_v, o_m0, start_n, seqlen_q, seqlen_k,
                                      window_right, qk_scale, p_any, MASKED, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_N)
        if SPLIT_M:
            acc1, l1, m1 = _fwd_fast_tile(acc1, l1, m1, q1, b_k, b_v, o_m1, start_n, seqlen_q, seqlen_k,
                                          window_right, qk_scale, p_any, MASKED, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_N)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _fwd_fast_store(p_o, p_lse, o_dst, acc, l_i, m_i, o_m, row0, seqlen_q, stride_o_s,
                    BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """O = acc / l and the natural-log LSE of one row half; rows with no visible key: O = 0, lse = +inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = (acc * (1.0 / l_safe)[:, None]).to(p_o.dtype.element_ty)
    if USE_TMA:
        o_dst.store([row0, 0], out)                                      # rows past seqlen_q are dropped
    else:
        tl.store(o_dst + o_m[:, None] * stride_o_s + tl.arange(0, BLOCK_D)[None, :], out,
                 mask=o_m[:, None] < seqlen_q)
    tl.store(p_lse + o_m, tl.where(empty, float("inf"), (m_i + tl.log2(l_safe)) / LOG2E), mask=o_m < seqlen_q)


@triton.jit
def _flash_fwd_fast_kernel(
    p_q, p_k, p_v, p_o, p_lse,
    stride_q_b, stride_q_s, stride_q_h,
    stride_k_b, stride_k_s, stride_k_h,
    stride_v_b, stride_v_s, stride_v_h,
    stride_o_b, stride_o_s, stride_o_h,
    stride_lse_b, stride_lse_h,
    nheads_q, group, seqlen_q, seqlen_k, qk_scale, window_right,
    HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT_M: tl.constexpr, USE_TMA: tl.constexpr,
):
    # q, o: [batch, seqlen_q, nheads_q, BLOCK_D]; k, v: [batch, seqlen_k, nheads_k, BLOCK_D]; lse: [batch,
    # nheads_q, seqlen_q]. Grid (cdiv(seqlen_q, BLOCK_M), batch * nheads_q), heaviest row blocks first.
    # The launcher checked what TMA needs: 16-byte aligned base pointers and strides but the last (1).
    i_m = tl.num_programs(0) - 1 - tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = (i_bh // nheads_q).to(tl.int64)
    i_h = (i_bh % nheads_q).to(tl.int64)
    i_hk = i_h // group
    m0 = i_m * BLOCK_M
    HALF: tl.constexpr = BLOCK_M // 2 if SPLIT_M else BLOCK_M
    q_base = p_q + i_b * stride_q_b + i_h * stride_q_h
    k_base = p_k + i_b * stride_k_b + i_hk * stride_k_h
    v_base = p_v + i_b * stride_v_b + i_hk * stride_v_h
    o_base = p_o + i_b * stride_o_b + i_h * stride_o_h
    if USE_TMA:
        # One [seqlen, BLOCK_D] matrix per (batch, head): TMA's bounds check zero-fills rows past seqlen.
        q_src = tl.make_tensor_descriptor(q_base, [seqlen_q, BLOCK_D], [stride_q_s, 1], [HALF, BLOCK_D])
        k_src = tl.make_tensor_descriptor(k_base, [seqlen_k, BLOCK_D], [stride_k_s, 1], [BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_base, [seqlen_k, BLOCK_D], [stride_v_s, 1], [BLOCK_N, BLOCK_D])
        o_dst = tl.make_tensor_descriptor(o_base, [seqlen_q, BLOCK_D], [stride_o_s, 1], [HALF, BLOCK_D])
    else:
        q_src, k_src, v_src, o_dst = q_base, k_base, v_base, o_base
    p_lse += i_b * stride_lse_b + i_h * stride_lse_h

    o_m0 = m0 + tl.arange(0, HALF)
    q0 = _load_rows(q_src, m0, seqlen_q, stride_q_s, HALF, BLOCK_D, USE_TMA)        # [HALF, BLOCK_D]
    acc0 = tl.zeros([HALF, BLOCK_D], dtype=tl.float32)
    l0 = tl.zeros([HALF], dtype=tl.float32)
    mx0 = tl.full([HALF], float("-inf"), dtype=tl.float32)
    # Without SPLIT_M the *1 names alias the first half; the key loop never touches them then.
    o_m1, q1, acc1, l1, mx1 = o_m0, q0, acc0, l0, mx0
    if SPLIT_M:
        o_m1 = m0 + HALF + tl.arange(0, HALF)
        q1 = _load_rows(q_src, m0 + HALF, seqlen_q, stride_q_s, HALF, BLOCK_D, USE_TMA)
        acc1 = tl.zeros([HALF, BLOCK_D], dtype=tl.float32)
        l1 = tl.zeros([HALF], dtype=tl.float32)
        mx1 = tl.full([HALF], float("-inf"), dtype=tl.float32)

    # No left window here, so lo = full_lo = 0: unmasked [0, full_hi), then the masked diagonal / ragged end.
    _, _, full_hi, hi = key_block_phases(m0, seqlen_q, seqlen_k, 0, window_right, BLOCK_M, BLOCK_N,
                                         False, HAS_RIGHT, BOTTOM_RIGHT)
    acc0, l0, mx0, acc1, l1, mx1 = _fwd_fast_key_blocks(
        acc0, l0, mx0, acc1, l1, mx1, q0, q1, k_src, v_src, 0, full_hi, o_m0, o_m1, seqlen_q, seqlen_k,
        stride_k_s, stride_v_s, window_right, qk_scale, p_lse, False, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_N,
        BLOCK_D, SPLIT_M, USE_TMA)
    acc0, l0, mx0, acc1, l1, mx1 = _fwd_fast_key_blocks(
        acc0, l0, mx0, acc1, l1, mx1, q0, q1, k_src, v_src, full_hi, hi, o_m0, o_m1, seqlen_q, seqlen_k,
        stride_k_s, stride_v_s, window_right, qk_scale, p_lse, True, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_N,
        BLOCK_D, SPLIT_M, USE_TMA)

    _fwd_fast_store(p_o, p_lse, o_dst, acc0, l0, mx0, o_m0, m0, seqlen_q, stride_o_s, BLOCK_D, USE_TMA)
    if SPLIT_M:
        _fwd_fast_store(p_o, p_lse, o_dst, acc1, l1, mx1, o_m1, m0 + HALF, seqlen_q, stride_o_s, BLOCK_D,
                        USE_TMA)


# ----------------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------------

# Widest vector one thread moves per load or store: 16 bytes (cp.async.cg / ld.global.v4).
VEC_BYTES = 16
# Split head dims into a power-of-two main part and tail (flash_fwd only; the backward pads). Module constant
# so benchmarks/tune_attention_small.py can measure padding against splitting.
SPLIT_HEAD_DIM = True


def forward_config(width: int, dtype: torch.dtype, windowed: bool, has_bias: bool, seqlen_q: int = 4096,
                   seqlen_k: int = 4096, programs_per_row_block: int = 1 << 20, num_sms: int = 132) -> dict:
    """Tile sizes, warps and pipeline depth (Hopper; see benchmarks/NOTES.md for how they were picked).

    width: the head dim the kernel computes on (BLOCK_D + BLOCK_D2). programs_per_row_block: batch *
    nheads_q, the grid's second axis. The interpreter runs numpy per tile, so it gets small 32 x 32
    tiles: fast, and several blocks per test sequence so every masking phase is exercised.
    """
    if INTERPRET:
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
    if dtype == torch.float32:           # tf32x3 dots hold three operand copies: smaller tiles
        if width <= 64:
            return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=2)
    programs_128 = cdiv(seqlen_q, 128) * programs_per_row_block
    if seqlen_k <= 512 or programs_128 < 2 * num_sms:
        # Short key loops (DiT's 256 tokens, cross-attention to 77 text tokens) and small grids (SD's
        # 1024-token level: 16 heads x 8 blocks of 128 rows = 128 programs on 132 SMs). One warpgroup on
        # 64 rows (wgmma's M) doubles the programs, and 2 stages keep a program small enough in shared
        # memory (64 x 128 tiles at width 80: 90 KB) that two share an SM: one's prologue (Q, the first
        # K/V tiles) and epilogue (the O store) overlap the other's tensor-core work. cuDNN picks 64 x 128
        # here too.
        # Grids under a quarter wave (SD's 64-token level: 16 heads) take 32- or 16-row tiles (tensor-core
        # mma.sync instead of wgmma) and narrower key tiles to stay spill-free (ptxas, width 160: 32 x 64
        # spills 120 bytes, 32 x 32 none). The threshold was half a wave until session 9: SD's 256-token level
        # (64 programs of 64 rows, hd 160) then took 32 x 32 tiles at 14.4 us where 64 x 64 takes 7.9 (H200,
        # bf16, benchmarks/tune_attention_small.py; cuDNN 10.4).
        block_m = 64
        while block_m > 16 and cdiv(seqlen_q, block_m) * programs_per_row_block < num_sms // 4:
            block_m //= 2
        block_n = (128 if width <= 128 else 64) if block_m == 64 else (64 if width <= 128 else 32)
        if block_m == 64 and width <= 128 and seqlen_k <= 512:
            # 129..512 keys (DiT's 256): 64-key tiles give the 2-stage pipeline 4 iterations instead of 2.
            # H200, DiT-XL/2 (B32, 16 heads, hd 72, S = 256, fp16): 57 us vs 65 us with 128-key tiles.
            # Cross-attention to 77 text tokens too (session 9, fp16): SD's 4096-query level (hd 40) 13.7 vs
            # 17.9 us with one 128-key tile, the 1024-query level (hd 80) 5.9 vs 6.3.
            block_n = 64
        return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=2)
    if width <= 64:                      # H200 S=8192: 414 TFLOP/s (128x64 with 4 warps: 395)
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    if width <= 128:                     # H200 S=8192: 128x128 511 / 448 causal, 128x64 487 / 469 causal
        # A bias tile pipelined beside K and V: 128 x 128 tiles would need 288 KB of shared memory.
        return dict(BLOCK_M=128, BLOCK_N=64 if windowed or has_bias else 128, num_warps=8, num_stages=3)
    if width <= 160:                     # 128 + 32 split (SD's head dim 160): acc 80 + scores 32 registers
        # ptxas: 236 registers, no spill; with a bias tile (and softcap) 112 bytes spill, 128 x 32 none.
        return dict(BLOCK_M=128, BLOCK_N=32 if has_bias else 64, num_warps=8, num_stages=2)
    # D = 256: a [128, 256] fp32 accumulator spills; 64 x 32 tiles spill 336 bytes, 32 x 32 none.
    return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)


# The fast path (_flash_fwd_fast_kernel) for long sequences; False: the kernel above everywhere.
FAST_FORWARD = True
# Within it, flash_fwd_hopper's Gluon kernel where it measured faster (sm_90, triton 3.6); False: never.
GLUON_FORWARD = True
# Key loops at least this long take it, per causal flag. Measured (H200, bf16, 16384 tokens,
# benchmarks/tune_flash_fwd.py): hd128 at S = 4096 / 8192 508 / 532 TFLOP/s vs 472 / 490 (causal 428 / 484 vs
# 408 / 443; session 5). At S = 2048 (session 9, 3 stages) the fast kernel wins without a mask, 471.5 vs 449.5,
# and loses under a causal one, 353 vs 369 (with 2 stages it lost both: 381 and 291).
FAST_MIN_SEQLEN_K = {False: 2048, True: 4096}


def _fast(bm, bn, warps, stages, split=False, tma=True):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, SPLIT_M=split, USE_TMA=tma)


# (head dim, causal) -> config, Hopper, the measured best of benchmarks/tune_flash_fwd.py. Head dim 64 has
# no entry: the pointer kernel's 128 x 64 tiles measured best there (389-414 TFLOP/s; TMA 128 x 64 399-409,
# TMA 128 x 128 299-366, split halves 372-410). ptxas (sm_90, triton 3.6), hd128 128 x 128, 8 warps,
# 3 stages: 193-242 registers, no spill.
FAST_CONFIGS = {
    (128, False): _fast(128, 128, 8, 3),
    (128, True): _fast(128, 128, 8, 3),
}


def fast_forward_config(head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int,
                        programs_per_row_block: int, num_sms: int = 132):
    """The fast kernel's config, or None where the pointer kernel measured faster: head dims without a
    FAST_CONFIGS entry, key loops shorter than FAST_MIN_SEQLEN_K[causal], grids under two waves of 128-row blocks
    (forward_config's small-shape tiles). The interpreter gets 32 x 32 tiles split in two 16-row halves,
    so every piece of the kernel runs on the CPU tier."""
    if INTERPRET:
        return _fast(32, 32, 4, 1, split=True)
    key = (head_dim, causal)
    if key not in FAST_CONFIGS or seqlen_k < FAST_MIN_SEQLEN_K[causal]:
        return None
    if cdiv(seqlen_q, 128) * programs_per_row_block < 2 * num_sms:
        return None
    return dict(FAST_CONFIGS[key])


def tma_compatible(*tensors) -> bool:
    """What a tensor descriptor over each (batch, head)'s [seqlen, headdim] rows needs: 16-byte aligned
    base pointers and strides (bytes), the head dim contiguous, and a nonzero row stride."""
    for t in tensors:              # (loops, not any() over a generator: host time per call, session 27)
        strides, size = t.stride(), t.element_size()
        if t.data_ptr() % 16 or strides[-1] != 1 or strides[1] == 0:
            return False
        for stride in strides[:-1]:
            if stride * size % 16:
                return False
    return True


def _fast_forward_plan(q, k, v, out, head_dim, window_left, window_right, softcap, alibi_slopes, attn_bias,
                       dropout_p, is_varlen, nheads_q, batch=0, max_seqlen_q=0, max_seqlen_k=0, softmax_scale=1.0):
    """The fast kernel's config for this call, or None: the features it leaves out go to the kernel above. Varlen
    (batch sequences of at most max_seqlen_q / k), softcap and ALiBi only on the Gluon kernel, O stored from registers
    there for varlen; ALiBi with softmax_scale 0 not there either (its slope is divided by the scale); dropout only on
    the Gluon kernel."""
    if not FAST_FORWARD or attn_bias is not None:
        return None
    if alibi_slopes is not None and softmax_scale == 0.0:
        return None
    if is_varlen:         # the Gluon kernel's alone (flash_fwd_hopper_configs.varlen_config)
        if (GLUON_FORWARD and q.dtype in (torch.float16, torch.bfloat16) and flash_fwd_hopper.available(q.device)
                and tma_compatible(q, k, v, out) and flash_fwd_hopper.descriptor_compatible(q, k, v, out)):
            cfg = flash_fwd_hopper.varlen_config(head_dim, window_right >= 0, window_left >= 0, max_seqlen_q,
                                                 max_seqlen_k, batch * nheads_q, sm_count(q.device),
                                                 dropout=dropout_p > 0.0)
            return None if cfg is None else dict(cfg, GLUON=True)
        return None
    if INTERPRET:                         # the CPU tier also runs fp32 and small head dims through it
        if head_dim not in (16, 32, 64, 128):
            return None
    elif q.dtype not in (torch.float16, torch.bfloat16):
        return None                       # measured and ptxas-checked in 16 bits (FAST_CONFIGS)
    num_sms = 132 if INTERPRET else sm_count(q.device)
    programs = q.shape[0] * nheads_q
    tma_ok = tma_compatible(q, k, v, out)
    if (GLUON_FORWARD and tma_ok and flash_fwd_hopper.available(q.device)
            and flash_fwd_hopper.descriptor_compatible(q, k, v, out)):
        cfg = flash_fwd_hopper.hopper_forward_config(head_dim, window_right >= 0, q.shape[1], k.shape[1],
                                                     programs, num_sms, window_left >= 0, dropout=dropout_p > 0.0)
        if cfg is not None:
            return dict(cfg, GLUON=True)
    if window_left >= 0 or softcap > 0.0 or alibi_slopes is not None or dropout_p > 0.0:   # the Gluon kernel's alone
        return None
    cfg = fast_forward_config(head_dim, window_right >= 0, q.shape[1], k.shape[1], programs, num_sms)
    if cfg is not None and cfg["USE_TMA"] and not tma_ok:
        return None
    return cfg


def head_dim_block(head_dim: int) -> int:
    """Head dims are padded (masked) to a power of two >= 16, tl.dot's smallest K."""
    return max(16, next_power_of_2(head_dim))


def head_dim_split(head_dim: int, dtype: torch.dtype = torch.float16) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_D2): the head dim as a power-of-two main part plus a power-of-two tail (>= 16, tl.dot's
    smallest K) when the two are narrower than padding, else (padded, 0). 40 -> 32 + 16, 72 -> 64 + 16,
    80 -> 64 + 16, 96 -> 64 + 32, 160 -> 128 + 32: 1.25-1.6x fewer tensor-core FLOPs than padding to
    64 / 128 / 256. 59 -> (64, 0), 111 -> (128, 0), 224 -> (256, 0): a split would not be narrower.
    fp32 always pads: its tf32x3 dots hold three operand copies, and ptxas shows the two extra dots spill
    (32 x 32 tiles, head dim 96: 304 bytes split, 40 padded)."""
    padded = head_dim_block(head_dim)
    main = padded // 2
    if SPLIT_HEAD_DIM and main >= 16 and dtype != torch.float32:
        tail = max(16, next_power_of_2(head_dim - main))
        if main + tail < padded:
            return main, tail
    return padded, 0


def vector_width(head_dim: int, element_size: int, tensors) -> int:
    """The VEC the kernel asserts: the largest power of two (in elements, at most VEC_BYTES) dividing
    head_dim and every stride but the last of ``tensors``, so row starts are VEC-aligned (given 16-byte
    aligned base pointers, which Triton checks on its own). 1 (no assertion, the tuned code unchanged)
    when Triton's own specialization of integer arguments divisible by 16 already covers them all."""
    values = (head_dim, *(s for t in tensors for s in t.stride()[:-1]))
    if all(v % 16 == 0 for v in values):
        return 1
    return math.gcd(VEC_BYTES // element_size, *values)


def flash_attn_forward(q, k, v, *, softmax_scale: float, window_left: int = -1, window_right: int = -1,
                       bottom_right: bool = True, softcap: float = 0.0, alibi_slopes=None, attn_bias=None,
                       dropout_p: float = 0.0, rng_state=None, cu_seqlens_q=None, cu_seqlens_k=None,
                       max_seqlen_q: int = 0, max_seqlen_k: int = 0):
    """Launch the forward kernel on validated inputs. Returns (out, lse).

    q: (batch, seqlen_q, nheads_q, headdim), k/v: (batch, seqlen_k, nheads_k, headdim); or varlen
    q: (total_q, nheads_q, headdim), k/v: (total_k, nheads_k, headdim) with int32 cu_seqlens_q/k.
    out: like q, contiguous. lse: (batch, nheads_q, seqlen_q) or varlen (nheads_q, total_q), fp32.
    window_left/right = -1 means unbounded; causal is window_right = 0. attn_bias: broadcast view
    (batch, nheads_q, seqlen_q, seqlen_k), float. rng_state: int64 (seed, offset) when dropout_p > 0.
    Varlen rows past cu_seqlens_q[-1] (in no sequence) get out 0 and lse +inf.
    """
    is_varlen = cu_seqlens_q is not None
    head_dim = q.shape[-1]
    nheads_q, nheads_k = q.shape[-2], k.shape[-2]
    out = empty_packed(q.shape, q.dtype, q.device, cu_seqlens_q)
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        lse = empty_packed((nheads_q, q.shape[0]), torch.float32, q.device, cu_seqlens_q, float("inf"), row_dim=1)
        q_strides, k_strides, v_strides, o_strides = ((0,) + t.stride() for t in (q, k, v, out))
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q = q.shape[0], q.shape[1]
        seqlen_k = k.shape[1]
        lse = torch.empty(batch, nheads_q, seqlen_q, dtype=torch.float32, device=q.device)
        q_strides, k_strides, v_strides, o_strides = (t.stride() for t in (q, k, v, out))
        lse_strides = (lse.stride(0), lse.stride(1))
    if out.numel() == 0 or seqlen_q == 0:
        return out, lse.fill_(float("inf"))

    fast = _fast_forward_plan(q, k, v, out, head_dim, window_left, window_right, softcap, alibi_slopes,
                              attn_bias, dropout_p, is_varlen, nheads_q, batch, seqlen_q, seqlen_k, softmax_scale)
    if fast is not None and fast.pop("GLUON", False):
        qk_scale, softcap_scale = score_scales(softmax_scale, softcap)
        return flash_fwd_hopper.hopper_forward(
            q, k, v, out, lse, q_strides=q_strides, k_strides=k_strides, v_strides=v_strides, o_strides=o_strides,
            lse_strides=lse_strides, nheads_q=nheads_q, nheads_k=nheads_k, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
            qk_scale=qk_scale, window_right=window_right, bottom_right=bottom_right, config=fast,
            window_left=window_left, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, softcap_scale=softcap_scale,
            alibi_slopes=alibi_slopes, dropout_p=dropout_p, rng_state=rng_state)
    if fast is not None:
        if fast["USE_TMA"] and not INTERPRET:
            ensure_tma_allocator()
        grid = (cdiv(seqlen_q, fast["BLOCK_M"]), batch * nheads_q)
        _flash_fwd_fast_kernel[grid](
            q, k, v, out, lse, *q_strides[:3], *k_strides[:3], *v_strides[:3], *o_strides[:3], *lse_strides,
            nheads_q, nheads_q // nheads_k, seqlen_q, seqlen_k, softmax_scale * math.log2(math.e), window_right,
            HAS_RIGHT=window_right >= 0, BOTTOM_RIGHT=bottom_right, BLOCK_D=head_dim, **fast)
        return out, lse

    block_d, block_d2 = head_dim_split(head_dim, q.dtype)
    opts = kernel_options(head_dim=head_dim, block_d=block_d, softmax_scale=softmax_scale,
                          window_left=window_left, window_right=window_right, bottom_right=bottom_right,
                          softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
                          dropout_p=dropout_p, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k, dummy=out)
    # Positional: benchmarks replace forward_config with ``lambda *a: config``.
    cfg = forward_config(block_d + block_d2, q.dtype, window_left >= 0 or window_right >= 0,
                         attn_bias is not None, seqlen_q, seqlen_k, batch * nheads_q,
                         132 if INTERPRET else sm_count(q.device))
    flags = dict(opts.flags, BLOCK_D=block_d, EVEN_D=block_d2 > 0 or block_d == head_dim, BLOCK_D2=block_d2,
                 VEC=vector_width(head_dim, q.element_size(), (q, k, v, out)))
    grid = (cdiv(seqlen_q, cfg["BLOCK_M"]), batch * nheads_q)
    _flash_fwd_kernel[grid](
        q, k, v, out, lse, *opts.pointers,
        *q_strides[:3], *k_strides[:3], *v_strides[:3], *o_strides[:3], *lse_strides, *opts.strides,
        nheads_q, nheads_q // nheads_k, seqlen_q, seqlen_k, head_dim, *opts.scalars,
        **flags, **cfg,
    )
    return out, lse
