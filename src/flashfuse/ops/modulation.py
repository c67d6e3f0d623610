"""Adaptive LayerNorm (DiT's adaLN-Zero modulation) and its gated residual; forward and backward.

DiT-style blocks (diffusers' AdaLayerNormZero / BasicTransformerBlock with norm_type="ada_norm_zero",
SD3, Flux, PixArt) modulate a non-affine LayerNorm with per-sample vectors from the timestep embedding,
and add each branch's output back through a per-sample gate:

    y   = LN(x) * (1 + scale) + shift        ada_layer_norm(x, scale, shift, eps)
    out = residual + gate * y                ada_layer_norm_gate(residual, gate, y)

Eager PyTorch runs LN, the add, the multiply and the add as four passes over the (B, T, D) activations
(five for the gate with its two ops and the intermediates); each kernel here reads every input once and
writes every output once.

Layers: kernels -> launchers (``ada_layer_norm_forward`` ...) -> torch.library ops
``flashfuse::ada_layer_norm_fwd`` / ``_bwd`` and ``flashfuse::ada_layer_norm_gate_fwd`` / ``_bwd`` through
``FlashfuseOp`` (torch.compile sees one op; eager calls skip the dispatcher) -> public functions, and two
diffusers drop-ins (``layer_norm_modulate``, ``ada_layer_norm_zero_forward``).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import cdiv, next_power_of_2, sm_count

# Largest column block one program holds in registers (the forward keeps x in fp32 and loads scale /
# shift next to it; the backward keeps x, dy, 1 + scale and the two fp32 accumulators), as in
# flashfuse.ops.norm whose limits were measured with ptxas on sm_90 (no spills). Wider rows loop over
# column blocks (second read of the row, which the program finds in L2).
MAX_BLOCK_N_FWD = 16384
MAX_BLOCK_N_BWD = 8192
# Short rows are packed BLOCK_M to a program so a program moves ~4096 elements (8 KiB of bf16): enough
# bytes in flight per program without a grid of 10^6 tiny programs (same figure as flashfuse.ops.norm).
TILE_ELEMENTS = 4096
# One warp per 512 elements of a tile = 16 per thread, two 16-byte vectors of bf16; at most 16 warps.
ELEMENTS_PER_WARP, MAX_WARPS = 512, 16
# Backward programs per SM, counted in warps (as flashfuse.ops.norm: one resident program per SM plus
# queued ones that even out the tail). Each program writes one fp32 partial row of dscale / dshift.
BWD_WARPS_PER_SM = 64
INTERPRETER_BWD_PROGRAMS = 4


# ----------------------------------------------------------------------------------------------------
# Kernels
#
# One row x of D columns, token t of sample b; sc = scale[b], sh = shift[b] (D-vectors):
#     mu = mean(x),  rstd = 1 / sqrt(mean((x - mu)^2) + eps),  x_hat = (x - mu) * rstd
#     y = x_hat * (1 + sc) + sh
# Backward with dy = dL/dy and g = dy * (1 + sc) (the gradient reaching x_hat), means over D:
#     dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))       (the LayerNorm VJP)
#     dscale[b] = sum over t of dy * x_hat,    dshift[b] = sum over t of dy
# Gate: out = r + gate[b] * y;  dr = dout,  dy = dout * gate[b],  dgate[b] = sum over t of dout * y.
# The sums over t are deterministic: a program owns a run of tokens of one sample, sums them in registers
# and writes one fp32 partial row; torch sums the few partial rows afterwards (no atomics).
# The forward saves only mu and rstd (8 bytes per row) and the backward recomputes x_hat from x.
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _modulate_store(x_hat, P_SC, P_SH, P_Y, o_n, mask):
    """y = x_hat * (1 + sc) + sh for a [BLOCK_M, BLOCK_N] block; P_*: [BLOCK_M] row pointers."""
    sc = tl.load(P_SC[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(P_SH[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    y = x_hat * (1.0 + sc) + sh
    tl.store(P_Y[:, None] + o_n[None, :], y.to(P_Y.dtype.element_ty), mask=mask)


@triton.jit
def _ada_ln_fwd_kernel(
    X, SCALE, SHIFT, Y, MEAN, RSTD,  # X: [B, T, D]; SCALE, SHIFT: [B or 1, D]; Y: [B*T, D]; MEAN, RSTD: [B*T]
    n_rows, seqlen, n_cols,
    stride_x_b, stride_x_t, stride_scale_b, stride_shift_b, stride_y_row,
    eps,
    ONE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program modulates BLOCK_M rows (tokens, possibly of several samples). ONE_BLOCK (D <= BLOCK_N):
    one read of x and one write of y. Otherwise a statistics pass and a normalize pass over column blocks."""
    i_m = tl.program_id(0).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M] flat rows
    m_m = o_m < n_rows
    o_b = o_m // seqlen                                                        # sample of each row
    o_t = o_m - o_b * seqlen                                                   # token of each row
    p_x = X + o_b * stride_x_b + o_t * stride_x_t                              # [BLOCK_M] row pointers
    p_sc = SCALE + o_b * stride_scale_b
    p_sh = SHIFT + o_b * stride_shift_b
    p_y = Y + o_m * stride_y_row
    o_n = tl.arange(0, BLOCK_N)                                                # [BLOCK_N]
    if ONE_BLOCK:
        mask = m_m[:, None] & (o_n < n_cols)[None, :]
        x = tl.load(p_x[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        d = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.math.rsqrt(tl.sum(d * d, axis=1) / n_cols + eps)
        _modulate_store(d * rstd[:, None], p_sc, p_sh, p_y, o_n, mask)
    else:
        # Chan's pairwise update merges each block's (count n_b, mean mean_b, squared deviations m2_b)
        # into the running (start, mean, m2): no cancellation, unlike E[x^2] - mu^2.
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = m_m[:, None] & (start + o_n < n_cols)[None, :]
            x = tl.load(p_x[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
            n_b = tl.minimum(n_cols - start, BLOCK_N).to(tl.float32)
            mean_b = tl.sum(x, axis=1) / n_b
            d = tl.where(mask, x - mean_b[:, None], 0.0)
            frac = n_b / (start + n_b)
            delta = mean_b - mean
            mean += delta * frac
            m2 += tl.sum(d * d, axis=1) + delta * delta * start * frac
        rstd = tl.math.rsqrt(m2 / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            mask = m_m[:, None] & (start + o_n < n_cols)[None, :]
            x = tl.load(p_x[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
            x_hat = (x - mean[:, None]) * rstd[:, None]
            _modulate_store(x_hat, p_sc + start, p_sh + start, p_y + start, o_n, mask)
    tl.store(MEAN + o_m, mean, mask=m_m)
    tl.store(RSTD + o_m, rstd, mask=m_m)


@triton.jit
def _ada_ln_bwd_kernel(
    DY, X, SCALE, MEAN, RSTD, DX, DSC_PART, DSH_PART,  # DY, X: [B, T, D]; DX: [B*T, D]; *_PART: [C, B, D] fp32
    seqlen, n_cols, rows_per_program,
    stride_dy_b, stride_dy_t, stride_x_b, stride_x_t, stride_scale_b, stride_dx_row,
    stride_part_c, stride_part_b,
    ONE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (b, c) handles tokens [c * rows_per_program, ...) of sample b, BLOCK_M at a time, and writes
    row (c, b) of the dscale / dshift partials. Not ONE_BLOCK (D > BLOCK_N): per row block, a pass for the
    row sums mean(g), mean(g x_hat), then a pass writing dx and adding into the partial rows it owns."""
    i_b = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1).to(tl.int64)
    t_start = i_c * rows_per_program
    t_end = tl.minimum(t_start + rows_per_program, seqlen)
    o_n = tl.arange(0, BLOCK_N)                                                # [BLOCK_N]
    p_sc = SCALE + i_b * stride_scale_b
    p_dsc = DSC_PART + i_c * stride_part_c + i_b * stride_part_b
    p_dsh = DSH_PART + i_c * stride_part_c + i_b * stride_part_b
    if ONE_BLOCK:
        m_n = o_n < n_cols
        w = 1.0 + tl.load(p_sc + o_n, mask=m_n, other=0.0).to(tl.float32)    # [BLOCK_N]
        acc_sc = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_sh = tl.zeros([BLOCK_N], dtype=tl.float32)
        for t0 in range(t_start, t_end, BLOCK_M):
            o_t = t0 + tl.arange(0, BLOCK_M)                                   # [BLOCK_M]
            m_t = o_t < t_end
            mask = m_t[:, None] & m_n[None, :]
            x = tl.load(X + i_b * stride_x_b + o_t[:, None] * stride_x_t + o_n[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            dy = tl.load(DY + i_b * stride_dy_b + o_t[:, None] * stride_dy_t + o_n[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            mean = tl.load(MEAN + i_b * seqlen + o_t, mask=m_t, other=0.0)
            rstd = tl.load(RSTD + i_b * seqlen + o_t, mask=m_t, other=0.0)
            x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            g = dy * w[None, :]
            c1 = tl.sum(g, axis=1) / n_cols
            c2 = tl.sum(g * x_hat, axis=1) / n_cols
            dx = rstd[:, None] * (g - c1[:, None] - x_hat * c2[:, None])
            tl.store(DX + (i_b * seqlen + o_t[:, None]) * stride_dx_row + o_n[None, :],
                     dx.to(DX.dtype.element_ty), mask=mask)
            acc_sc += tl.sum(dy * x_hat, axis=0)
            acc_sh += tl.sum(dy, axis=0)
        tl.store(p_dsc + o_n, acc_sc, mask=m_n)
        tl.store(p_dsh + o_n, acc_sh, mask=m_n)
    else:
        for t0 in range(t_start, t_end, BLOCK_M):
            o_t = t0 + tl.arange(0, BLOCK_M)
            m_t = o_t < t_end
            p_x = X + i_b * stride_x_b + o_t * stride_x_t                      # [BLOCK_M]
            p_dy = DY + i_b * stride_dy_b + o_t * stride_dy_t
            p_dx = DX + (i_b * seqlen + o_t) * stride_dx_row
            mean = tl.load(MEAN + i_b * seqlen + o_t, mask=m_t, other=0.0)
            rstd = tl.load(RSTD + i_b * seqlen + o_t, mask=m_t, other=0.0)
            c1 = tl.zeros([BLOCK_M], dtype=tl.float32)
            c2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                m_n = start + o_n < n_cols
                mask = m_t[:, None] & m_n[None, :]
                x = tl.load(p_x[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(p_dy[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
                w = 1.0 + tl.load(p_sc + start + o_n, mask=m_n, other=0.0).to(tl.float32)
                x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
                g = dy * w[None, :]
                c1 += tl.sum(g, axis=1)
                c2 += tl.sum(g * x_hat, axis=1)
            c1 = c1 / n_cols
            c2 = c2 / n_cols
            for start in range(0, n_cols, BLOCK_N):
                m_n = start + o_n < n_cols
                mask = m_t[:, None] & m_n[None, :]
                x = tl.load(p_x[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(p_dy[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
                w = 1.0 + tl.load(p_sc + start + o_n, mask=m_n, other=0.0).to(tl.float32)
                x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
                dx = rstd[:, None] * (dy * w[None, :] - c1[:, None] - x_hat * c2[:, None])
                tl.store(p_dx[:, None] + (start + o_n)[None, :], dx.to(DX.dtype.element_ty), mask=mask)
                # The partial rows belong to this program: the first row block stores, later ones add.
                m_prev = start + o_n < tl.where(t0 > t_start, n_cols, 0)       # m_n, or none at first
                prev_sc = tl.load(p_dsc + start + o_n, mask=m_prev, other=0.0)
                prev_sh = tl.load(p_dsh + start + o_n, mask=m_prev, other=0.0)
                tl.store(p_dsc + start + o_n, prev_sc + tl.sum(dy * x_hat, axis=0), mask=m_n)
                tl.store(p_dsh + start + o_n, prev_sh + tl.sum(dy, axis=0), mask=m_n)
            # Threads holding replicas of one partial element must not read it for the next row block
            # before every replica of this one is stored.
            tl.debug_barrier()


@triton.jit
def _gate_fwd_kernel(
    R, GATE, Y, OUT,  # R, Y: [B, T, D]; GATE: [B or 1, D]; OUT: [B*T, D]
    n_rows, seqlen, n_cols,
    stride_r_b, stride_r_t, stride_gate_b, stride_y_b, stride_y_t, stride_out_row,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out = r + gate[b] * y for a [BLOCK_M, BLOCK_N] tile (elementwise, fp32 arithmetic, one rounding)."""
    i_m = tl.program_id(0).to(tl.int64)
    i_n = tl.program_id(1).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M]
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    o_b = o_m // seqlen
    o_t = o_m - o_b * seqlen
    mask = (o_m < n_rows)[:, None] & (o_n < n_cols)[None, :]
    r = tl.load(R + (o_b * stride_r_b + o_t * stride_r_t)[:, None] + o_n[None, :], mask=mask, other=0.0)
    y = tl.load(Y + (o_b * stride_y_b + o_t * stride_y_t)[:, None] + o_n[None, :], mask=mask, other=0.0)
    gate = tl.load(GATE + (o_b * stride_gate_b)[:, None] + o_n[None, :], mask=mask, other=0.0)
    out = r.to(tl.float32) + gate.to(tl.float32) * y.to(tl.float32)
    tl.store(OUT + o_m[:, None] * stride_out_row + o_n[None, :], out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _gate_bwd_kernel(
    DOUT, GATE, Y, DY, DGATE_PART,  # DOUT, Y: [B, T, D]; DY: [B*T, D]; DGATE_PART: [C, B, D] fp32
    seqlen, n_cols, rows_per_program,
    stride_dout_b, stride_dout_t, stride_gate_b, stride_y_b, stride_y_t, stride_dy_row,
    stride_part_c, stride_part_b,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (b, c, n): tokens [c * rows_per_program, ...) of sample b, columns block n: dy = dout * gate,
    and the partial row (c, b) of dgate = sum over those tokens of dout * y."""
    i_b = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1).to(tl.int64)
    i_n = tl.program_id(2).to(tl.int64)
    t_start = i_c * rows_per_program
    t_end = tl.minimum(t_start + rows_per_program, seqlen)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    m_n = o_n < n_cols
    gate = tl.load(GATE + i_b * stride_gate_b + o_n, mask=m_n, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for t0 in range(t_start, t_end, BLOCK_M):
        o_t = t0 + tl.arange(0, BLOCK_M)                                       # [BLOCK_M]
        mask = (o_t < t_end)[:, None] & m_n[None, :]
        dout = tl.load(DOUT + i_b * stride_dout_b + o_t[:, None] * stride_dout_t + o_n[None, :], mask=mask,
                       other=0.0).to(tl.float32)
        y = tl.load(Y + i_b * stride_y_b + o_t[:, None] * stride_y_t + o_n[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        tl.store(DY + (i_b * seqlen + o_t[:, None]) * stride_dy_row + o_n[None, :],
                 (dout * gate[None, :]).to(DY.dtype.element_ty), mask=mask)
        acc += tl.sum(dout * y, axis=0)
    tl.store(DGATE_PART + i_c * stride_part_c + i_b * stride_part_b + o_n, acc, mask=m_n)


# ----------------------------------------------------------------------------------------------------
# Launchers: x, dy, residual (B, T, D) and scale, shift, gate (B or 1, D), any strides with a contiguous
# last dim; outputs are contiguous (B, T, D)
# ----------------------------------------------------------------------------------------------------

def _alloc(shape, dtype, device) -> Tensor:
    """Every buffer a kernel writes comes from here (tests fill it with NaN instead)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _row_config(n_rows: int, n_cols: int, max_block_n: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): block = next_pow2(D) up to the cap, rows per program so a program
    holds ~TILE_ELEMENTS, warps from the tile size."""
    block_n = min(next_power_of_2(n_cols), max_block_n)
    block_m = max(1, min(TILE_ELEMENTS // block_n, next_power_of_2(n_rows)))
    num_warps = min(MAX_WARPS, max(1, block_m * block_n // ELEMENTS_PER_WARP))
    return block_m, block_n, num_warps


def _token_chunks(device: torch.device, n_batch: int, seqlen: int, block_m: int, num_warps: int,
                  n_col_blocks: int = 1) -> tuple[int, int]:
    """(n_chunks, rows_per_program): split each sample's tokens so the backward grid fills the GPU; a
    multiple of BLOCK_M tokens per program."""
    if device.type == "cuda":
        target = sm_count(device) * max(1, BWD_WARPS_PER_SM // num_warps)
    else:
        target = INTERPRETER_BWD_PROGRAMS
    n_chunks = min(cdiv(seqlen, block_m), max(1, target // max(1, n_batch * n_col_blocks)))
    rows = max(1, cdiv(cdiv(seqlen, max(n_chunks, 1)), block_m)) * block_m
    return cdiv(seqlen, rows), rows


def _reduce_partials(part: Tensor, n_param_batch: int, dtype: torch.dtype) -> Tensor:
    """[C, B, D] fp32 partial rows -> [B, D] (or [1, D] for a parameter broadcast over the batch)."""
    total = part.sum(0)
    if n_param_batch == 1:
        total = total.sum(0, keepdim=True)
    return total.to(dtype)


def ada_layer_norm_forward(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6):
    """Returns (y (B, T, D) contiguous, dtype promote(x, scale, shift); mean, rstd (B*T,) fp32)."""
    n_batch, seqlen, n_cols = x.shape
    n_rows = n_batch * seqlen
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, scale.dtype), shift.dtype)
    y = _alloc((n_batch, seqlen, n_cols), out_dtype, x.device)
    mean = _alloc(n_rows, torch.float32, x.device)
    rstd = _alloc(n_rows, torch.float32, x.device)
    if n_rows == 0:
        return y, mean, rstd
    block_m, block_n, num_warps = _row_config(n_rows, n_cols, MAX_BLOCK_N_FWD)
    _ada_ln_fwd_kernel[(cdiv(n_rows, block_m),)](
        x, scale, shift, y, mean, rstd, n_rows, seqlen, n_cols,
        x.stride(0), x.stride(1), scale.stride(0) if scale.shape[0] > 1 else 0,
        shift.stride(0) if shift.shape[0] > 1 else 0, n_cols, float(eps),
        ONE_BLOCK=n_cols <= block_n, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y, mean, rstd


def ada_layer_norm_backward(dy: Tensor, x: Tensor, scale: Tensor, shift_dtype: torch.dtype, n_shift_batch: int,
                            mean: Tensor, rstd: Tensor):
    """Returns (dx like x, dscale like scale, dshift (n_shift_batch, D) of shift_dtype)."""
    n_batch, seqlen, n_cols = x.shape
    dx = _alloc((n_batch, seqlen, n_cols), x.dtype, x.device)
    block_m, block_n, num_warps = _row_config(seqlen, n_cols, MAX_BLOCK_N_BWD)
    n_chunks, rows = _token_chunks(x.device, n_batch, seqlen, block_m, num_warps)
    n_chunks = n_chunks if n_batch > 0 else 0
    dsc_part = _alloc((n_chunks, n_batch, n_cols), torch.float32, x.device)
    dsh_part = _alloc((n_chunks, n_batch, n_cols), torch.float32, x.device)
    if n_chunks > 0:
        _ada_ln_bwd_kernel[(n_batch, n_chunks)](
            dy, x, scale, mean, rstd, dx, dsc_part, dsh_part, seqlen, n_cols, rows,
            dy.stride(0), dy.stride(1), x.stride(0), x.stride(1), scale.stride(0) if scale.shape[0] > 1 else 0,
            n_cols, dsc_part.stride(0), dsc_part.stride(1),
            ONE_BLOCK=n_cols <= block_n, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return (dx, _reduce_partials(dsc_part, scale.shape[0], scale.dtype),
            _reduce_partials(dsh_part, n_shift_batch, shift_dtype))


def ada_layer_norm_gate_forward(residual: Tensor, gate: Tensor, y: Tensor) -> Tensor:
    """Returns residual + gate * y, (B, T, D) contiguous, dtype promote(residual, gate, y)."""
    n_batch, seqlen, n_cols = residual.shape
    n_rows = n_batch * seqlen
    out_dtype = torch.promote_types(torch.promote_types(residual.dtype, gate.dtype), y.dtype)
    out = _alloc((n_batch, seqlen, n_cols), out_dtype, residual.device)
    if n_rows == 0:
        return out
    block_m, block_n, num_warps = _elementwise_config(n_rows, n_cols)
    _gate_fwd_kernel[(cdiv(n_rows, block_m), cdiv(n_cols, block_n))](
        residual, gate, y, out, n_rows, seqlen, n_cols,
        residual.stride(0), residual.stride(1), gate.stride(0) if gate.shape[0] > 1 else 0,
        y.stride(0), y.stride(1), n_cols,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return out


def ada_layer_norm_gate_backward(dout: Tensor, gate: Tensor, y: Tensor):
    """Returns (dy like y, dgate like gate); dresidual is dout itself."""
    n_batch, seqlen, n_cols = y.shape
    dy = _alloc((n_batch, seqlen, n_cols), y.dtype, y.device)
    block_m, block_n, num_warps = _elementwise_config(seqlen, n_cols)
    n_col_blocks = cdiv(n_cols, block_n)
    n_chunks, rows = _token_chunks(y.device, n_batch, seqlen, block_m, num_warps, n_col_blocks)
    n_chunks = n_chunks if n_batch > 0 else 0
    part = _alloc((n_chunks, n_batch, n_cols), torch.float32, y.device)
    if n_chunks > 0:
        _gate_bwd_kernel[(n_batch, n_chunks, n_col_blocks)](
            dout, gate, y, dy, part, seqlen, n_cols, rows,
            dout.stride(0), dout.stride(1), gate.stride(0) if gate.shape[0] > 1 else 0,
            y.stride(0), y.stride(1), n_cols, part.stride(0), part.stride(1),
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return dy, _reduce_partials(part, gate.shape[0], gate.dtype)


# Elementwise tiles: at most 1024 columns (a warp's 32 threads x 8 bf16 x 4 vectors), ~4096 elements per
# program, warps from the tile as in the row kernels (8 warps: 16 elements of each input per thread; on
# 4 warps ptxas sm_90 needs 255 registers and spills for short rows, whose per-row indices add up).
GATE_MAX_BLOCK_N = 1024


def _elementwise_config(n_rows: int, n_cols: int) -> tuple[int, int, int]:
    block_n = min(next_power_of_2(n_cols), GATE_MAX_BLOCK_N)
    block_m = max(1, min(TILE_ELEMENTS // block_n, next_power_of_2(n_rows)))
    return block_m, block_n, min(MAX_WARPS, max(1, block_m * block_n // ELEMENTS_PER_WARP))


# ----------------------------------------------------------------------------------------------------
# torch.library ops (scale / shift / gate arrive as 2-D (B or 1, D) views)
# ----------------------------------------------------------------------------------------------------

def _ada_ln_fwd_impl(x: Tensor, scale: Tensor, shift: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return ada_layer_norm_forward(x, scale, shift, eps)


def _ada_ln_fwd_fake(x, scale, shift, eps):
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, scale.dtype), shift.dtype)
    stat = x.new_empty(x.shape[0] * x.shape[1], dtype=torch.float32)
    return x.new_empty(x.shape, dtype=out_dtype), stat, stat.new_empty(stat.shape)


def _ada_ln_bwd_impl(dy: Tensor, x: Tensor, scale: Tensor, shift_like: Tensor, mean: Tensor,
                     rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # shift_like: an empty (n_shift_batch, 0) tensor of shift's dtype (only its dtype and batch matter)
    return ada_layer_norm_backward(dy, x, scale, shift_like.dtype, shift_like.shape[0], mean, rstd)


def _ada_ln_bwd_fake(dy, x, scale, shift_like, mean, rstd):
    return (x.new_empty(x.shape), scale.new_empty(scale.shape),
            shift_like.new_empty((shift_like.shape[0], x.shape[2])))


def _ada_ln_setup_context(ctx, inputs, output):
    x, scale, shift, _eps = inputs
    _y, mean, rstd = output
    ctx.save_for_backward(x, scale, shift.new_empty((shift.shape[0], 0)), mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _ada_ln_backward(ctx, dy, _dmean, _drstd):
    x, scale, shift_like, mean, rstd = ctx.saved_tensors
    dx, dscale, dshift = _ada_ln_bwd(last_dim_contiguous(dy), x, scale, shift_like, mean, rstd)
    return dx, dscale, dshift, None


_ada_ln_bwd = FlashfuseOp("flashfuse::ada_layer_norm_bwd", _ada_ln_bwd_impl, fake=_ada_ln_bwd_fake)
_ada_ln_fwd = FlashfuseOp("flashfuse::ada_layer_norm_fwd", _ada_ln_fwd_impl, fake=_ada_ln_fwd_fake,
                          setup_context=_ada_ln_setup_context, backward=_ada_ln_backward)


def _gate_fwd_impl(residual: Tensor, gate: Tensor, y: Tensor) -> Tensor:
    return ada_layer_norm_gate_forward(residual, gate, y)


def _gate_fwd_fake(residual, gate, y):
    out_dtype = torch.promote_types(torch.promote_types(residual.dtype, gate.dtype), y.dtype)
    return residual.new_empty(residual.shape, dtype=out_dtype)


def _gate_bwd_impl(dout: Tensor, gate: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return ada_layer_norm_gate_backward(dout, gate, y)


def _gate_bwd_fake(dout, gate, y):
    return y.new_empty(y.shape), gate.new_empty(gate.shape)


def _gate_setup_context(ctx, inputs, output):
    residual, gate, y = inputs
    ctx.residual_dtype = residual.dtype
    ctx.save_for_backward(gate, y)


def _gate_backward(ctx, dout):
    gate, y = ctx.saved_tensors
    dout = last_dim_contiguous(dout)
    dy, dgate = _gate_bwd(dout, gate, y)
    return dout.to(ctx.residual_dtype), dgate, dy


_gate_bwd = FlashfuseOp("flashfuse::ada_layer_norm_gate_bwd", _gate_bwd_impl, fake=_gate_bwd_fake)
_gate_fwd = FlashfuseOp("flashfuse::ada_layer_norm_gate_fwd", _gate_fwd_impl, fake=_gate_fwd_fake,
                        setup_context=_gate_setup_context, backward=_gate_backward)


# ----------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------

def _per_sample(name: str, v, x: Tensor, x_name: str) -> Tensor:
    """Validate a (B, D) / (B, 1, D) modulation vector (B may be 1) and return a 2-D view, strides kept."""
    check_tensor(name, v, ndims=(2, 3))
    check_same((x_name, name), (x, v), dtype=False)
    n_batch, _, n_cols = x.shape
    ok = v.shape[0] in (1, n_batch) and v.shape[-1] == n_cols and (v.dim() == 2 or v.shape[1] == 1)
    if not ok:
        raise ValueError(f"{name} has shape {tuple(v.shape)}; expected ({n_batch}, {n_cols}) or "
                         f"({n_batch}, 1, {n_cols}) for {x_name} of shape {tuple(x.shape)} (batch may be 1)")
    return last_dim_contiguous(v if v.dim() == 2 else v[:, 0, :])


def _tokens(name: str, t) -> Tensor:
    check_tensor(name, t, ndims=(3,))
    if t.shape[-1] == 0:
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected (batch, tokens, dim) with dim >= 1")
    return last_dim_contiguous(t)


def ada_layer_norm(x, scale, shift, eps=1e-6):
    """Adaptive LayerNorm (DiT adaLN / adaLN-Zero modulation): ``LN(x) * (1 + scale) + shift``, with a
    LayerNorm without weight and bias over the last dim; differentiable in x, scale and shift (Triton
    forward and backward; dscale, dshift are deterministic sums over the tokens).

    Shapes: x (batch, tokens, dim), any strides with a contiguous last dim; scale, shift (batch, dim) or
    (batch, 1, dim) (batch may be 1: one vector for every sample), e.g. the ``chunk(6, dim=1)`` views of
    diffusers' AdaLayerNormZero embedding, used in place. fp16, bf16 or fp32; statistics and arithmetic
    in fp32, one rounding to the output dtype promote(x, scale, shift) (diffusers' expression gives the
    same dtype, rounding after each op).

    Equals diffusers' ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` with ``norm =
    nn.LayerNorm(dim, elementwise_affine=False, eps=eps)`` (AdaLayerNormZero uses eps=1e-6). For an
    affine LayerNorm (BasicTransformerBlock's norm3) use ``layer_norm_modulate``.

    Example::

        x = torch.randn(2, 256, 1152, device="cuda", dtype=torch.bfloat16)           # DiT-XL tokens
        shift, scale, gate = emb.chunk(3, dim=1)                                      # each (2, 1152)
        h = ada_layer_norm(x, scale, shift)                                           # (2, 256, 1152)
        x = ada_layer_norm_gate(x, gate, attn(h))                                     # x + gate * attn
    """
    x = _tokens("x", x)
    scale = _per_sample("scale", scale, x, "x")
    shift = _per_sample("shift", shift, x, "x")
    if not torch.compiler.is_compiling() and (
            isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0):
        raise ValueError(f"eps is {eps!r}; supported: a finite number >= 0")
    y, _, _ = _ada_ln_fwd(x, scale, shift, float(eps))
    return y


def ada_layer_norm_gate(residual, gate, y):
    """The gated residual of adaLN-Zero blocks: ``residual + gate * y`` in one pass; differentiable in
    all three (dgate is a deterministic sum over the tokens).

    Shapes: residual, y (batch, tokens, dim), any strides with a contiguous last dim; gate (batch, dim)
    or (batch, 1, dim) (batch may be 1). fp32 arithmetic, one rounding to promote(residual, gate, y).
    Equals diffusers' ``hidden_states = gate_msa.unsqueeze(1) * attn_output + hidden_states``
    (BasicTransformerBlock, norm_type="ada_norm_zero"), which rounds twice.

    Example::

        hidden = ada_layer_norm_gate(hidden, gate_msa, attn_output)   # (B, T, D)
    """
    residual = _tokens("residual", residual)
    y = _tokens("y", y)
    check_same(("residual", "y"), (residual, y), dtype=False)
    if y.shape != residual.shape:
        raise ValueError(f"y has shape {tuple(y.shape)} but residual has {tuple(residual.shape)}; they must match")
    gate = _per_sample("gate", gate, residual, "residual")
    return _gate_fwd(residual, gate, y)


# ----------------------------------------------------------------------------------------------------
# diffusers drop-ins (duck-typed: no diffusers import)
# ----------------------------------------------------------------------------------------------------

def layer_norm_modulate(norm, x, scale, shift):
    """Exactly diffusers' ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` for a torch.nn.LayerNorm
    ``norm`` over the last dim, in one kernel: AdaLayerNormZero's ``self.norm`` (non-affine, eps 1e-6;
    its FP32LayerNorm variant too: the kernel computes in fp32 anyway) and BasicTransformerBlock's
    ``norm3`` with ``scale_mlp`` / ``shift_mlp`` (affine or not, eps=norm_eps).

    An affine norm is folded into the modulation vectors (B x D work, in fp32, differentiable):
    (x_hat * w + b) * (1 + s) + t = x_hat * (1 + s') + t' with s' = w (1 + s) - 1, t' = b (1 + s) + t.
    x: (batch, tokens, dim); scale, shift: (batch, dim).
    """
    if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise ValueError(f"norm is {norm!r}; supported: a torch.nn.LayerNorm over the last dim")
    weight, bias = norm.weight, norm.bias
    if weight is None and bias is None:
        return ada_layer_norm(x, scale, shift, norm.eps)
    one_s = 1 + scale.float()
    scale_f = one_s * weight.float() - 1 if weight is not None else scale.float()
    shift_f = shift.float() + one_s * bias.float() if bias is not None else shift.float()
    # The folded vectors in the dtype diffusers' expression ends in (promote of scale, shift, w, b), so
    # the output dtype is its promote(x, ...) too.
    dtype = functools.reduce(torch.promote_types, [p.dtype for p in (weight, bias, shift) if p is not None],
                             scale.dtype)
    return ada_layer_norm(x, scale_f.to(dtype), shift_f.to(dtype), norm.eps)


def ada_layer_norm_zero_forward(module, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
    """diffusers' ``AdaLayerNormZero.forward`` (same arguments, same outputs ``(x, gate_msa, shift_mlp,
    scale_mlp, gate_mlp)``) with the modulation in one kernel; a patch can bind it as the module's
    forward. The embedding path (``emb``, SiLU, Linear, chunk) is diffusers' own code."""
    if module.emb is not None:
        emb = module.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    emb = module.linear(module.silu(emb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    return layer_norm_modulate(module.norm, x, scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp
