"""RMSNorm and LayerNorm over the last dim, optionally fused with the residual add; forward and backward.

One row x of N columns (rows = every leading dim of the input flattened; s = x + residual rounded to
x's dtype, exactly torch's add, when a residual is fused; otherwise s = x):

    RMSNorm:    rstd = 1 / sqrt(mean(s^2) + eps)                 x_hat = s * rstd
    LayerNorm:  mu = mean(s),  rstd = 1 / sqrt(mean((s - mu)^2) + eps),  x_hat = (s - mu) * rstd
    y = x_hat * w' + b,   w' = offset + w   (offset = 1 is Gemma's (1 + weight); w, b optional)

Casting (RMSNorm): "llama" rounds x_hat to x's dtype before the weight multiply (HF Llama, Mistral, Qwen,
Phi-3: ``weight * x_hat.to(input_dtype)``, output dtype promote(x, weight)); "gemma" keeps everything in
fp32 and rounds once at the end (output dtype = x's). LayerNorm computes in fp32, output dtype = x's.

Backward, with g = dy * w' (fp32) and row means over the N columns. For RMSNorm, d rstd / d s_i =
-rstd^3 s_i / N, so dL/ds_i = g_i rstd - sum_j g_j s_j rstd^3 s_i / N:

    RMSNorm:    ds = rstd * (g - x_hat * mean(g * x_hat))
    LayerNorm:  ds = rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (mu's path adds the mean(g) term)
    ds += d(returned sum)   when a residual is fused;   dx = dresidual = ds   (as for torch's add)
    dw = sum over rows of dy * x_hat   (x_hat rounded as in the forward),   db = sum over rows of dy

The backward recomputes x_hat from s and the saved rstd (and mu): the forward saves only s (or x), rstd
and mu. dw/db are deterministic: each backward program sums its rows into registers and writes one fp32
partial row; torch sums the few partial rows afterwards (no atomics).

Layers: kernels -> launchers (``rms_norm_forward`` ...) -> torch.library ops ``flashfuse::rms_norm_fwd``
/ ``_bwd`` and ``flashfuse::layer_norm_fwd`` / ``_bwd`` with fake and autograd registrations, so
``torch.compile(fullgraph=True)`` sees one op -> public ``rms_norm`` and ``layer_norm``.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import next_power_of_2

CASTING_MODES = ("llama", "gemma")

# Largest row block one program holds in registers. Forward: 16384 columns on 16 warps are 32 fp32 values
# of s and 32 of w' per thread, inside the 128 registers a thread may use at 512 threads (116 used, no
# spills, ptxas sm_90). Backward: s, dy, the next row, w' and dw per column, so half as many. Wider
# rows (e.g. 65536) loop over column blocks: registers stay bounded (a 65536-wide block would need 64+
# fp32 values per thread on 32 warps, whose limit is 64 registers: it spills), the price is a second
# read of the row, which the forward finds in L2 (one 128 KiB bf16 row per program).
MAX_BLOCK_N_FWD = 16384
MAX_BLOCK_N_BWD = 8192
# Small rows (QK-norm's head dim 128, hidden 5) are packed BLOCK_M to a program so that a program still
# moves ~4096 elements (8 KiB bf16): enough bytes in flight per launch, and no grid of 10^6 tiny programs.
TILE_ELEMENTS = 4096
# Forward: one warp per 512 elements of the tile, 16 per thread, i.e. two 16-byte vectors of bf16 (Liger
# uses the same ratio: 8 warps for 4096 columns), at most 16 warps (see MAX_BLOCK_N_FWD).
# Backward: it holds ~2.5x more per column (s, dy, the prefetched next row, w', dw), so the register file
# fits one program per SM at hidden >= 4096 whatever the warp count. Measured on an H200 (bf16, % of copy
# bandwidth): 8 warps at 4096 columns (RMSNorm bwd 74% vs 63% with 16); at 8192 RMSNorm is best on 32
# warps (92% vs 87% on 16), LayerNorm (one more accumulator, db) on 16 (79% vs 55% on 32, where it spills).
FWD_ELEMENTS_PER_WARP, FWD_MAX_WARPS = 512, 16
BWD_ELEMENTS_PER_WARP, BWD_RMS_WIDE_ELEMENTS_PER_WARP, BWD_MAX_WARPS = 512, 256, 32
# Backward programs per SM, counted in warps: 8 programs of 8 warps (4096 columns), 2 of 32 (8192). Those
# beyond the resident one queue behind it and even out the tail (measured: 74% at 64 warps per SM vs
# 61-68% at 32 or 128); more would only grow the fp32 dw partial buffer summed afterwards.
BWD_WARPS_PER_SM = 64
INTERPRETER_BWD_PROGRAMS = 4  # in the interpreter: a few programs, each looping over several rows


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _load_sum(X, R, S, o_m, o_n, mask, stride_x_row, stride_r_row, stride_s_row,
              HAS_RESIDUAL: tl.constexpr):
    """s = x (+ residual, rounded to x's dtype and stored to S) as fp32, 0 outside mask. [BLOCK_M, BLOCK_N]"""
    s = tl.load(X + o_m[:, None] * stride_x_row + o_n[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + o_m[:, None] * stride_r_row + o_n[None, :], mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(S + o_m[:, None] * stride_s_row + o_n[None, :], s, mask=mask)
    return s.to(tl.float32)


@triton.jit
def _normalize_store(s, mean, rstd, X, W, B, Y, o_m, o_n, m_n, mask, stride_y_row, offset,
                     IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                     LLAMA_CASTING: tl.constexpr):
    """y = x_hat * (offset + w) + b for one [BLOCK_M, BLOCK_N] block, stored in Y's dtype (X only gives
    the dtype x_hat is rounded to in llama casting)."""
    if IS_RMS:
        x_hat = s * rstd[:, None]
    else:
        x_hat = (s - mean[:, None]) * rstd[:, None]
    if LLAMA_CASTING:
        x_hat = x_hat.to(X.dtype.element_ty).to(tl.float32)
    y = x_hat
    if HAS_WEIGHT:
        w = tl.load(W + o_n, mask=m_n, other=0.0).to(tl.float32) + offset      # [BLOCK_N]
        y = y * w[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + o_m[:, None] * stride_y_row + o_n[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_fwd_kernel(
    X, R, W, B, Y, S, MEAN, RSTD,  # X, R, Y, S: [n_rows, n_cols]; W, B: [n_cols]; MEAN, RSTD: [n_rows] fp32
    n_rows, n_cols,
    stride_x_row, stride_r_row, stride_y_row, stride_s_row,
    eps, offset,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    LLAMA_CASTING: tl.constexpr, ONE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program normalizes BLOCK_M rows. ONE_BLOCK (n_cols <= BLOCK_N): one read of each input and one
    write of each output. Otherwise two passes over column blocks: statistics (the residual sum is
    written here), then normalize (reading the sum back)."""
    i_m = tl.program_id(0).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M]
    m_m = o_m < n_rows
    o_n = tl.arange(0, BLOCK_N)                                                # [BLOCK_N]
    if ONE_BLOCK:
        m_n = o_n < n_cols
        mask = m_m[:, None] & m_n[None, :]
        s = _load_sum(X, R, S, o_m, o_n, mask, stride_x_row, stride_r_row, stride_s_row, HAS_RESIDUAL)
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            var = tl.sum(s * s, axis=1) / n_cols                               # mean square
        else:
            mean = tl.sum(s, axis=1) / n_cols
            d = tl.where(mask, s - mean[:, None], 0.0)
            var = tl.sum(d * d, axis=1) / n_cols
        rstd = tl.math.rsqrt(var + eps)
        _normalize_store(s, mean, rstd, X, W, B, Y, o_m, o_n, m_n, mask, stride_y_row, offset,
                         IS_RMS, HAS_WEIGHT, HAS_BIAS, LLAMA_CASTING)
    else:
        # Pass 1. RMSNorm: m2 = sum of squares. LayerNorm: Chan's pairwise update merges each block's
        # (count n_b, mean mean_b, sum of squared deviations m2_b) into the running (start, mean, m2):
        #   delta = mean_b - mean,  mean += delta n_b / (start + n_b),
        #   m2 += m2_b + delta^2 start n_b / (start + n_b)      (no cancellation, unlike E[s^2] - mu^2)
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            m_n = start + o_n < n_cols
            mask = m_m[:, None] & m_n[None, :]
            s = _load_sum(X, R, S, o_m, start + o_n, mask, stride_x_row, stride_r_row, stride_s_row,
                          HAS_RESIDUAL)
            if IS_RMS:
                m2 += tl.sum(s * s, axis=1)
            else:
                n_b = tl.minimum(n_cols - start, BLOCK_N).to(tl.float32)
                mean_b = tl.sum(s, axis=1) / n_b
                d = tl.where(mask, s - mean_b[:, None], 0.0)
                frac = n_b / (start + n_b)
                delta = mean_b - mean
                mean += delta * frac
                m2 += tl.sum(d * d, axis=1) + delta * delta * start * frac
        rstd = tl.math.rsqrt(m2 / n_cols + eps)
        if HAS_RESIDUAL:
            # Pass 2 reads the sum back from S; other threads of this program wrote parts of it.
            tl.debug_barrier()
        for start in range(0, n_cols, BLOCK_N):
            m_n = start + o_n < n_cols
            mask = m_m[:, None] & m_n[None, :]
            if HAS_RESIDUAL:
                s = tl.load(S + o_m[:, None] * stride_s_row + (start + o_n)[None, :], mask=mask, other=0.0)
            else:
                s = tl.load(X + o_m[:, None] * stride_x_row + (start + o_n)[None, :], mask=mask, other=0.0)
            _normalize_store(s.to(tl.float32), mean, rstd, X, W, B, Y, o_m, start + o_n, m_n, mask,
                             stride_y_row, offset, IS_RMS, HAS_WEIGHT, HAS_BIAS, LLAMA_CASTING)
    if not IS_RMS:
        tl.store(MEAN + o_m, mean, mask=m_m)
    tl.store(RSTD + o_m, rstd, mask=m_m)


@triton.jit
def _x_hat_g(s, dy, w, MEAN, RSTD, o_m, m_m, mask, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """Recompute x_hat from the loaded s and the saved rstd (and mu); g = dy * (offset + w). fp32
    [BLOCK_M, BLOCK_N], 0 outside the mask; rstd [BLOCK_M]."""
    rstd = tl.load(RSTD + o_m, mask=m_m, other=0.0)
    s = s.to(tl.float32)
    if IS_RMS:
        x_hat = s * rstd[:, None]
    else:
        mean = tl.load(MEAN + o_m, mask=m_m, other=0.0)
        x_hat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
    dy = dy.to(tl.float32)
    g = dy * w[None, :] if HAS_WEIGHT else dy
    return x_hat, g, dy, rstd


@triton.jit
def _load_weight(W, o_n, m_n, offset, HAS_WEIGHT: tl.constexpr):
    """offset + w as fp32 [BLOCK_N] (0 when there is no weight: then it is never used)."""
    if HAS_WEIGHT:
        return tl.load(W + o_n, mask=m_n, other=0.0).to(tl.float32) + offset
    else:
        return tl.zeros(o_n.shape, dtype=tl.float32)


@triton.jit
def _norm_bwd_row_sums_kernel(
    DY, S, W, MEAN, RSTD, ROW_SUMS,  # DY, S: [n_rows, n_cols]; ROW_SUMS: [n_rows, 2] fp32 (out)
    n_rows, n_cols,
    stride_dy_row, stride_s_row,
    offset,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Only for rows wider than one block: mean(g * x_hat) and mean(g) per row, looping over columns."""
    i_m = tl.program_id(0).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M]
    m_m = o_m < n_rows
    o_n = tl.arange(0, BLOCK_N)
    c1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    c2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        m_n = start + o_n < n_cols
        mask = m_m[:, None] & m_n[None, :]
        s = tl.load(S + o_m[:, None] * stride_s_row + (start + o_n)[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + o_m[:, None] * stride_dy_row + (start + o_n)[None, :], mask=mask, other=0.0)
        w = _load_weight(W, start + o_n, m_n, offset, HAS_WEIGHT)
        x_hat, g, dy, rstd = _x_hat_g(s, dy, w, MEAN, RSTD, o_m, m_m, mask, IS_RMS, HAS_WEIGHT)
        c1 += tl.sum(g * x_hat, axis=1)
        c2 += tl.sum(g, axis=1)
    tl.store(ROW_SUMS + 2 * o_m, c1 / n_cols, mask=m_m)
    tl.store(ROW_SUMS + 2 * o_m + 1, c2 / n_cols, mask=m_m)


@triton.jit
def _norm_bwd_kernel(
    DY, DSUM, S, W, MEAN, RSTD, ROW_SUMS, DX, DW_PART, DB_PART,
    # DY, DSUM, S, DX: [n_rows, n_cols]; W: [n_cols]; MEAN, RSTD: [n_rows]; ROW_SUMS: [n_rows, 2];
    # DW_PART, DB_PART: [num_programs(0), n_cols] fp32 (out)
    n_rows, n_cols, rows_per_program,
    stride_dy_row, stride_dsum_row, stride_s_row, stride_dx_row,
    offset,
    IS_RMS: tl.constexpr, HAS_DSUM: tl.constexpr, HAS_WEIGHT: tl.constexpr, COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr, LLAMA_CASTING: tl.constexpr, ONE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (i_p, i_n) owns rows [i_p * rows_per_program, +rows_per_program) x column block i_n: writes
    their dx and one partial row of dw / db (summed in registers over its rows). ONE_BLOCK: the row sums
    are computed here; otherwise they come from _norm_bwd_row_sums_kernel (ROW_SUMS)."""
    i_p = tl.program_id(0)
    i_n = tl.program_id(1)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    m_n = o_n < n_cols
    w = _load_weight(W, o_n, m_n, offset, HAS_WEIGHT)                         # [BLOCK_N], loaded once
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = i_p * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    # Software pipelining by hand: the loads of the next row block are issued before this one is
    # computed, so memory stays busy while the row sums and dx are computed.
    o_m = (row_start + tl.arange(0, BLOCK_M)).to(tl.int64)                      # [BLOCK_M]
    mask = (o_m < row_end)[:, None] & m_n[None, :]
    s_next = tl.load(S + o_m[:, None] * stride_s_row + o_n[None, :], mask=mask, other=0.0)
    dy_next = tl.load(DY + o_m[:, None] * stride_dy_row + o_n[None, :], mask=mask, other=0.0)
    for r0 in range(row_start, row_end, BLOCK_M):
        o_m = (r0 + tl.arange(0, BLOCK_M)).to(tl.int64)                        # [BLOCK_M]
        m_m = o_m < row_end
        mask = m_m[:, None] & m_n[None, :]
        s, dy = s_next, dy_next
        o_next = o_m + BLOCK_M
        m_next = (o_next < row_end)[:, None] & m_n[None, :]
        s_next = tl.load(S + o_next[:, None] * stride_s_row + o_n[None, :], mask=m_next, other=0.0)
        dy_next = tl.load(DY + o_next[:, None] * stride_dy_row + o_n[None, :], mask=m_next, other=0.0)
        x_hat, g, dy, rstd = _x_hat_g(s, dy, w, MEAN, RSTD, o_m, m_m, mask, IS_RMS, HAS_WEIGHT)
        if ONE_BLOCK:
            c1 = tl.sum(g * x_hat, axis=1) / n_cols                            # mean(g x_hat) [BLOCK_M]
            c2 = tl.sum(g, axis=1) / n_cols                                    # mean(g), LayerNorm only
        else:
            c1 = tl.load(ROW_SUMS + 2 * o_m, mask=m_m, other=0.0)
            c2 = tl.load(ROW_SUMS + 2 * o_m + 1, mask=m_m, other=0.0)
        dx = g - x_hat * c1[:, None]
        if not IS_RMS:
            dx -= c2[:, None]
        dx *= rstd[:, None]
        if HAS_DSUM:
            dx += tl.load(DSUM + o_m[:, None] * stride_dsum_row + o_n[None, :], mask=mask,
                          other=0.0).to(tl.float32)
        tl.store(DX + o_m[:, None] * stride_dx_row + o_n[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            if LLAMA_CASTING:
                x_hat = x_hat.to(S.dtype.element_ty).to(tl.float32)
            dw += tl.sum(dy * x_hat, axis=0)
        if COMPUTE_DB:
            db += tl.sum(dy, axis=0)
    o_part = i_p.to(tl.int64) * n_cols + o_n
    if COMPUTE_DW:
        tl.store(DW_PART + o_part, dw, mask=m_n)
    if COMPUTE_DB:
        tl.store(DB_PART + o_part, db, mask=m_n)


# ----------------------------------------------------------------------------------------------------
# Launchers (2-D inputs (n_rows, n_cols) with a contiguous last dim, any row stride)
# ----------------------------------------------------------------------------------------------------

def _launch_config(n_rows: int, n_cols: int, max_block_n: int, per_warp: int, max_warps: int,
                   wide_per_warp: int = 0) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): block = next_pow2(hidden) up to the cap, rows per program so a
    program holds ~TILE_ELEMENTS, warps from the tile size."""
    block_n = min(next_power_of_2(n_cols), max_block_n)
    block_m = max(1, min(TILE_ELEMENTS // block_n, next_power_of_2(n_rows)))
    tile = block_m * block_n
    if wide_per_warp and tile > TILE_ELEMENTS:
        per_warp = wide_per_warp
    num_warps = min(max_warps, max(1, tile // per_warp))
    return block_m, block_n, num_warps


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _bwd_programs(device: torch.device, num_warps: int) -> int:
    if device.type != "cuda":
        return INTERPRETER_BWD_PROGRAMS
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device()) * max(
        1, BWD_WARPS_PER_SM // num_warps)


def _alloc(shape, dtype, device) -> Tensor:
    """Every buffer a kernel writes comes from here (tests replace it with a NaN fill: an element a kernel
    forgets to write then fails the comparison)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _out_dtype(x: Tensor, weight: Optional[Tensor], llama_casting: bool) -> torch.dtype:
    if llama_casting and weight is not None:
        return torch.promote_types(x.dtype, weight.dtype)
    return x.dtype


def _norm_forward(x, residual, weight, bias, eps, offset, *, is_rms, llama_casting):
    n_rows, n_cols = x.shape
    y = _alloc((n_rows, n_cols), dtype=_out_dtype(x, weight, llama_casting), device=x.device)
    s = _alloc((n_rows, n_cols), dtype=x.dtype, device=x.device) if residual is not None else None
    rstd = _alloc(n_rows, dtype=torch.float32, device=x.device)
    mean = None if is_rms else _alloc(n_rows, dtype=torch.float32, device=x.device)
    if n_rows == 0:
        return y, s, mean, rstd
    block_m, block_n, num_warps = _launch_config(n_rows, n_cols, MAX_BLOCK_N_FWD, FWD_ELEMENTS_PER_WARP,
                                                 FWD_MAX_WARPS)
    dummy = x  # stands in for absent optional tensors; the kernel never touches it (HAS_* is False)
    _norm_fwd_kernel[(triton.cdiv(n_rows, block_m),)](
        x, dummy if residual is None else residual, dummy if weight is None else weight,
        dummy if bias is None else bias, y, dummy if s is None else s, rstd if mean is None else mean, rstd,
        n_rows, n_cols,
        x.stride(0), 0 if residual is None else residual.stride(0), y.stride(0), 0 if s is None else s.stride(0),
        float(eps), float(offset),
        IS_RMS=is_rms, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, LLAMA_CASTING=llama_casting, ONE_BLOCK=n_cols <= block_n,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y, s, mean, rstd


def _norm_backward(dy, dsum, s, weight, bias, mean, rstd, offset, *, is_rms, llama_casting, compute_dw,
                   compute_db):
    n_rows, n_cols = s.shape
    device = s.device
    dx = _alloc((n_rows, n_cols), dtype=s.dtype, device=device)
    block_m, block_n, num_warps = _launch_config(n_rows, n_cols, MAX_BLOCK_N_BWD, BWD_ELEMENTS_PER_WARP,
                                                 BWD_MAX_WARPS, BWD_RMS_WIDE_ELEMENTS_PER_WARP if is_rms else 0)
    n_col_blocks = triton.cdiv(n_cols, block_n)
    # Enough row programs to fill the GPU, each looping over a contiguous run of rows (a multiple of
    # BLOCK_M) and keeping its dw / db partial in registers.
    n_programs = min(triton.cdiv(n_rows, block_m), max(1, _bwd_programs(device, num_warps) // n_col_blocks))
    rows_per_program = max(1, triton.cdiv(triton.cdiv(n_rows, max(n_programs, 1)), block_m)) * block_m
    n_programs = triton.cdiv(n_rows, rows_per_program)  # 0 when there are no rows: dw = db = 0
    dw_part = _alloc((n_programs, n_cols), dtype=torch.float32, device=device) if compute_dw else None
    db_part = _alloc((n_programs, n_cols), dtype=torch.float32, device=device) if compute_db else None
    if n_rows > 0:
        one_block = n_col_blocks == 1
        row_sums = None
        dummy = s
        if not one_block:
            row_sums = _alloc((n_rows, 2), dtype=torch.float32, device=device)
            _norm_bwd_row_sums_kernel[(triton.cdiv(n_rows, block_m),)](
                dy, s, dummy if weight is None else weight, rstd if mean is None else mean, rstd, row_sums,
                n_rows, n_cols, dy.stride(0), s.stride(0), float(offset),
                IS_RMS=is_rms, HAS_WEIGHT=weight is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                num_warps=num_warps)
        _norm_bwd_kernel[(n_programs, n_col_blocks)](
            dy, dummy if dsum is None else dsum, s, dummy if weight is None else weight,
            rstd if mean is None else mean, rstd, rstd if row_sums is None else row_sums, dx,
            rstd if dw_part is None else dw_part, rstd if db_part is None else db_part,
            n_rows, n_cols, rows_per_program,
            dy.stride(0), 0 if dsum is None else dsum.stride(0), s.stride(0), dx.stride(0),
            float(offset),
            IS_RMS=is_rms, HAS_DSUM=dsum is not None, HAS_WEIGHT=weight is not None, COMPUTE_DW=compute_dw,
            COMPUTE_DB=compute_db, LLAMA_CASTING=llama_casting, ONE_BLOCK=one_block,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    dw = dw_part.sum(0).to(weight.dtype) if compute_dw else None
    db = db_part.sum(0).to(bias.dtype) if compute_db else None
    return dx, dw, db


def rms_norm_forward(x, weight=None, eps=1e-6, residual=None, offset=0.0, llama_casting=True):
    """x, residual: (n_rows, n_cols), last dim contiguous; weight (n_cols,) or None.
    Returns (y, s = x + residual or None, rstd (n_rows,) fp32)."""
    y, s, _, rstd = _norm_forward(x, residual, weight, None, eps, offset, is_rms=True,
                                  llama_casting=llama_casting)
    return y, s, rstd


def rms_norm_backward(dy, s, weight, rstd, dsum=None, offset=0.0, llama_casting=True, compute_dw=True):
    """dy: (n_rows, n_cols); s: the saved input (x, or x + residual); dsum: gradient of the returned sum.
    Returns (dx (= dresidual), dw or None)."""
    dx, dw, _ = _norm_backward(dy, dsum, s, weight, None, None, rstd, offset, is_rms=True,
                               llama_casting=llama_casting, compute_dw=compute_dw and weight is not None,
                               compute_db=False)
    return dx, dw


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, residual=None):
    """Returns (y, s = x + residual or None, mean (n_rows,) fp32, rstd (n_rows,) fp32)."""
    return _norm_forward(x, residual, weight, bias, eps, 0.0, is_rms=False, llama_casting=False)


def layer_norm_backward(dy, s, weight, bias, mean, rstd, dsum=None, compute_dw=True, compute_db=True):
    """bias only gives db's dtype. Returns (dx (= dresidual), dw or None, db or None)."""
    return _norm_backward(dy, dsum, s, weight, bias, mean, rstd, 0.0, is_rms=False, llama_casting=False,
                          compute_dw=compute_dw and weight is not None,
                          compute_db=compute_db and bias is not None)


# ----------------------------------------------------------------------------------------------------
# torch.library ops: 2-D rows in, flat outputs; an absent sum / dw / db is an empty tensor (ops cannot
# return None)
# ----------------------------------------------------------------------------------------------------

def _empty(t: Tensor) -> Tensor:
    return t.new_empty(0)


def _rms_norm_fwd_impl(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], eps: float, offset: float,
                  llama_casting: bool) -> tuple[Tensor, Tensor, Tensor]:
    y, s, rstd = rms_norm_forward(x, weight, eps, residual, offset, llama_casting)
    return y, _empty(x) if s is None else s, rstd


def _rms_norm_fwd_fake(x, residual, weight, eps, offset, llama_casting):
    y = x.new_empty(x.shape, dtype=_out_dtype(x, weight, llama_casting))
    s = _empty(x) if residual is None else x.new_empty(x.shape)
    return y, s, x.new_empty(x.shape[0], dtype=torch.float32)


def _rms_norm_bwd_impl(dy: Tensor, dsum: Optional[Tensor], s: Tensor, weight: Optional[Tensor], rstd: Tensor,
                  offset: float, llama_casting: bool, compute_dw: bool) -> tuple[Tensor, Tensor]:
    dx, dw = rms_norm_backward(dy, s, weight, rstd, dsum, offset, llama_casting, compute_dw)
    return dx, _empty(s) if dw is None else dw


def _rms_norm_bwd_fake(dy, dsum, s, weight, rstd, offset, llama_casting, compute_dw):
    dw = weight.new_empty(weight.shape) if compute_dw and weight is not None else _empty(s)
    return s.new_empty(s.shape), dw


def _rms_setup_context(ctx, inputs, output):
    x, residual, weight, _eps, offset, llama_casting = inputs
    _y, s, rstd = output
    ctx.has_residual = residual is not None
    ctx.offset, ctx.llama_casting = offset, llama_casting
    ctx.save_for_backward(s if ctx.has_residual else x, weight, rstd)
    ctx.mark_non_differentiable(rstd, *(() if ctx.has_residual else (s,)))


def _rms_backward(ctx, dy, dsum, _drstd):
    s, weight, rstd = ctx.saved_tensors
    compute_dw = weight is not None and ctx.needs_input_grad[2]
    dsum = last_dim_contiguous(dsum) if ctx.has_residual and dsum is not None else None
    dx, dw = _rms_norm_bwd(last_dim_contiguous(dy), dsum, s, weight, rstd, ctx.offset, ctx.llama_casting,
                           compute_dw)
    return dx, dx if ctx.has_residual else None, dw if compute_dw else None, None, None, None


_rms_norm_bwd = FlashfuseOp("flashfuse::rms_norm_bwd", _rms_norm_bwd_impl, fake=_rms_norm_bwd_fake)
_rms_norm_fwd = FlashfuseOp("flashfuse::rms_norm_fwd", _rms_norm_fwd_impl, fake=_rms_norm_fwd_fake,
                            setup_context=_rms_setup_context, backward=_rms_backward)


def _layer_norm_fwd_impl(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor], bias: Optional[Tensor],
                    eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    y, s, mean, rstd = layer_norm_forward(x, weight, bias, eps, residual)
    return y, _empty(x) if s is None else s, mean, rstd


def _layer_norm_fwd_fake(x, residual, weight, bias, eps):
    s = _empty(x) if residual is None else x.new_empty(x.shape)
    stat = x.new_empty(x.shape[0], dtype=torch.float32)
    return x.new_empty(x.shape), s, stat, stat.new_empty(stat.shape)


def _layer_norm_bwd_impl(dy: Tensor, dsum: Optional[Tensor], s: Tensor, weight: Optional[Tensor],
                    bias: Optional[Tensor], mean: Tensor, rstd: Tensor, compute_dw: bool,
                    compute_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = layer_norm_backward(dy, s, weight, bias, mean, rstd, dsum, compute_dw, compute_db)
    return dx, _empty(s) if dw is None else dw, _empty(s) if db is None else db


def _layer_norm_bwd_fake(dy, dsum, s, weight, bias, mean, rstd, compute_dw, compute_db):
    dw = weight.new_empty(weight.shape) if compute_dw and weight is not None else _empty(s)
    db = bias.new_empty(bias.shape) if compute_db and bias is not None else _empty(s)
    return s.new_empty(s.shape), dw, db


def _layer_norm_setup_context(ctx, inputs, output):
    x, residual, weight, bias, _eps = inputs
    _y, s, mean, rstd = output
    ctx.has_residual = residual is not None
    ctx.save_for_backward(s if ctx.has_residual else x, weight, bias, mean, rstd)
    ctx.mark_non_differentiable(mean, rstd, *(() if ctx.has_residual else (s,)))


def _layer_norm_backward(ctx, dy, dsum, _dmean, _drstd):
    s, weight, bias, mean, rstd = ctx.saved_tensors
    compute_dw = weight is not None and ctx.needs_input_grad[2]
    compute_db = bias is not None and ctx.needs_input_grad[3]
    dsum = last_dim_contiguous(dsum) if ctx.has_residual and dsum is not None else None
    dx, dw, db = _layer_norm_bwd(last_dim_contiguous(dy), dsum, s, weight, bias, mean, rstd, compute_dw,
                                 compute_db)
    return (dx, dx if ctx.has_residual else None, dw if compute_dw else None, db if compute_db else None,
            None)


_layer_norm_bwd = FlashfuseOp("flashfuse::layer_norm_bwd", _layer_norm_bwd_impl, fake=_layer_norm_bwd_fake)
_layer_norm_fwd = FlashfuseOp("flashfuse::layer_norm_fwd", _layer_norm_fwd_impl, fake=_layer_norm_fwd_fake,
                              setup_context=_layer_norm_setup_context, backward=_layer_norm_backward)


# ----------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------

def _check_inputs(x, residual, eps, params):
    check_tensor("x", x)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected (..., hidden) with hidden >= 1")
    n_cols = x.shape[-1]
    if residual is not None:
        check_tensor("residual", residual)
        check_same(("x", "residual"), (x, residual))
        if residual.shape != x.shape:
            raise ValueError(f"residual has shape {tuple(residual.shape)} but x has {tuple(x.shape)}; "
                             "they must match (the residual is added to x)")
    for name, p in params.items():
        if p is None:
            continue
        check_tensor(name, p)
        check_same(("x", name), (x, p), dtype=False)
        if tuple(p.shape) != (n_cols,):
            raise ValueError(f"{name} has shape {tuple(p.shape)}; expected ({n_cols},), the hidden size "
                             "(x.shape[-1])")
    if not torch.compiler.is_compiling() and (
            isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0):
        raise ValueError(f"eps is {eps!r}; supported: a finite number >= 0")


def _rows(t: Optional[Tensor], n_cols: int) -> Optional[Tensor]:
    """(..., n_cols) -> (n_rows, n_cols): a view with one row stride when the leading dims allow it
    (e.g. Qwen3's QK-norm on (B, S, H, D) slices), a copy otherwise or when the last dim is strided."""
    return None if t is None else last_dim_contiguous(t).reshape(-1, n_cols)


def _param(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else last_dim_contiguous(t)


def rms_norm(x, weight=None, eps=1e-6, residual=None, *, offset=0.0, casting_mode="llama"):
    """RMSNorm over the last dim, optionally fused with the residual add; differentiable in x, weight and
    residual (Triton forward and backward).

    Shapes: x (..., hidden), any leading dims and strides (e.g. Qwen3's per-head QK-norm on (batch,
    seqlen, nheads, headdim)); weight (hidden,) or None (no scale); residual: same shape and dtype as x.
    fp16, bf16 or fp32; weight may have another float dtype (e.g. fp32 weights with bf16 activations).

    Computes y = x_hat * (offset + weight), x_hat = s / sqrt(mean(s^2) + eps), s = x (+ residual).
    With ``residual`` it returns ``(y, x + residual)`` (the sum rounded to x's dtype like torch's add):
    the next layer's residual stream, for one read of x and residual instead of two.

    Options: offset=1.0 is Gemma's (1 + weight) (ignored when weight is None). casting_mode "llama"
    (Llama, Mistral, Qwen, Phi-3: normalize in fp32, round x_hat to x's dtype, then multiply by the
    weight; output dtype promote(x.dtype, weight.dtype)) or "gemma" (fp32 throughout including offset +
    weight, one rounding to x's dtype at the end).

    Example::

        x = torch.randn(4, 1024, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = rms_norm(x, w, eps=1e-6)                       # (4, 1024, 4096)
        y, h = rms_norm(x, w, residual=h_prev)             # h = x + h_prev
    """
    _check_inputs(x, residual, eps, {"weight": weight})
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode is {casting_mode!r}; supported: {', '.join(map(repr, CASTING_MODES))}")
    # Under torch.compile a float argument may arrive as a SymFloat, which math.isfinite rejects: the eager
    # call has validated the same value already.
    if not torch.compiler.is_compiling() and (
            isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset)):
        raise ValueError(f"offset is {offset!r}; supported: a finite number (1.0 for Gemma's 1 + weight)")
    n_cols = x.shape[-1]
    y, s, _ = _rms_norm_fwd(_rows(x, n_cols), _rows(residual, n_cols), _param(weight), float(eps),
                            float(offset), casting_mode == "llama")
    y = y.view(x.shape)
    return y if residual is None else (y, s.view(x.shape))


def layer_norm(x, weight=None, bias=None, eps=1e-5, residual=None):
    """LayerNorm over the last dim, optionally fused with the residual add; differentiable in x, weight,
    bias and residual (Triton forward and backward).

    Shapes: x (..., hidden), any leading dims and strides; weight, bias (hidden,) or None; residual:
    same shape and dtype as x. fp16, bf16 or fp32; weight / bias may have another float dtype. Statistics
    and arithmetic in fp32, output in x's dtype (like torch.nn.functional.layer_norm):
    y = (s - mean(s)) / sqrt(var(s) + eps) * weight + bias, s = x (+ residual), biased variance.
    With ``residual`` it returns ``(y, x + residual)`` (the sum rounded to x's dtype like torch's add).

    Example::

        x = torch.randn(8, 197, 768, device="cuda", dtype=torch.bfloat16)
        ln = torch.nn.LayerNorm(768, device="cuda", dtype=torch.bfloat16)
        y = layer_norm(x, ln.weight, ln.bias, eps=ln.eps)  # (8, 197, 768), equals ln(x)
    """
    _check_inputs(x, residual, eps, {"weight": weight, "bias": bias})
    n_cols = x.shape[-1]
    y, s, _, _ = _layer_norm_fwd(_rows(x, n_cols), _rows(residual, n_cols), _param(weight), _param(bias),
                                 float(eps))
    y = y.view(x.shape)
    return y if residual is None else (y, s.view(x.shape))
