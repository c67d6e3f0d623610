"""RMSNorm and LayerNorm over the last dim, optionally fused with the residual add; forward and backward.

One row x of N columns (rows = every leading dim of the input flattened), s = x (+ residual, rounded to
x's dtype like torch's add): y = x_hat * (offset + w) + b with x_hat = s * rstd (RMSNorm) or (s - mu) * rstd
(LayerNorm). The forward and backward math and the kernels are in ``norm_details/_kernels.py``; this file
holds the launch configuration, the launchers, the torch.library ops and the public functions.

Layers: kernels -> launchers (``rms_norm_forward`` ...) -> torch.library ops ``flashfuse::rms_norm_fwd``
/ ``_bwd`` and ``flashfuse::layer_norm_fwd`` / ``_bwd`` with fake and autograd registrations, so
``torch.compile(fullgraph=True)`` sees one op -> public ``rms_norm`` and ``layer_norm``.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import cdiv, next_power_of_2, sm_count
from .norm_details._kernels import (_norm_bwd_kernel, _norm_bwd_row_sums_kernel, _norm_fwd_kernel,
                                    _norm_param_grad_kernel)

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
# Backward: 8 warps at 4096 columns hold s, dy, x_hat, g, w' and the dw / db partials in ~125 registers
# (ptxas sm_90, no spills), so two programs share an SM. Measured on an H200 (bf16, % of copy bandwidth,
# before the pipelined loads below): 8 warps at 4096 columns (RMSNorm bwd 74% vs 63% with 16); at 8192
# RMSNorm is best on 32 warps (92% vs 87% on 16), LayerNorm on 16 (79% vs 55% on 32).
FWD_ELEMENTS_PER_WARP, FWD_MAX_WARPS = 512, 16
BWD_ELEMENTS_PER_WARP, BWD_RMS_WIDE_ELEMENTS_PER_WARP, BWD_MAX_WARPS = 512, 256, 32
# Backward programs per SM, counted in warps (a persistent grid, each program looping over a contiguous
# run of rows and writing one fp32 partial row of dw / db): 32 is 4 programs of 8 warps at 4096 columns,
# two waves of the two that fit. More programs even out the tail (measured with 64: 74% vs 61-68% at 32
# or 128 when runs of rows were rounded up to whole programs); fewer shrink the partial rows written
# and summed afterwards (LayerNorm at 16384 x 4096 with 8 programs per SM: 2 x 17 MB, 8% of the bytes).
BWD_WARPS_PER_SM = 32
# Loads of the next rows in flight while a row is computed: Triton's pipeliner (tl.range num_stages)
# copies BWD_STAGES - 1 row blocks ahead into shared memory with cp.async (at 4096 columns bf16 one
# stage is 16 KB of s and dy: 2 stages ahead x 2 programs = 64 KB in flight per SM, vs 32 KB with the
# register prefetch of one row). BWD_REG_PREFETCH (with BWD_STAGES = 1): the former register prefetch.
BWD_STAGES = 3
BWD_REG_PREFETCH = False
# Shared memory one backward program may use for its stages (H100 / H200: 227 KB per block, two
# programs per SM at 4096 columns): fp32 rows at 8192 columns with a fused residual are 96 KB a stage.
BWD_SMEM_BUDGET = 160 * 1024
# The dw / db partial-row sum: 32 columns (one 128-byte line per row) x 64 partial rows per step, 8 KB
# of fp32 per tensor on 4 warps; 128 programs at 4096 columns, each with 2 steps in flight (3 stages).
PARAM_SUM_BLOCK_N, PARAM_SUM_BLOCK_P, PARAM_SUM_WARPS, PARAM_SUM_STAGES = 32, 64, 4, 3
INTERPRETER_BWD_PROGRAMS = 4  # in the interpreter: a few programs, each looping over several rows


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


def _bwd_programs(device: torch.device, num_warps: int) -> int:
    if device.type != "cuda":
        return INTERPRETER_BWD_PROGRAMS
    return sm_count(device) * max(
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
    _norm_fwd_kernel[(cdiv(n_rows, block_m),)](
        x, dummy if residual is None else residual, dummy if weight is None else weight,
        dummy if bias is None else bias, y, dummy if s is None else s, rstd if mean is None else mean, rstd,
        n_rows, n_cols,
        x.stride(0), 0 if residual is None else residual.stride(0), y.stride(0), 0 if s is None else s.stride(0),
        float(eps), float(offset),
        IS_RMS=is_rms, HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
        HAS_BIAS=bias is not None, LLAMA_CASTING=llama_casting, ONE_BLOCK=n_cols <= block_n,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y, s, mean, rstd


def _bwd_stages(block_m: int, block_n: int, dtypes) -> int:
    """BWD_STAGES, fewer when a stage (one row block of s, dy and dsum) would not fit BWD_SMEM_BUDGET."""
    stage_bytes = block_m * block_n * sum(d.itemsize for d in dtypes)
    return max(1, min(BWD_STAGES, 1 + BWD_SMEM_BUDGET // stage_bytes))


def _norm_backward(dy, dsum, s, weight, bias, mean, rstd, offset, *, is_rms, llama_casting, compute_dw,
                   compute_db):
    n_rows, n_cols = s.shape
    device = s.device
    dx = _alloc((n_rows, n_cols), dtype=s.dtype, device=device)
    dw = _alloc(n_cols, dtype=weight.dtype, device=device) if compute_dw else None
    db = _alloc(n_cols, dtype=bias.dtype, device=device) if compute_db else None
    if n_rows == 0:
        return dx, None if dw is None else dw.zero_(), None if db is None else db.zero_()
    block_m, block_n, num_warps = _launch_config(n_rows, n_cols, MAX_BLOCK_N_BWD, BWD_ELEMENTS_PER_WARP,
                                                 BWD_MAX_WARPS, BWD_RMS_WIDE_ELEMENTS_PER_WARP if is_rms else 0)
    n_col_blocks = cdiv(n_cols, block_n)
    # A persistent grid: enough row programs to fill the GPU, each looping over a contiguous run of row
    # blocks (runs differ by at most one block) and keeping its dw / db partial in registers.
    n_programs = min(cdiv(n_rows, block_m), max(1, _bwd_programs(device, num_warps) // n_col_blocks))
    dw_part = _alloc((n_programs, n_cols), dtype=torch.float32, device=device) if compute_dw else None
    db_part = _alloc((n_programs, n_cols), dtype=torch.float32, device=device) if compute_db else None
    one_block = n_col_blocks == 1
    row_sums = None
    dummy = s  # stands in for absent optional tensors; the kernels never touch it
    if not one_block:
        row_sums = _alloc((n_rows, 2), dtype=torch.float32, device=device)
        _norm_bwd_row_sums_kernel[(cdiv(n_rows, block_m),)](
            dy, s, dummy if weight is None else weight, rstd if mean is None else mean, rstd, row_sums,
            n_rows, n_cols, dy.stride(0), s.stride(0), float(offset),
            IS_RMS=is_rms, HAS_WEIGHT=weight is not None, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=num_warps)
    stages = _bwd_stages(block_m, block_n, (s.dtype, dy.dtype) + (() if dsum is None else (dsum.dtype,)))
    _norm_bwd_kernel[(n_programs, n_col_blocks)](
        dy, dummy if dsum is None else dsum, s, dummy if weight is None else weight,
        rstd if mean is None else mean, rstd, rstd if row_sums is None else row_sums, dx,
        rstd if dw_part is None else dw_part, rstd if db_part is None else db_part,
        n_rows, n_cols, n_programs,
        dy.stride(0), 0 if dsum is None else dsum.stride(0), s.stride(0), dx.stride(0),
        float(offset),
        IS_RMS=is_rms, HAS_DSUM=dsum is not None, HAS_WEIGHT=weight is not None, COMPUTE_DW=compute_dw,
        COMPUTE_DB=compute_db, LLAMA_CASTING=llama_casting, ONE_BLOCK=one_block,
        BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, REG_PREFETCH=BWD_REG_PREFETCH and stages == 1,
        num_warps=num_warps)
    if compute_dw or compute_db:
        _norm_param_grad_kernel[(cdiv(n_cols, PARAM_SUM_BLOCK_N),)](
            rstd if dw_part is None else dw_part, rstd if db_part is None else db_part,
            rstd if dw is None else dw, rstd if db is None else db, n_programs, n_cols,
            COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db, BLOCK_P=PARAM_SUM_BLOCK_P,
            BLOCK_N=PARAM_SUM_BLOCK_N, NUM_STAGES=PARAM_SUM_STAGES, num_warps=PARAM_SUM_WARPS)
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
