"""FlashAttention-2 backward: recompute P from the saved LSE instead of storing it.

With P = exp(S - lse) (dropout: P~ = P * keep / (1 - p), O = P~ V) and dO given:

    dV    = P~^T dO
    dP~   = dO V^T,   dP = dP~ * keep / (1 - p)
    delta = rowsum(dP * P) = rowsum(dO * O)               (preprocess kernel, one pass over O)
    dS    = P * (dP - delta)                              (softmax VJP, row by row)
    dX    = dS * scale   (softcap: dS * scale * (1 - tanh^2))   X = Q K^T, the raw dot products
    dQ    = dX K,   dK = dX^T Q

After the delta preprocess, one grid (``_flash_bwd_kernel``) holds two kinds of program, no atomics,
so gradients are bit-identical run to run:
- ``_dkdv_program``: one key block of one *kv* head. It walks the query blocks that see its keys, for
  every query head of its GQA group, accumulating dK and dV in registers: the reduction over the group
  happens in a fixed order inside one program.
- ``_dq_program``: one query block of one query head, walking its key blocks like the forward does.
Both recompute S = Q K^T and dP~ = dO V^T (7 matrix products where an atomic dQ would need 5); that
is the price of determinism and of no fp32 dQ buffer.

On Hopper, ``deterministic=False`` (flash-attn's default) takes flash_bwd_hopper's Gluon kernel instead where
it applies (``_hopper_plan``: 16-bit, head dims 33..256 (computed at 64 / 128, 128 + 32 / 64, 256), no
bias; softcap, ALiBi, dropout, windows on either side and varlen are in): FlashAttention-3's layout, 5 products, dQ by
TMA reduce-adds into an fp32 buffer; above 128 dK / dV there and dQ in a pass of its own (flash_bwd_dq_hopper: 7
products, nothing added across programs, so deterministic=True takes it too).

The atomic path (``deterministic=False`` with ``ATOMIC_DQ`` on, FA2/FA3's layout) launches the same kernel
with only dK/dV programs: each also forms dQ_part = dS K for its [BLOCK_M queries, BLOCK_N keys] tile and
adds it with fp32 atomics into a zeroed [*, Hq, D] float32 buffer, which ``_dq_convert_kernel`` scales
and casts. 5 matrix products; the summation order of dQ then varies run to run (last-bit differences).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..._env import INTERPRET
from .._triton import cdiv, dot, ensure_tma_allocator
from ._flash_common import (LOG2E, empty_packed, kernel_options, key_block_phases, query_block_phases, score_mod,
                            seq_bounds)
from . import flash_bwd_hopper
from .dropout import dropout_keep
from .flash_bwd_preprocess import _bwd_preprocess_kernel
from .flash_fwd import head_dim_block, tma_compatible


@triton.jit
def _dkdv_query_blocks(dk, dv, b_k, b_v, q_src, do_src, lse_base, delta_base, dq_base, start, end,
                       shift, o_n, o_d, m_d, i_bh, seqlen_q, seqlen_k, stride_q_s, stride_do_s,
                       stride_dqa_s, window_left, window_right, qk_scale, softcap_scale, softcap_log2,
                       alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n, p_rng, dropout_p,
                       MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                       BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                       ROTATE: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr):
    """dK, dV contributions of query blocks [start, end) of one query head, in the transposed layout
    (tiles are [BLOCK_N keys, BLOCK_M queries]) so no tile needs a transpose before its product.
    q_src / do_src: tensor descriptors over the head's [seqlen_q, BLOCK_D] rows (USE_TMA: TMA zero-fills
    rows past seqlen_q) or its base pointers. ATOMIC_DQ: also add dQ_part = dS K of each tile into the
    fp32 buffer at dq_base (unscaled).
    ROTATE (block-aligned [start, end) only): visit the blocks starting ``shift`` rows in, wrapping
    around, so the key blocks of one head do not all add into the same dQ rows at the same time."""
    for i_m in range(start, end, BLOCK_M):
        start_m = i_m
        if ROTATE:
            start_m = start + (i_m - start + shift) % (end - start)
        o_m = start_m + tl.arange(0, BLOCK_M)
        if USE_TMA:
            b_q = q_src.load([start_m, 0])
            b_do = do_src.load([start_m, 0])
        elif MASKED:
            m_qd = (o_m < seqlen_q)[:, None] & m_d[None, :]
            b_q = tl.load(q_src + o_m[:, None] * stride_q_s + o_d[None, :], mask=m_qd, other=0.0)
            b_do = tl.load(do_src + o_m[:, None] * stride_do_s + o_d[None, :], mask=m_qd, other=0.0)
        else:
            b_q = tl.load(q_src + o_m[:, None] * stride_q_s + o_d[None, :], mask=m_d[None, :], other=0.0)
            b_do = tl.load(do_src + o_m[:, None] * stride_do_s + o_d[None, :], mask=m_d[None, :], other=0.0)
        if MASKED:
            m_rows = o_m < seqlen_q
            lse2 = tl.load(lse_base + o_m, mask=m_rows, other=float("inf")) * LOG2E
            delta = tl.load(delta_base + o_m, mask=m_rows, other=0.0)
        else:
            lse2 = tl.load(lse_base + o_m) * LOG2E
            delta = tl.load(delta_base + o_m)
        qk_t = dot(b_k, tl.trans(b_q), tl.zeros([b_k.shape[0], BLOCK_M], dtype=tl.float32))  # [N, M]
        s2_t, tanh_t = score_mod(qk_t, o_m[None, :], o_n[:, None], seqlen_q, seqlen_k, window_left,
                                 window_right, qk_scale, softcap_scale, softcap_log2, alibi_slope_log2,
                                 p_bias, stride_bias_m, stride_bias_n, MASKED, HAS_LEFT, HAS_RIGHT,
                                 BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS)
        p_t = tl.exp2(s2_t - lse2[None, :])                                                   # [N, M]
        dp_t = dot(b_v, tl.trans(b_do), tl.zeros([b_k.shape[0], BLOCK_M], dtype=tl.float32))  # [N, M]
        if HAS_DROPOUT:
            keep_t = dropout_keep(p_rng, i_bh, o_m[None, :], o_n[:, None], dropout_p)
            inv_keep = 1.0 / (1.0 - dropout_p)
            dv = dot((tl.where(keep_t, p_t, 0.0) * inv_keep).to(b_do.dtype), b_do, dv)
            dp_t = tl.where(keep_t, dp_t, 0.0) * inv_keep
        else:
            dv = dot(p_t.to(b_do.dtype), b_do, dv)
        ds_t = p_t * (dp_t - delta[None, :])
        if HAS_SOFTCAP:
            ds_t = ds_t * (1.0 - tanh_t * tanh_t)
        ds_t = ds_t.to(b_q.dtype)
        dk = dot(ds_t, b_q, dk)
        if ATOMIC_DQ:
            # [M, D] in the dot's accumulator layout: each thread holds runs of consecutive d, so the
            # adds can go out as vector reductions (red.global.add.v2/v4.f32 on sm_90).
            dq = dot(tl.trans(ds_t), b_k, tl.zeros([BLOCK_M, b_k.shape[1]], dtype=tl.float32))
            p_dq = dq_base + o_m[:, None] * stride_dqa_s + o_d[None, :]
            if MASKED:
                tl.atomic_add(p_dq, dq, mask=(o_m[:, None] < seqlen_q) & m_d[None, :], sem="relaxed")
            else:
                tl.atomic_add(p_dq, dq, mask=m_d[None, :], sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_program(
    i_n, i_b, i_hk,
    p_q, p_k, p_v, p_do, p_lse, p_delta, p_dk, p_dv, p_dqa, p_cu_seqlens_q, p_cu_seqlens_k, p_alibi,
    p_bias, p_rng,
    stride_q_b, stride_q_s, stride_q_h, stride_k_b, stride_k_s, stride_k_h,
    stride_v_b, stride_v_s, stride_v_h, stride_do_b, stride_do_s, stride_do_h,
    stride_dk_b, stride_dk_s, stride_dk_h, stride_dv_b, stride_dv_s, stride_dv_h,
    stride_dqa_b, stride_dqa_s, stride_dqa_h,
    stride_lse_b, stride_lse_h, stride_alibi_b,
    stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
    nheads_q, group, seqlen_q, seqlen_k, head_dim,
    sm_scale, qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr, STAGGER: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
):
    """dK, dV of key block i_n of kv head i_hk, summed over the query heads of its GQA group
    (ATOMIC_DQ: and every tile's dQ contribution, added into p_dqa). USE_TMA (EVEN_D, not varlen): the streamed Q
    and dO tiles through tensor descriptors."""
    q_start, seqlen_q = seq_bounds(p_cu_seqlens_q, i_b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = seq_bounds(p_cu_seqlens_k, i_b, seqlen_k, IS_VARLEN)
    n0 = i_n * BLOCK_N
    if n0 >= seqlen_k:
        return

    i_b64 = i_b.to(tl.int64)
    o_n = n0 + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    if EVEN_D:
        m_d = o_d < BLOCK_D
    else:
        m_d = o_d < head_dim
    m_kv = (o_n[:, None] < seqlen_k) & m_d[None, :]
    k_off = i_b64 * stride_k_b + k_start * stride_k_s + i_hk * stride_k_h
    v_off = i_b64 * stride_v_b + k_start * stride_v_s + i_hk * stride_v_h
    b_k = tl.load(p_k + k_off + o_n[:, None] * stride_k_s + o_d[None, :], mask=m_kv, other=0.0)  # [N, D]
    b_v = tl.load(p_v + v_off + o_n[:, None] * stride_v_s + o_d[None, :], mask=m_kv, other=0.0)  # [N, D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = query_block_phases(n0, seqlen_q, seqlen_k, window_left, window_right,
                                                  BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT)
    shift = n0 // BLOCK_M * BLOCK_M          # STAGGER: key block n starts its full phase near row n0
    for g in range(0, group):                                  # the GQA group, in a fixed order
        i_h = i_hk * group + g
        i_bh = i_b * nheads_q + i_h
        q_base = p_q + i_b64 * stride_q_b + q_start * stride_q_s + i_h * stride_q_h
        do_base = p_do + i_b64 * stride_do_b + q_start * stride_do_s + i_h * stride_do_h
        dq_base = p_dqa + i_b64 * stride_dqa_b + q_start * stride_dqa_s + i_h * stride_dqa_h
        q_src, do_src = q_base, do_base
        if USE_TMA:
            q_src = tl.make_tensor_descriptor(q_base, [seqlen_q, BLOCK_D], [stride_q_s, 1], [BLOCK_M, BLOCK_D])
            do_src = tl.make_tensor_descriptor(do_base, [seqlen_q, BLOCK_D], [stride_do_s, 1], [BLOCK_M, BLOCK_D])
        lse_base = p_lse + i_b64 * stride_lse_b + i_h * stride_lse_h + q_start
        delta_base = p_delta + i_b64 * stride_lse_b + i_h * stride_lse_h + q_start
        alibi_slope_log2 = 0.0
        if HAS_ALIBI:
            alibi_slope_log2 = tl.load(p_alibi + i_b * stride_alibi_b + i_h) * LOG2E
        bias_base = p_bias
        if HAS_BIAS:
            bias_base = p_bias + i_b64 * stride_bias_b + i_h * stride_bias_h
        dk, dv = _dkdv_query_blocks(
            dk, dv, b_k, b_v, q_src, do_src, lse_base, delta_base, dq_base, lo, full_lo, shift, o_n,
            o_d, m_d, i_bh, seqlen_q, seqlen_k, stride_q_s, stride_do_s, stride_dqa_s, window_left,
            window_right, qk_scale, softcap_scale, softcap_log2, alibi_slope_log2, bias_base,
            stride_bias_m, stride_bias_n, p_rng, dropout_p, True, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
            HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, ATOMIC_DQ, False, USE_TMA, BLOCK_M)
        dk, dv = _dkdv_query_blocks(
            dk, dv, b_k, b_v, q_src, do_src, lse_base, delta_base, dq_base, full_lo, full_hi, shift,
            o_n, o_d, m_d, i_bh, seqlen_q, seqlen_k, stride_q_s, stride_do_s, stride_dqa_s, window_left,
            window_right, qk_scale, softcap_scale, softcap_log2, alibi_slope_log2, bias_base,
            stride_bias_m, stride_bias_n, p_rng, dropout_p, False, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
            HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, ATOMIC_DQ, STAGGER, USE_TMA, BLOCK_M)
        dk, dv = _dkdv_query_blocks(
            dk, dv, b_k, b_v, q_src, do_src, lse_base, delta_base, dq_base, full_hi, hi, shift, o_n,
            o_d, m_d, i_bh, seqlen_q, seqlen_k, stride_q_s, stride_do_s, stride_dqa_s, window_left,
            window_right, qk_scale, softcap_scale, softcap_log2, alibi_slope_log2, bias_base,
            stride_bias_m, stride_bias_n, p_rng, dropout_p, True, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
            HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, ATOMIC_DQ, False, USE_TMA, BLOCK_M)

    dk_off = i_b64 * stride_dk_b + k_start * stride_dk_s + i_hk * stride_dk_h
    dv_off = i_b64 * stride_dv_b + k_start * stride_dv_s + i_hk * stride_dv_h
    tl.store(p_dk + dk_off + o_n[:, None] * stride_dk_s + o_d[None, :],
             (dk * sm_scale).to(p_dk.dtype.element_ty), mask=m_kv)
    tl.store(p_dv + dv_off + o_n[:, None] * stride_dv_s + o_d[None, :], dv.to(p_dv.dtype.element_ty),
             mask=m_kv)


@triton.jit
def _dq_key_blocks(dq, b_q, b_do, lse2, delta, k_src, v_src, start, end, o_m, o_d, m_d, i_bh,
                   seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale,
                   softcap_scale, softcap_log2, alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n,
                   p_rng, dropout_p, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr,
                   HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                   HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   USE_TMA: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ contribution of key blocks [start, end); k_src / v_src: tensor descriptors (USE_TMA) or base
    pointers."""
    for start_n in range(start, end, BLOCK_N):
        o_n = start_n + tl.arange(0, BLOCK_N)
        if USE_TMA:
            b_k = k_src.load([start_n, 0])                                                     # [N, D]
            b_v = v_src.load([start_n, 0])
        else:
            if MASKED:
                m_kv = (o_n[:, None] < seqlen_k) & m_d[None, :]
            else:
                m_kv = m_d[None, :]
            b_k = tl.load(k_src + o_n[:, None] * stride_k_s + o_d[None, :], mask=m_kv, other=0.0)  # [N, D]
            b_v = tl.load(v_src + o_n[:, None] * stride_v_s + o_d[None, :], mask=m_kv, other=0.0)
        qk = dot(b_q, tl.trans(b_k), tl.zeros([b_q.shape[0], BLOCK_N], dtype=tl.float32))     # [M, N]
        s2, tanh_s = score_mod(qk, o_m[:, None], o_n[None, :], seqlen_q, seqlen_k, window_left,
                               window_right, qk_scale, softcap_scale, softcap_log2, alibi_slope_log2,
                               p_bias, stride_bias_m, stride_bias_n, MASKED, HAS_LEFT, HAS_RIGHT,
                               BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS)
        p = tl.exp2(s2 - lse2[:, None])                                                      # [M, N]
        dp = dot(b_do, tl.trans(b_v), tl.zeros([b_q.shape[0], BLOCK_N], dtype=tl.float32))    # [M, N]
        if HAS_DROPOUT:
            keep = dropout_keep(p_rng, i_bh, o_m[:, None], o_n[None, :], dropout_p)
            dp = tl.where(keep, dp, 0.0) * (1.0 / (1.0 - dropout_p))
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh_s * tanh_s)
        dq = dot(ds.to(b_k.dtype), b_k, dq)
    return dq


@triton.jit
def _dq_program(
    i_m, i_b, i_h,
    p_q, p_k, p_v, p_do, p_lse, p_delta, p_dq, p_cu_seqlens_q, p_cu_seqlens_k, p_alibi, p_bias, p_rng,
    stride_q_b, stride_q_s, stride_q_h, stride_k_b, stride_k_s, stride_k_h,
    stride_v_b, stride_v_s, stride_v_h, stride_do_b, stride_do_s, stride_do_h,
    stride_dq_b, stride_dq_s, stride_dq_h,
    stride_lse_b, stride_lse_h, stride_alibi_b,
    stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
    nheads_q, group, seqlen_q, seqlen_k, head_dim,
    sm_scale, qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, USE_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
):
    """dQ of query block i_m of query head i_h (USE_TMA: its K, V tiles through tensor descriptors)."""
    i_hk = i_h // group
    i_bh = i_b * nheads_q + i_h
    q_start, seqlen_q = seq_bounds(p_cu_seqlens_q, i_b, seqlen_q, IS_VARLEN)
    k_start, seqlen_k = seq_bounds(p_cu_seqlens_k, i_b, seqlen_k, IS_VARLEN)
    m0 = i_m * BLOCK_M
    if m0 >= seqlen_q:
        return

    i_b64 = i_b.to(tl.int64)
    o_m = m0 + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    if EVEN_D:
        m_d = o_d < BLOCK_D
    else:
        m_d = o_d < head_dim
    m_rows = o_m < seqlen_q
    m_qd = m_rows[:, None] & m_d[None, :]
    q_off = i_b64 * stride_q_b + q_start * stride_q_s + i_h * stride_q_h
    do_off = i_b64 * stride_do_b + q_start * stride_do_s + i_h * stride_do_h
    b_q = tl.load(p_q + q_off + o_m[:, None] * stride_q_s + o_d[None, :], mask=m_qd, other=0.0)
    b_do = tl.load(p_do + do_off + o_m[:, None] * stride_do_s + o_d[None, :], mask=m_qd, other=0.0)
    lse_off = i_b64 * stride_lse_b + i_h * stride_lse_h + q_start
    lse2 = tl.load(p_lse + lse_off + o_m, mask=m_rows, other=float("inf")) * LOG2E
    delta = tl.load(p_delta + lse_off + o_m, mask=m_rows, other=0.0)
    k_base = p_k + i_b64 * stride_k_b + k_start * stride_k_s + i_hk * stride_k_h
    v_base = p_v + i_b64 * stride_v_b + k_start * stride_v_s + i_hk * stride_v_h
    k_src, v_src = k_base, v_base
    if USE_TMA:
        k_src = tl.make_tensor_descriptor(k_base, [seqlen_k, BLOCK_D], [stride_k_s, 1], [BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_base, [seqlen_k, BLOCK_D], [stride_v_s, 1], [BLOCK_N, BLOCK_D])
    alibi_slope_log2 = 0.0
    if HAS_ALIBI:
        alibi_slope_log2 = tl.load(p_alibi + i_b * stride_alibi_b + i_h) * LOG2E
    if HAS_BIAS:
        p_bias += i_b64 * stride_bias_b + i_h * stride_bias_h

    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_block_phases(m0, seqlen_q, seqlen_k, window_left, window_right,
                                                BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT)
    dq = _dq_key_blocks(dq, b_q, b_do, lse2, delta, k_src, v_src, lo, full_lo, o_m, o_d, m_d, i_bh,
                        seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale,
                        softcap_scale, softcap_log2, alibi_slope_log2, p_bias, stride_bias_m,
                        stride_bias_n, p_rng, dropout_p, True, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                        HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, USE_TMA, BLOCK_N)
    dq = _dq_key_blocks(dq, b_q, b_do, lse2, delta, k_src, v_src, full_lo, full_hi, o_m, o_d, m_d,
                        i_bh, seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right,
                        qk_scale, softcap_scale, softcap_log2, alibi_slope_log2, p_bias, stride_bias_m,
                        stride_bias_n, p_rng, dropout_p, False, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                        HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, USE_TMA, BLOCK_N)
    dq = _dq_key_blocks(dq, b_q, b_do, lse2, delta, k_src, v_src, full_hi, hi, o_m, o_d, m_d, i_bh,
                        seqlen_q, seqlen_k, stride_k_s, stride_v_s, window_left, window_right, qk_scale,
                        softcap_scale, softcap_log2, alibi_slope_log2, p_bias, stride_bias_m,
                        stride_bias_n, p_rng, dropout_p, True, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                        HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT, USE_TMA, BLOCK_N)
    dq_off = i_b64 * stride_dq_b + q_start * stride_dq_s + i_h * stride_dq_h
    tl.store(p_dq + dq_off + o_m[:, None] * stride_dq_s + o_d[None, :], (dq * sm_scale).to(p_dq.dtype.element_ty),
             mask=m_qd)


@triton.jit
def _flash_bwd_kernel(
    p_q, p_k, p_v, p_do, p_lse, p_delta, p_dq, p_dk, p_dv, p_dqa, p_cu_seqlens_q, p_cu_seqlens_k,
    p_alibi, p_bias, p_rng,
    stride_q_b, stride_q_s, stride_q_h, stride_k_b, stride_k_s, stride_k_h,
    stride_v_b, stride_v_s, stride_v_h, stride_do_b, stride_do_s, stride_do_h,
    stride_dq_b, stride_dq_s, stride_dq_h, stride_dk_b, stride_dk_s, stride_dk_h,
    stride_dv_b, stride_dv_s, stride_dv_h, stride_dqa_b, stride_dqa_s, stride_dqa_h,
    stride_lse_b, stride_lse_h, stride_alibi_b,
    stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
    nheads_q, nheads_k, group, seqlen_q, seqlen_k, head_dim, num_kv_blocks, num_q_blocks,
    sm_scale, qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p,
    IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_DROPOUT: tl.constexpr, ATOMIC_DQ: tl.constexpr, STAGGER: tl.constexpr,
    HEADS_FIRST: tl.constexpr, TMA_DKDV: tl.constexpr, TMA_DQ: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
    BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
):
    """Deterministic (ATOMIC_DQ off): programs [0, num_kv_blocks) of axis 0 compute dK/dV of one key
    block; the next group * num_q_blocks compute dQ of one query block of one query head of the group.
    One grid for both kinds lets them share the SMs (FlexAttention's layout): measured 394 vs 366
    TFLOP/s for two launches at hd128 on an H200 (benchmarks/NOTES.md).

    ATOMIC_DQ: dK/dV programs only, dQ by atomics into p_dqa. HEADS_FIRST: grid (batch * nheads_k,
    num_kv_blocks), heads vary fastest so the first wave holds key block 0 of every head: under a
    causal mask those are the heaviest programs (they see every query block), and concurrent programs
    of one head are few, so few of them add into the same dQ rows at once. Otherwise (num_kv_blocks,
    batch * nheads_k): the programs in flight share one or two heads, whose fp32 dQ (S x D x 4 bytes,
    4 MB at S = 8192, hd128) then stays in L2; with STAGGER they add into different rows.

    TMA_DKDV / TMA_DQ: the tiles that kind of program streams (Q, dO for dK/dV; K, V for dQ) come
    through tensor descriptors (TMA): no address arithmetic or masks in the loops, and a shared-memory
    pipeline."""
    if ATOMIC_DQ and HEADS_FIRST:
        i_bhk = tl.program_id(0)
        pid = tl.program_id(1)
    else:
        pid = tl.program_id(0)
        i_bhk = tl.program_id(1)
    i_b = i_bhk // nheads_k
    i_hk = i_bhk % nheads_k
    if pid < num_kv_blocks:
        _dkdv_program(
            pid, i_b, i_hk, p_q, p_k, p_v, p_do, p_lse, p_delta, p_dk, p_dv, p_dqa, p_cu_seqlens_q,
            p_cu_seqlens_k, p_alibi, p_bias, p_rng,
            stride_q_b, stride_q_s, stride_q_h, stride_k_b, stride_k_s, stride_k_h,
            stride_v_b, stride_v_s, stride_v_h, stride_do_b, stride_do_s, stride_do_h,
            stride_dk_b, stride_dk_s, stride_dk_h, stride_dv_b, stride_dv_s, stride_dv_h,
            stride_dqa_b, stride_dqa_s, stride_dqa_h,
            stride_lse_b, stride_lse_h, stride_alibi_b,
            stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
            nheads_q, group, seqlen_q, seqlen_k, head_dim,
            sm_scale, qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p,
            IS_VARLEN, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT,
            ATOMIC_DQ, STAGGER, TMA_DKDV, BLOCK_M1, BLOCK_N1, BLOCK_D, EVEN_D)
    elif not ATOMIC_DQ:
        j = pid - num_kv_blocks
        i_m = num_q_blocks - 1 - j % num_q_blocks             # heaviest (causal) query blocks first
        _dq_program(
            i_m, i_b, i_hk * group + j // num_q_blocks, p_q, p_k, p_v, p_do, p_lse, p_delta, p_dq,
            p_cu_seqlens_q, p_cu_seqlens_k, p_alibi, p_bias, p_rng,
            stride_q_b, stride_q_s, stride_q_h, stride_k_b, stride_k_s, stride_k_h,
            stride_v_b, stride_v_s, stride_v_h, stride_do_b, stride_do_s, stride_do_h,
            stride_dq_b, stride_dq_s, stride_dq_h,
            stride_lse_b, stride_lse_h, stride_alibi_b,
            stride_bias_b, stride_bias_h, stride_bias_m, stride_bias_n,
            nheads_q, group, seqlen_q, seqlen_k, head_dim,
            sm_scale, qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p,
            IS_VARLEN, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_BIAS, HAS_DROPOUT,
            TMA_DQ, BLOCK_M2, BLOCK_N2, BLOCK_D, EVEN_D)


@triton.jit
def _dq_convert_kernel(p_acc, p_dq, numel, sm_scale, BLOCK: tl.constexpr):
    """dq = acc * sm_scale in dq's dtype, over the flat contiguous buffers (one read, one write)."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < numel
    tl.store(p_dq + o, (tl.load(p_acc + o, mask=m, other=0.0) * sm_scale).to(p_dq.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------------

def backward_config(head_dim_block: int, dtype: torch.dtype, large_smem: bool = False) -> dict:
    """Tiles of the two program kinds: dK/dV holds BLOCK_N1 keys (and two [BLOCK_N1, D] fp32
    accumulators) and streams BLOCK_M1 queries; dQ holds BLOCK_M2 queries and streams BLOCK_N2 keys.
    Chosen by timing on an H200 among configs screened for register spills (benchmarks/NOTES.md).
    TMA_DKDV / TMA_DQ: tensor-descriptor tiles in that kind of program, where they apply (_tma_applies)
    and measured faster. The interpreter takes them wherever they apply, so the CPU tier runs both load
    paths. large_smem: the GPU gives a block >= 200 KB of shared memory (Hopper), for the wide head dims' tiles."""
    if INTERPRET:
        return dict(BLOCK_M1=32, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=32, num_warps=4, num_stages=1, TMA_DKDV=True,
                    TMA_DQ=True)
    if dtype == torch.float32:           # tf32x3 dots hold three operand copies: smaller tiles
        return dict(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_warps=4, num_stages=1)
    if head_dim_block <= 64:
        # TMA tiles: H200, bf16, 16384 tokens, hd64 (tune_flash_bwd.py, session 9) 5-10% faster than pointer
        # loads at S = 2048..8192 (S = 8192: 7901 vs 8425 us, causal 4079 vs 4317; S = 4096: 3904 vs 4275).
        # ptxas: 0 bytes of spill (pointer loads 52), 66 KB of shared memory (the Q / dO pipeline).
        return dict(BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, num_warps=4, num_stages=3, TMA_DKDV=True,
                    TMA_DQ=True)
    if head_dim_block <= 128:
        # FlexAttention's sm_90 backward tiles. A third stage: H200, bf16, 16384 tokens, S = 2048..8192
        # (benchmarks/tune_flash_bwd.py, session 5) 1-5% faster than 2 stages (S = 8192: 6574 vs 6768 us,
        # causal 3609 vs 3794). Pointer loads: TMA tiles measured 12-14% slower here (session 9, S = 8192:
        # 7673 vs 6704 us, causal 4182 vs 3552; 2 stages or 64 x 64 tiles with TMA no better).
        return dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=64, num_warps=8, num_stages=3)
    if large_smem:
        # Head dims padded to 256 (160: SD-1.5's deepest level). H100, bf16, 16384 tokens, S = 2048, CUDA-graph timed
        # (session 36, `results/h100-2026-11-24-s36/c5`): hd160 116 / 107 TFLOP/s (causal) vs 47 / 46 for the
        # 16 x 32 tiles below, hd256 184 / 162 vs 75 / 72; 32 x 32 tiles with 4 warps and 2-3 stages 96-97 / 91 and
        # 156-162 / 146-148; 8 warps on 32 x 32 tiles or 4 on 64 x 64 slower. (SDPA's flash backend: hd160 188.)
        return dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, num_warps=8, num_stages=2)
    return dict(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_warps=4, num_stages=1)


def _large_smem(device: torch.device) -> bool:
    return (not INTERPRET and device.type == "cuda"
            and torch.cuda.get_device_properties(device).shared_memory_per_block_optin >= 200 * 1024)


# The fp32 atomic dQ path for deterministic=False (a knob, off). It does 5 matrix products instead of 7
# but adds 0.4 * R / BLOCK_N1 bytes/s of fp32 reductions into L2 at R reported FLOP/s (each [BLOCK_M, D]
# dQ tile, 4 * BLOCK_M * D bytes, carries 10 * BLOCK_M * BLOCK_N1 * D FLOPs): 1.6 TB/s at 500 TFLOP/s with
# 128 keys per program. Measured slower than the deterministic grid (H200, bf16, 16384 tokens, session 5,
# best of 8 configs per shape): hd128 S = 8192 7713 vs 6574 us (causal 3755 vs 3609), hd64 8552 vs 8081
# (causal 4292 vs 4395: its one win); the extra [BLOCK_M1, D] product and the adds cost more than the two
# recomputed products save at these tiles. Session 9 measured it again with TMA tiles and dQ added by TMA
# bulk reduce-adds (one cp.reduce.async.bulk per tile instead of per-thread atomics): still slower, hd128
# S = 8192 8425 us at its best tile (32 x 128, 8 warps, 3 stages) vs 6704, hd64 8301 vs 7901; the reduce
# version was removed. Kept (pointer atomics), tested on both tiers. On Hopper, deterministic=False takes
# flash_bwd_hopper's Gluon kernel instead (5 products without the spills: FA3's layout).
ATOMIC_DQ = False


def atomic_backward_config(head_dim_block: int, dtype: torch.dtype, score_extras: bool = False) -> dict:
    """Tiles of the atomic path: a program holds BLOCK_N1 keys (dK, dV fp32 accumulators) and streams
    BLOCK_M1 queries; per query tile it also holds the [BLOCK_M1, D] dQ part. BLOCK_N1 = 128 halves the
    atomic traffic of 64 (see ATOMIC_DQ). STAGGER rotates the unmasked query loop per key block.
    score_extras (softcap, ALiBi, bias, dropout or a left window): 32-query tiles, since their extra
    [BLOCK_N1, BLOCK_M1] terms spill at 64 (ptxas, sm_90, bf16 hd128 dropout: 1528 -> 280 bytes; hd96
    softcap + ALiBi: 520 -> 136; the deterministic grid spills 1156 / 1468 there).
    Starting points (FA3's hd128 backward tile is 64 queries x 128 keys, 8 warps) for the H200 sweep in
    benchmarks/tune_flash_bwd.py; the choice is the lead's once measured."""
    if INTERPRET:
        return dict(BLOCK_M1=16, BLOCK_N1=32, num_warps=4, num_stages=1, STAGGER=True, TMA_DKDV=True)
    if dtype == torch.float32 or head_dim_block > 128:     # tf32x3 operands / wide rows: small tiles
        return dict(BLOCK_M1=16, BLOCK_N1=32, num_warps=4, num_stages=1, STAGGER=False)
    # ptxas (sm_90, bf16, no extras): 64x128 / 8 warps -> hd64 242 regs no spill, hd128 112 bytes of spill.
    return dict(BLOCK_M1=32 if score_extras else 64, BLOCK_N1=128, num_warps=8, num_stages=2, STAGGER=False)


def _tma_applies(q, k, v, dout, head_dim, block_d, is_varlen) -> bool:
    """Where a config's TMA_DKDV / TMA_DQ may take effect: head dims that need no column mask (16, 32, 64, 128,
    256), not varlen, 16-bit inputs (fp32 only in the interpreter), 16-byte aligned rows."""
    if is_varlen or block_d != head_dim:
        return False
    if not INTERPRET and q.dtype not in (torch.float16, torch.bfloat16):
        return False
    return tma_compatible(q, k, v, dout)


# flash_bwd_hopper's Gluon kernel for deterministic=False where it applies (sm_90, triton 3.6); False: never.
GLUON_BACKWARD = True


def _hopper_plan(dout, q, k, v, *, deterministic, extras, score_mod=False):
    """flash_bwd_hopper's config for this call, or None: deterministic=True where it adds dQ with TMA reduce-adds
    (every head dim up to 128; above, the dQ pass sums in a fixed order), bias (``extras``: not in that kernel;
    softcap, ALiBi and dropout are, ``score_mod``),
    32-bit inputs, strides TMA cannot take, other GPUs. Varlen's packed (total, heads, head_dim) tensors compute head
    dims 129..256 at 256 (hopper_backward_config)."""
    if not GLUON_BACKWARD or extras or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    if not q.dtype == k.dtype == v.dtype == dout.dtype:     # one dtype per descriptor set
        return None
    if not (flash_bwd_hopper.available(q.device) and tma_compatible(q, k, v, dout)
            and flash_bwd_hopper.descriptor_compatible(q, k, v, dout)):
        return None
    config = flash_bwd_hopper.hopper_backward_config(q.shape[-1], varlen=q.dim() == 3, score_mod=score_mod)
    return None if config is None or (deterministic and not config["DQ_PASS"]) else config


# 2048 fp32 per program, 4 warps: 16 elements (four 16-byte vectors) per thread, enough in flight to
# stream at the copy rate; the whole pass is ~1.5% of the backward at S = 8192 (6 bytes per dQ element).
_CONVERT_BLOCK = 2048


def flash_attn_backward(dout, q, k, v, out, lse, *, softmax_scale: float, window_left: int = -1,
                        window_right: int = -1, bottom_right: bool = True, softcap: float = 0.0,
                        alibi_slopes=None, attn_bias=None, dropout_p: float = 0.0, rng_state=None,
                        cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                        deterministic: bool = False, fp32_grads: bool = False, atomic_dq: bool | None = None,
                        config: dict | None = None):
    """Launch the preprocess and the fused backward kernel; same arguments as flash_attn_forward plus
    dout, out and lse.

    deterministic=True takes the no-atomics grid (bit-identical gradients run to run), or, at head dims padded to
    256, flash_bwd_hopper's two passes (bit-identical too); deterministic=False takes flash_bwd_hopper's kernel
    where _hopper_plan allows it, else the atomic-dQ
    grid when ``atomic_dq`` (default: the module's ATOMIC_DQ) is on, else the no-atomics grid. ``config``
    overrides the tile table of the Triton grid taken (backward_config / atomic_backward_config keys; for
    tuning; the Gluon kernel is then not used). fp32_grads: (dq, dk, dv) in float32 instead of the inputs'
    dtype, for callers that sum partial gradients (ring attention) and should round once, at the end.
    Returns (dq, dk, dv), contiguous, shaped like q, k, v; varlen rows past cu_seqlens[-1] (in no sequence) 0."""
    is_varlen = cu_seqlens_q is not None
    score_extras = softcap > 0 or alibi_slopes is not None or attn_bias is not None or dropout_p > 0
    extras = score_extras or window_left >= 0           # the Triton grid's small tiles (atomic_backward_config)
    hopper_cfg = None
    if config is None and not (q.numel() == 0 or k.numel() == 0):
        hopper_cfg = _hopper_plan(dout, q, k, v, deterministic=deterministic,
                                  score_mod=softcap > 0 or alibi_slopes is not None or dropout_p > 0,
                                  # (the kernel divides ALiBi's slope by the scale)
                                  extras=attn_bias is not None or (alibi_slopes is not None and softmax_scale == 0.0))
    if hopper_cfg is not None:
        return flash_bwd_hopper.gluon_backward(dout, q, k, v, out, lse, softmax_scale=softmax_scale, softcap=softcap,
                                               alibi_slopes=alibi_slopes, dropout_p=dropout_p, rng_state=rng_state,
                                               window_left=window_left, window_right=window_right,
                                               bottom_right=bottom_right, fp32_grads=fp32_grads, config=hopper_cfg,
                                               cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    use_atomic = (ATOMIC_DQ if atomic_dq is None else atomic_dq) and not deterministic
    # delta is allocated dense and indexed with lse's strides: a strided lse view (a slice of a longer
    # sequence's lse, as ring attention takes) is copied once so both layouts agree.
    lse = lse.contiguous()
    head_dim = q.shape[-1]
    nheads_q, nheads_k = q.shape[-2], k.shape[-2]
    grad_dtype = torch.float32 if fp32_grads else q.dtype
    dq, dk, dv = (empty_packed(t.shape, grad_dtype, t.device, cu) for t, cu in
                  ((q, cu_seqlens_q), (k, cu_seqlens_k), (v, cu_seqlens_k)))
    # The fp32 dQ accumulator (shaped like q, contiguous); a dummy pointer on the deterministic path.
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if use_atomic else dq
    if is_varlen:
        batch = cu_seqlens_q.numel() - 1
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
        strides = [(0,) + t.stride() for t in (q, k, v, out, dout, dq, dk, dv, dq_acc)]
        lse_strides = (0, lse.stride(0))
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        strides = [t.stride() for t in (q, k, v, out, dout, dq, dk, dv, dq_acc)]
        lse_strides = (lse.stride(0), lse.stride(1))
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    q_s, k_s, v_s, o_s, do_s, dq_s, dk_s, dv_s, dqa_s = (s[:3] for s in strides)

    block_d = head_dim_block(head_dim)
    delta = torch.empty_like(lse)
    pre_block = 64
    _bwd_preprocess_kernel[(cdiv(seqlen_q, pre_block), batch * nheads_q)](
        out, dout, delta, lse, delta, delta, cu_seqlens_q if is_varlen else delta, *o_s, *do_s, *lse_strides,
        *lse_strides, 0, 0, 0, nheads_q, seqlen_q, seqlen_q, head_dim, IS_VARLEN=is_varlen, WRITE_LSE2=False,
        BLOCK_M=pre_block, BLOCK_D=block_d)

    opts = kernel_options(head_dim=head_dim, block_d=block_d, softmax_scale=softmax_scale,
                          window_left=window_left, window_right=window_right, bottom_right=bottom_right,
                          softcap=softcap, alibi_slopes=alibi_slopes, attn_bias=attn_bias,
                          dropout_p=dropout_p, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
                          cu_seqlens_k=cu_seqlens_k, dummy=dq)
    group = nheads_q // nheads_k
    if use_atomic:
        cfg = dict(config or atomic_backward_config(block_d, q.dtype, extras))
        stagger, heads_first = cfg.pop("STAGGER", False), cfg.pop("HEADS_FIRST", True)
        cfg.update(BLOCK_M2=cfg["BLOCK_M1"], BLOCK_N2=cfg["BLOCK_N1"])     # unused by this grid
        num_kv_blocks, num_q_blocks = cdiv(seqlen_k, cfg["BLOCK_N1"]), 0
        grid = (batch * nheads_k, num_kv_blocks) if heads_first else (num_kv_blocks, batch * nheads_k)
    else:
        large_smem = block_d > 128 and _large_smem(q.device)          # (only the wide head dims' tiles ask)
        cfg, stagger, heads_first = dict(config or backward_config(block_d, q.dtype, large_smem)), False, False
        num_kv_blocks = cdiv(seqlen_k, cfg["BLOCK_N1"])
        num_q_blocks = cdiv(seqlen_q, cfg["BLOCK_M2"])
        grid = (num_kv_blocks + group * num_q_blocks, batch * nheads_k)
    tma_dkdv, tma_dq = cfg.pop("TMA_DKDV", False), cfg.pop("TMA_DQ", False)
    if (tma_dkdv or tma_dq) and not _tma_applies(q, k, v, dout, head_dim, block_d, is_varlen):
        tma_dkdv = tma_dq = False         # the config asks for TMA where it cannot apply: pointer loads
    if (tma_dkdv or tma_dq) and not INTERPRET:
        ensure_tma_allocator()
    _flash_bwd_kernel[grid](
        q, k, v, dout, lse, delta, dq, dk, dv, dq_acc, *opts.pointers,
        *q_s, *k_s, *v_s, *do_s, *dq_s, *dk_s, *dv_s, *dqa_s, *lse_strides, *opts.strides,
        nheads_q, nheads_k, group, seqlen_q, seqlen_k, head_dim, num_kv_blocks, num_q_blocks,
        softmax_scale, *opts.scalars, **opts.flags, ATOMIC_DQ=use_atomic, STAGGER=stagger,
        HEADS_FIRST=heads_first, TMA_DKDV=tma_dkdv, TMA_DQ=tma_dq, **cfg)
    if use_atomic:
        _dq_convert_kernel[(cdiv(dq.numel(), _CONVERT_BLOCK),)](dq_acc, dq, dq.numel(), softmax_scale,
                                                                BLOCK=_CONVERT_BLOCK, num_warps=4)
    return dq, dk, dv
