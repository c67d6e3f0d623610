"""Pieces the FlashAttention forward and backward kernels share: sequence bounds, which key (or query)
blocks a tile must visit, the score function (scale, softcap, ALiBi, bias, masks), and the varlen outputs' rows
past the last sequence (fill_rows_past_sequences).

Scores live in the log2 domain inside the kernels (s2 = s * log2(e)) so the softmax uses exp2, one
multiply cheaper than exp. With x = q . k for query row i and key column j:

    s  = scale * x                          or  softcap * tanh(scale * x / softcap)
    s += -slope * |i + off - j|             (ALiBi)     s += bias[i, j]   (SDPA attn_mask)
    s  = -inf unless i + off - left <= j <= i + off + right   (causal is right = 0)

``off`` is seqlen_k - seqlen_q (bottom-right aligned diagonal, flash-attn) or 0 (top-left, torch SDPA).

Visiting blocks: for a query block [m0, m1] the visible key columns lie in [m0 + off - left,
m1 + off + right]. Key blocks wholly inside every row's window and inside seqlen_k need no mask; only
the few boundary blocks do. Kernels walk three phases, ``[lo, full_lo)`` masked, ``[full_lo, full_hi)``
unmasked, ``[full_hi, hi)`` masked, so the steady-state loop carries no masking work.
"""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .._triton import Launch, LaunchCache, PlanCache, cdiv, launch_device, tanh

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def seq_bounds(p_cu_seqlens, i_b, seqlen, IS_VARLEN: tl.constexpr):
    """(start row, length) of sequence i_b: packed by cu_seqlens, or one batch entry of ``seqlen`` rows."""
    if IS_VARLEN:
        start = tl.load(p_cu_seqlens + i_b)
        end = tl.load(p_cu_seqlens + i_b + 1)
        return start.to(tl.int64), end - start            # int64 start: start * stride may pass 2^31
    else:
        return 0, seqlen


@triton.jit
def key_block_phases(m0, seqlen_q, seqlen_k, window_left, window_right,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
                     HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr):
    """Key-block phases for the query block starting at m0 (every division below is of a non-negative
    number: Triton's integer division truncates toward zero, Python's floors): (lo, full_lo, full_hi, hi), block aligned
    except hi (= the last visible column + 1). Masked: [lo, full_lo) and [full_hi, hi)."""
    off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    m1 = tl.minimum(m0 + BLOCK_M, seqlen_q) - 1            # last real row of the block
    lo = 0
    full_lo = 0
    hi = seqlen_k
    full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo = tl.maximum(m0 + off - window_left, 0) // BLOCK_N * BLOCK_N
        full_lo = tl.maximum(tl.cdiv(tl.maximum(m1 + off - window_left, 0), BLOCK_N) * BLOCK_N, lo)
    if HAS_RIGHT:
        hi = tl.maximum(tl.minimum(m1 + off + window_right + 1, seqlen_k), 0)
        full_hi = tl.minimum(tl.maximum(m0 + off + window_right + 1, 0) // BLOCK_N * BLOCK_N, full_hi)
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_block_phases(n0, seqlen_q, seqlen_k, window_left, window_right,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
                       HAS_RIGHT: tl.constexpr, BOTTOM_RIGHT: tl.constexpr):
    """The transpose of key_block_phases: query-block phases (lo, full_lo, full_hi, hi) that see the key
    block starting at n0. Row i sees column j when j - off - right <= i <= j - off + left."""
    off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    n1 = tl.minimum(n0 + BLOCK_N, seqlen_k) - 1
    lo = 0
    full_lo = 0
    hi = seqlen_q
    full_hi = (seqlen_q // BLOCK_M) * BLOCK_M
    if HAS_RIGHT:
        lo = tl.maximum(n0 - off - window_right, 0) // BLOCK_M * BLOCK_M
        full_lo = tl.maximum(tl.cdiv(tl.maximum(n1 - off - window_right, 0), BLOCK_M) * BLOCK_M, lo)
    if HAS_LEFT:
        hi = tl.maximum(tl.minimum(n1 - off + window_left + 1, seqlen_q), 0)
        full_hi = tl.minimum(tl.maximum(n0 - off + window_left + 1, 0) // BLOCK_M * BLOCK_M, full_hi)
    # Key columns past seqlen_k: a block holding them is masked whatever the window says.
    if n0 + BLOCK_N > seqlen_k:
        full_lo = hi
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def score_mod(qk, rows, cols, seqlen_q, seqlen_k, window_left, window_right, qk_scale, softcap_scale,
              softcap_log2, alibi_slope_log2, p_bias, stride_bias_m, stride_bias_n,
              MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
              BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_BIAS: tl.constexpr):
    """Scores in the log2 domain from raw dot products qk, for query indices ``rows`` and key indices
    ``cols`` (broadcastable: [M, 1] x [1, N], or [1, M] x [N, 1] for a transposed tile).

    Returns (s2, tanh_term): tanh_term = tanh(scale * qk / softcap) when HAS_SOFTCAP (the backward needs
    1 - tanh^2), else s2 again (unused).
    """
    if HAS_SOFTCAP:
        t = tanh(qk * softcap_scale)
        s2 = t * softcap_log2
    else:
        s2 = qk * qk_scale
        t = s2
    off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
    if HAS_ALIBI:
        dist = (rows + off - cols).to(tl.float32)
        s2 -= alibi_slope_log2 * tl.abs(dist)
    if HAS_BIAS:
        m_bias = (rows < seqlen_q) & (cols < seqlen_k)
        bias = tl.load(p_bias + rows * stride_bias_m + cols * stride_bias_n, mask=m_bias, other=0.0)
        s2 += bias.to(tl.float32) * LOG2E
    if MASKED:
        visible = cols < seqlen_k
        if HAS_LEFT:
            visible &= cols >= rows + off - window_left
        if HAS_RIGHT:
            visible &= cols <= rows + off + window_right
        s2 = tl.where(visible, s2, float("-inf"))
    return s2, t


# ----------------------------------------------------------------------------------------------------
# Host side: the arguments every FlashAttention kernel takes beyond its tensors' strides
# ----------------------------------------------------------------------------------------------------

class KernelOptions(NamedTuple):
    """Launch arguments shared by the forward and backward kernels, in their parameter order."""
    pointers: tuple       # cu_seqlens_q, cu_seqlens_k, alibi_slopes, attn_bias, rng_state (or a dummy)
    strides: tuple        # stride_alibi_b, stride_bias_b/h/m/n
    scalars: tuple        # qk_scale, softcap_scale, softcap_log2, window_left, window_right, dropout_p
    flags: dict           # the HAS_/IS_ constexprs, BLOCK_D and EVEN_D


def alibi_batch_stride(alibi_slopes) -> int:
    """The batch stride of ALiBi slopes (nheads,) (one slope per head: 0) or (batch, nheads) (last dim contiguous)."""
    return alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0


def score_scales(softmax_scale: float, softcap: float) -> tuple[float, float]:
    """(qk_scale, softcap_scale) of the Hopper kernels' scores qk_scale * x, or qk_scale * tanh(softcap_scale * x)
    under a softcap (> 0): the log2-domain scale and the tanh's argument scale (kernel_options' values)."""
    log2e = math.log2(math.e)
    if softcap > 0.0:
        return softcap * log2e, softmax_scale / softcap
    return softmax_scale * log2e, 0.0


def kernel_options(*, head_dim, block_d, softmax_scale, window_left, window_right, bottom_right, softcap,
                   alibi_slopes, attn_bias, dropout_p, rng_state, cu_seqlens_q, cu_seqlens_k, dummy):
    """Absent optional tensors become ``dummy`` (never read: their HAS_ flag is off); scalars are
    pre-folded into the log2 domain the kernels work in."""
    is_varlen = cu_seqlens_q is not None
    has_alibi, has_bias = alibi_slopes is not None, attn_bias is not None
    has_dropout, has_softcap = dropout_p > 0.0, softcap > 0.0
    log2e = math.log2(math.e)
    return KernelOptions(
        pointers=(cu_seqlens_q if is_varlen else dummy, cu_seqlens_k if is_varlen else dummy,
                  alibi_slopes if has_alibi else dummy, attn_bias if has_bias else dummy,
                  rng_state if has_dropout else dummy),
        strides=(alibi_batch_stride(alibi_slopes) if has_alibi else 0,
                 *(attn_bias.stride() if has_bias else (0, 0, 0, 0))),
        scalars=(softmax_scale * log2e, (softmax_scale / softcap) if has_softcap else 0.0, softcap * log2e,
                 window_left, window_right, float(dropout_p)),
        flags=dict(IS_VARLEN=is_varlen, HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
                   BOTTOM_RIGHT=bottom_right, HAS_SOFTCAP=has_softcap, HAS_ALIBI=has_alibi,
                   HAS_BIAS=has_bias, HAS_DROPOUT=has_dropout, BLOCK_D=block_d,
                   EVEN_D=block_d == head_dim),
    )


# ----------------------------------------------------------------------------------------------------
# Varlen: the rows past the last sequence
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _fill_rows_past_kernel(p_t, p_cu_seqlens, nseq, rows, row_elems, stride_outer, value, BLOCK: tl.constexpr):
    """t[o, r, :] = value for every row r >= cu_seqlens[nseq] of t viewed as [outer, rows, row_elems], each outer
    slice contiguous. The bound is read on the device (no host sync; CUDA-graph capturable), so the grid is fixed and
    its programs stride over the tail, which is usually empty."""
    pid, o = tl.program_id(0), tl.program_id(1)
    start = tl.load(p_cu_seqlens + nseq).to(tl.int64) * row_elems
    end = tl.cast(rows, tl.int64) * row_elems
    p_t += tl.cast(o, tl.int64) * stride_outer
    for first in range(start + pid * BLOCK, end, tl.num_programs(0) * BLOCK):
        offs = first + tl.arange(0, BLOCK)
        tl.store(p_t + offs, tl.full([BLOCK], value, p_t.dtype.element_ty), mask=offs < end)


_FILL_BLOCK = 1024
_launch_fill = LaunchCache(_fill_rows_past_kernel)
_FILL_PLANS = PlanCache()


def empty_packed(shape, dtype, device, cu_seqlens=None, value: float = 0.0, row_dim: int = 0):
    """torch.empty for a kernel's output; varlen (cu_seqlens given): with the rows past cu_seqlens[-1] set to
    ``value`` (fill_rows_past_sequences). No kernel writes those rows, so they are filled before it runs."""
    t = torch.empty(shape, dtype=dtype, device=device)
    return t if cu_seqlens is None else fill_rows_past_sequences(t, cu_seqlens, value, row_dim)


def fill_rows_past_sequences(t, cu_seqlens, value: float = 0.0, row_dim: int = 0):
    """Varlen outputs (out, lse, dq, dk, dv): the rows of t along row_dim past cu_seqlens[-1] (in no sequence: a
    packed buffer longer than its sequences, as static-shape training pads them) set to ``value``, where torch.empty
    left whatever was in memory. t contiguous (rows along dim 0 or, lse (heads, total), 1)."""
    outer, rows = (1, t.shape[0]) if row_dim == 0 else (t.shape[0], t.shape[1])
    if t.numel() == 0:
        return t
    row_elems = t.numel() // (outer * rows)
    key = (t.shape, t.dtype, row_dim, cu_seqlens.numel(), launch_device())
    launch = _FILL_PLANS.get(key, lambda: Launch(
        _launch_fill, (min(cdiv(rows * row_elems, _FILL_BLOCK), 16), outer), BLOCK=_FILL_BLOCK, num_warps=4))
    launch(t, cu_seqlens, cu_seqlens.numel() - 1, rows, row_elems, t.stride(0) if row_dim else 0, value)
    return t
