"""Adaptive LayerNorm (DiT's adaLN-Zero modulation) and its gated residual; forward and backward.

DiT-style blocks (diffusers' AdaLayerNormZero / BasicTransformerBlock with norm_type="ada_norm_zero",
SD3, Flux, PixArt) modulate a non-affine LayerNorm with per-sample vectors from the timestep embedding,
and add each branch's output back through a per-sample gate:

    y   = LN(x) * (1 + scale) + shift        ada_layer_norm(x, scale, shift, eps)
    out = residual + gate * y                ada_layer_norm_gate(residual, gate, y)

and, as a block's next LayerNorm follows its gated residual at once, both in one kernel (flash-attn's
``residual=`` / prenorm convention; h is the new residual stream, written once and not read back):

    h = residual + gate * x,  y = LN(h) * (1 + scale) + shift
        y, h = ada_layer_norm(x, scale, shift, eps, residual=residual, gate=gate)

Eager PyTorch runs LN, the add, the multiply and the add as four passes over the (B, T, D) activations
(five for the gate with its two ops and the intermediates); each kernel here reads every input once and
writes every output once.

Layers: kernels (``modulation_details/_kernels.py``, with the forward and backward math) -> launchers
(``ada_layer_norm_forward``, ``ada_layer_norm_residual_forward`` ...) -> torch.library ops
``flashfuse::ada_layer_norm_fwd`` / ``_bwd``, ``flashfuse::ada_layer_norm_gate_fwd`` / ``_bwd`` and
``flashfuse::ada_layer_norm_residual_fwd`` / ``_bwd`` through ``FlashfuseOp`` (torch.compile sees one op;
eager calls skip the dispatcher) -> public functions, and two diffusers drop-ins (``layer_norm_modulate``,
``ada_layer_norm_zero_forward``).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import cdiv, next_power_of_2, sm_count
from .modulation_details._kernels import _ada_ln_bwd_kernel, _ada_ln_fwd_kernel, _gate_bwd_kernel, _gate_fwd_kernel

# Largest column block one program holds in registers (the forward keeps x in fp32 and loads scale /
# shift next to it; the backward keeps x, dy, 1 + scale and the two fp32 accumulators), as in
# flashfuse.ops.norm whose limits were measured with ptxas on sm_90 (no spills). Wider rows loop over
# column blocks (second read of the row, which the program finds in L2). The residual form loads residual
# and gate too: at 16384 columns its forward uses 99 registers, its backward (+ dh) 109, no spills (H100,
# Triton 3.6; the plain forward: 64 registers, 2 spills).
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
    y, _h, mean, rstd = _ada_ln_launch(x, None, None, scale, shift, eps)
    return y, mean, rstd


def ada_layer_norm_residual_forward(x: Tensor, residual: Tensor, gate: Optional[Tensor], scale: Tensor,
                                    shift: Tensor, eps: float = 1e-6):
    """h = residual + gate * x (residual + x when gate is None), then y = LN(h) * (1 + scale) + shift.
    Returns (y, dtype promote(h, scale, shift); h, dtype promote(residual, gate, x); mean, rstd of h)."""
    return _ada_ln_launch(x, residual, gate, scale, shift, eps)


def _ada_ln_launch(x, residual, gate, scale, shift, eps):
    n_batch, seqlen, n_cols = x.shape
    n_rows = n_batch * seqlen
    fused = residual is not None
    h_dtype = _h_dtype(x, residual, gate)
    h = _alloc((n_batch, seqlen, n_cols), h_dtype, x.device) if fused else None
    out_dtype = torch.promote_types(torch.promote_types(h_dtype, scale.dtype), shift.dtype)
    y = _alloc((n_batch, seqlen, n_cols), out_dtype, x.device)
    mean = _alloc(n_rows, torch.float32, x.device)
    rstd = _alloc(n_rows, torch.float32, x.device)
    if n_rows == 0:
        return y, h, mean, rstd
    # Without HAS_RESIDUAL the kernel touches neither R nor H, without HAS_GATE not GATE: x, y, scale stand in.
    r, h_out = (residual, h) if fused else (x, y)
    g = gate if fused and gate is not None else scale
    block_m, block_n, num_warps = _row_config(n_rows, n_cols, MAX_BLOCK_N_FWD)
    _ada_ln_fwd_kernel[(cdiv(n_rows, block_m),)](
        x, r, g, scale, shift, h_out, y, mean, rstd, n_rows, seqlen, n_cols,
        x.stride(0), x.stride(1), r.stride(0), r.stride(1), _batch_stride(g), _batch_stride(scale),
        _batch_stride(shift), n_cols, n_cols, float(eps),
        HAS_RESIDUAL=fused, HAS_GATE=fused and gate is not None,
        ONE_BLOCK=n_cols <= block_n, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps)
    return y, h, mean, rstd


def _h_dtype(x: Tensor, residual: Optional[Tensor], gate: Optional[Tensor]) -> torch.dtype:
    """promote(residual, gate, x): the dtype ada_layer_norm_gate(residual, gate, x) returns."""
    return functools.reduce(torch.promote_types, [t.dtype for t in (residual, gate) if t is not None], x.dtype)


def _batch_stride(v: Tensor) -> int:
    """Row stride of a (B or 1, D) vector, 0 for a batch of 1 (broadcast over the samples)."""
    return v.stride(0) if v.shape[0] > 1 else 0


def ada_layer_norm_backward(dy: Tensor, x: Tensor, scale: Tensor, shift_dtype: torch.dtype, n_shift_batch: int,
                            mean: Tensor, rstd: Tensor, dh: Optional[Tensor] = None):
    """Returns (dx like x, dscale like scale, dshift (n_shift_batch, D) of shift_dtype). In the residual form
    x is h and dh (like dy) the gradient of h as an output: dx is then dh + the LayerNorm's VJP."""
    n_batch, seqlen, n_cols = x.shape
    dx = _alloc((n_batch, seqlen, n_cols), x.dtype, x.device)
    block_m, block_n, num_warps = _row_config(seqlen, n_cols, MAX_BLOCK_N_BWD)
    n_chunks, rows = _token_chunks(x.device, n_batch, seqlen, block_m, num_warps)
    n_chunks = n_chunks if n_batch > 0 else 0
    dsc_part = _alloc((n_chunks, n_batch, n_cols), torch.float32, x.device)
    dsh_part = _alloc((n_chunks, n_batch, n_cols), torch.float32, x.device)
    if n_chunks > 0:
        dh_arg = dy if dh is None else dh  # not touched without HAS_DH
        _ada_ln_bwd_kernel[(n_batch, n_chunks)](
            dy, dh_arg, x, scale, mean, rstd, dx, dsc_part, dsh_part, seqlen, n_cols, rows,
            dy.stride(0), dy.stride(1), dh_arg.stride(0), dh_arg.stride(1), x.stride(0), x.stride(1),
            _batch_stride(scale), n_cols, dsc_part.stride(0), dsc_part.stride(1), HAS_DH=dh is not None,
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
        residual.stride(0), residual.stride(1), _batch_stride(gate),
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
            dout.stride(0), dout.stride(1), _batch_stride(gate),
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


# The residual form: h = residual + gate * x and y = LN(h) * (1 + scale) + shift in one forward kernel; the
# backward is the LayerNorm kernel on h adding h's own gradient (dh_total), then the gate's on dh_total.

def _ada_ln_res_fwd_impl(x: Tensor, residual: Tensor, gate: Optional[Tensor], scale: Tensor, shift: Tensor,
                         eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return ada_layer_norm_residual_forward(x, residual, gate, scale, shift, eps)


def _ada_ln_res_fwd_fake(x, residual, gate, scale, shift, eps):
    h = x.new_empty(x.shape, dtype=_h_dtype(x, residual, gate))
    y, mean, rstd = _ada_ln_fwd_fake(h, scale, shift, eps)
    return y, h, mean, rstd


def _ada_ln_res_bwd_impl(dy: Tensor, dh: Tensor, h: Tensor, scale: Tensor, shift_like: Tensor, mean: Tensor,
                         rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return ada_layer_norm_backward(dy, h, scale, shift_like.dtype, shift_like.shape[0], mean, rstd, dh)


def _ada_ln_res_bwd_fake(dy, dh, h, scale, shift_like, mean, rstd):
    return _ada_ln_bwd_fake(dy, h, scale, shift_like, mean, rstd)


def _ada_ln_res_setup_context(ctx, inputs, output):
    x, residual, gate, scale, shift, _eps = inputs
    _y, h, mean, rstd = output
    ctx.x_dtype, ctx.residual_dtype = x.dtype, residual.dtype
    # The LayerNorm part needs h (an output), the gate's dgate = sum dh_total * x needs x.
    ctx.save_for_backward(h, None if gate is None else x, gate, scale, shift.new_empty((shift.shape[0], 0)),
                          mean, rstd)
    ctx.mark_non_differentiable(mean, rstd)


def _ada_ln_res_backward(ctx, dy, dh, _dmean, _drstd):
    h, x, gate, scale, shift_like, mean, rstd = ctx.saved_tensors
    # dh_total = dh + the LayerNorm's VJP (one kernel), of h's dtype; it is dresidual, and gate * dh_total is dx
    dh_total, dscale, dshift = _ada_ln_res_bwd(last_dim_contiguous(dy), last_dim_contiguous(dh), h, scale,
                                               shift_like, mean, rstd)
    dx, dgate = (dh_total.to(ctx.x_dtype), None) if gate is None else _gate_bwd(dh_total, gate, x)
    return dx, dh_total.to(ctx.residual_dtype), dgate, dscale, dshift, None


_ada_ln_res_bwd = FlashfuseOp("flashfuse::ada_layer_norm_residual_bwd", _ada_ln_res_bwd_impl,
                              fake=_ada_ln_res_bwd_fake)
_ada_ln_res_fwd = FlashfuseOp("flashfuse::ada_layer_norm_residual_fwd", _ada_ln_res_fwd_impl,
                              fake=_ada_ln_res_fwd_fake, setup_context=_ada_ln_res_setup_context,
                              backward=_ada_ln_res_backward)


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


def ada_layer_norm(x, scale, shift, eps=1e-6, residual=None, gate=None):
    """Adaptive LayerNorm (DiT adaLN / adaLN-Zero modulation): ``LN(x) * (1 + scale) + shift``, with a
    LayerNorm without weight and bias over the last dim; differentiable in every tensor argument (Triton
    forward and backward; dscale, dshift, dgate are deterministic sums over the tokens).

    Shapes: x (batch, tokens, dim), any strides with a contiguous last dim; scale, shift (batch, dim) or
    (batch, 1, dim) (batch may be 1: one vector for every sample), e.g. the ``chunk(6, dim=1)`` views of
    diffusers' AdaLayerNormZero embedding, used in place. fp16, bf16 or fp32; statistics and arithmetic
    in fp32, one rounding to the output dtype promote(x, scale, shift) (diffusers' expression gives the
    same dtype, rounding after each op).

    Equals diffusers' ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` with ``norm =
    nn.LayerNorm(dim, elementwise_affine=False, eps=eps)`` (AdaLayerNormZero uses eps=1e-6). For an
    affine LayerNorm (BasicTransformerBlock's norm3) use ``layer_norm_modulate``.

    Residual form (flash-attn's ``layer_norm_fn(..., residual=, prenorm=True)`` convention): with
    ``residual`` (x's shape; x is then a branch's output, residual the stream it is added to) the
    normalized input is the new stream ``h = residual + gate * x`` (``residual + x`` when gate is None;
    gate: scale's shapes), computed in fp32 and rounded once to promote(residual, gate, x), bitwise
    ``ada_layer_norm_gate(residual, gate, x)``; the LayerNorm normalizes that rounded h, so the result is
    bitwise ``ada_layer_norm(ada_layer_norm_gate(residual, gate, x), scale, shift, eps)``, in one kernel
    that reads residual and x and writes h and y (four tensors instead of five). Returns ``(y, h)``, y of
    dtype promote(h, scale, shift); either may go unused in the loss.

    Example::

        x = torch.randn(2, 256, 1152, device="cuda", dtype=torch.bfloat16)           # DiT-XL tokens
        shift, scale, gate = emb.chunk(3, dim=1)                                      # each (2, 1152)
        h = ada_layer_norm(x, scale, shift)                                           # (2, 256, 1152)
        x = ada_layer_norm_gate(x, gate, attn(h))                                     # x + gate * attn

        # a DiT block: the attention's gated residual, then the feed-forward's modulated LayerNorm
        n, h = ada_layer_norm(attn_out, scale_mlp, shift_mlp, residual=h, gate=gate_msa)
        h = ada_layer_norm_gate(h, gate_mlp, ff(n))                                   # h + gate_mlp * ff(n)
    """
    x = _tokens("x", x)
    if residual is None and gate is not None:
        raise ValueError("gate is given without residual; gate needs residual (h = residual + gate * x): pass "
                         "residual=, or use ada_layer_norm_gate")
    if residual is not None:
        residual = _tokens("residual", residual)
        check_same(("x", "residual"), (x, residual), dtype=False)
        if residual.shape != x.shape:
            raise ValueError(f"residual has shape {tuple(residual.shape)} but x has {tuple(x.shape)}; they must "
                             "match (h = residual + gate * x)")
        gate = None if gate is None else _per_sample("gate", gate, x, "x")
    scale = _per_sample("scale", scale, x, "x")
    shift = _per_sample("shift", shift, x, "x")
    if not torch.compiler.is_compiling() and (
            isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0):
        raise ValueError(f"eps is {eps!r}; supported: a finite number >= 0")
    if residual is not None:
        y, h, _, _ = _ada_ln_res_fwd(x, residual, gate, scale, shift, float(eps))
        return y, h
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

def layer_norm_modulate(norm, x, scale, shift, residual=None, gate=None):
    """Exactly diffusers' ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` for a torch.nn.LayerNorm
    ``norm`` over the last dim, in one kernel: AdaLayerNormZero's ``self.norm`` (non-affine, eps 1e-6;
    its FP32LayerNorm variant too: the kernel computes in fp32 anyway) and BasicTransformerBlock's
    ``norm3`` with ``scale_mlp`` / ``shift_mlp`` (affine or not, eps=norm_eps).

    An affine norm is folded into the modulation vectors (B x D work, in fp32, differentiable):
    (x_hat * w + b) * (1 + s) + t = x_hat * (1 + s') + t' with s' = w (1 + s) - 1, t' = b (1 + s) + t.
    x: (batch, tokens, dim); scale, shift: (batch, dim).

    With ``residual`` (and ``gate``), ``norm`` is applied to ``h = residual + gate * x`` as in
    ``ada_layer_norm``'s residual form, and the result is ``(y, h)``: BasicTransformerBlock's
    ``h = gate_msa[:, None] * attn_out + h; n = norm3(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]``
    is ``n, h = layer_norm_modulate(norm3, attn_out, scale_mlp, shift_mlp, residual=h, gate=gate_msa)``.
    """
    if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
        raise ValueError(f"norm is {norm!r}; supported: a torch.nn.LayerNorm over the last dim")
    weight, bias = norm.weight, norm.bias
    if weight is None and bias is None:
        return ada_layer_norm(x, scale, shift, norm.eps, residual, gate)
    one_s = 1 + scale.float()
    scale_f = one_s * weight.float() - 1 if weight is not None else scale.float()
    shift_f = shift.float() + one_s * bias.float() if bias is not None else shift.float()
    # The folded vectors in the dtype diffusers' expression ends in (promote of scale, shift, w, b), so
    # the output dtype is its promote(x, ...) too.
    dtype = functools.reduce(torch.promote_types, [p.dtype for p in (weight, bias, shift) if p is not None],
                             scale.dtype)
    return ada_layer_norm(x, scale_f.to(dtype), shift_f.to(dtype), norm.eps, residual, gate)


def ada_layer_norm_zero_forward(module, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
    """diffusers' ``AdaLayerNormZero.forward`` (same arguments, same outputs ``(x, gate_msa, shift_mlp,
    scale_mlp, gate_mlp)``) with the modulation in one kernel; a patch can bind it as the module's
    forward. The embedding path (``emb``, SiLU, Linear, chunk) is diffusers' own code."""
    if module.emb is not None:
        emb = module.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    emb = module.linear(module.silu(emb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    return layer_norm_modulate(module.norm, x, scale_msa, shift_msa), gate_msa, shift_mlp, scale_mlp, gate_mlp
