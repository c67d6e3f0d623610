"""Sinusoidal timestep embeddings (DDPM's, diffusers' ``get_timestep_embedding``) in one kernel.

diffusers builds the embedding of a batch of timesteps from ~11 small ops (arange, two scalar multiplies, exp,
the outer product, sin, cos, two concatenations, the cast of integer timesteps). DiT-XL/2 evaluates it in each of
its 28 blocks' AdaLayerNormZero and in its output norm, so a denoising step spends ~300 launches on it: in a CUDA
graph ~2 us each (kernel and gap) for a few KB of work.

For timesteps t (N,), half = dim // 2, and column j < half:

    freq_j = exp((j * -ln(max_period)) * (1 / (half - downscale_freq_shift)))
    arg_ij = scale * (t_i * freq_j)
    out_i  = [sin(arg_i), cos(arg_i)]    ([cos, sin] with flip_sin_to_cos; one zero column more for an odd dim)

in fp32, in diffusers' order of operations as torch runs them on CUDA (the division by a Python scalar is a
multiplication by its fp32 reciprocal there, as in PyTorch's div_true kernel), every product rounded on its own
(no FMA contraction), sin / cos / exp from libdevice (CUDA's sinf / cosf / expf). Layers: kernel -> launcher
``timestep_embedding_forward`` -> torch.library op ``flashfuse::timestep_embedding`` through ``FlashfuseOp`` ->
``timestep_embedding``. Differentiable in floating timesteps (the backward is a few torch ops on an (N, dim / 2)
tensor).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra import libdevice

from .._checks import check_tensor
from ._custom_op import FlashfuseOp
from ._triton import IN_INTERPRETER, cdiv

# Timesteps x frequencies per program, 2 per thread on 4 warps: libdevice's sin / cos take 100s of instructions
# each, so a (32, 256) embedding over 32 programs (DiT's batch) instead of 2 (16 x 256 tiles: 12.8 us, H100).
BLOCK_M, BLOCK_J, NUM_WARPS = 4, 64, 4


@triton.jit
def _sin_cos_exp(x, OP: tl.constexpr):
    """sin / cos / exp of fp32 x as CUDA's sinf / cosf / expf (libdevice); numpy's in the interpreter."""
    if IN_INTERPRETER:
        if OP == "sin":
            return tl.sin(x)
        elif OP == "cos":
            return tl.cos(x)
        else:
            return tl.exp(x)
    else:
        if OP == "sin":
            return libdevice.sin(x)
        elif OP == "cos":
            return libdevice.cos(x)
        else:
            return libdevice.exp(x)


@triton.jit
def _timestep_embedding_kernel(
    T, OUT,  # T: [N] any real dtype, stride_t apart; OUT: [N, dim] fp32, contiguous
    n_rows, stride_t, half, dim, neg_log_max_period, inv_denominator, scale,
    FLIP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr,
):
    """Program (m, j, part): rows [m * BLOCK_M, ...), frequencies [j * BLOCK_J, ...), and one function of them,
    written to the first (part 0) or second (part 1) `half` columns: sin then cos (cos then sin with FLIP). Each
    program evaluates one of sin / cos (libdevice's are ~100s of instructions with their range reduction); part 1's
    first program also writes an odd dim's zero column."""
    o_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)                   # [BLOCK_M] timesteps
    o_j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)                   # [BLOCK_J] frequency index
    part = tl.program_id(2)
    m_m = o_m < n_rows
    j = tl.where(o_j < half, o_j, 0).to(tl.float32)                           # (masked lanes: frequency 0's)
    freq = _sin_cos_exp((j * neg_log_max_period) * inv_denominator, "exp")
    t = tl.load(T + o_m * stride_t, mask=m_m, other=0).to(tl.float32)          # timesteps.float()
    arg = scale * (t[:, None] * freq[None, :])                                 # [BLOCK_M, BLOCK_J]
    if (part == 0) != FLIP:
        out = _sin_cos_exp(arg, "sin")
    else:
        out = _sin_cos_exp(arg, "cos")
    p_out = OUT + o_m[:, None] * dim + part * half
    tl.store(p_out + o_j[None, :], out, mask=m_m[:, None] & (o_j < half)[None, :])
    if (part == 1) & (tl.program_id(1) == 0) & (dim > 2 * half):
        tl.store(OUT + o_m * dim + 2 * half, tl.zeros([BLOCK_M], dtype=tl.float32), mask=m_m)


def _constants(dim: int, downscale_freq_shift: float, scale: float, max_period: float):
    """The fp32 scalars torch's ops use: -ln(max_period) and scale as fp32, and the fp32 reciprocal of
    (half - downscale_freq_shift) computed in fp32 (PyTorch's CUDA division by a Python scalar)."""
    half = dim // 2
    inv = np.float32(1.0) / np.float32(half - downscale_freq_shift)
    return half, float(np.float32(-math.log(max_period))), float(inv), float(np.float32(scale))


def timestep_embedding_forward(timesteps: Tensor, dim: int, flip_sin_to_cos: bool, downscale_freq_shift: float,
                               scale: float, max_period: float) -> Tensor:
    """(N,) timesteps -> (N, dim) fp32 embedding, contiguous."""
    n_rows = timesteps.shape[0]
    out = torch.empty((n_rows, dim), dtype=torch.float32, device=timesteps.device)
    if n_rows == 0 or dim == 0:
        return out
    half, neg_log, inv_denominator, scale_f = _constants(dim, downscale_freq_shift, scale, max_period)
    _timestep_embedding_kernel[(cdiv(n_rows, BLOCK_M), max(1, cdiv(half, BLOCK_J)), 2)](
        timesteps, out, n_rows, timesteps.stride(0), half, dim, neg_log, inv_denominator, scale_f,
        FLIP=bool(flip_sin_to_cos), BLOCK_M=BLOCK_M, BLOCK_J=BLOCK_J, num_warps=NUM_WARPS,
        enable_fp_fusion=False)
    return out


def _fwd_impl(timesteps: Tensor, dim: int, flip_sin_to_cos: bool, downscale_freq_shift: float, scale: float,
              max_period: float) -> Tensor:
    return timestep_embedding_forward(timesteps, dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period)


def _fwd_fake(timesteps, dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period):
    return timesteps.new_empty((timesteps.shape[0], dim), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    timesteps, dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period = inputs
    ctx.save_for_backward(timesteps)
    ctx.args = (dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period)


def _backward(ctx, dout):
    """d out / d t: d sin(a) = cos(a) scale freq, d cos(a) = -sin(a) scale freq (a = scale t freq)."""
    (timesteps,) = ctx.saved_tensors
    dim, flip, shift, scale, max_period = ctx.args
    half = dim // 2
    j = torch.arange(half, dtype=torch.float32, device=timesteps.device)
    freq = torch.exp(-math.log(max_period) * j / (half - shift))
    arg = scale * (timesteps.float()[:, None] * freq[None, :])
    d_first, d_second = dout[:, :half].float(), dout[:, half:2 * half].float()
    d_sin, d_cos = (d_second, d_first) if flip else (d_first, d_second)
    dt = ((d_sin * torch.cos(arg) - d_cos * torch.sin(arg)) * (scale * freq)[None, :]).sum(1)
    return dt.to(timesteps.dtype), None, None, None, None, None


_timestep_embedding = FlashfuseOp("flashfuse::timestep_embedding", _fwd_impl, fake=_fwd_fake,
                                  setup_context=_setup_context, backward=_backward)


def timestep_embedding(timesteps, dim, flip_sin_to_cos=False, downscale_freq_shift=1.0, scale=1.0,
                       max_period=10000):
    """Sinusoidal timestep embeddings, diffusers' ``get_timestep_embedding`` (same arguments, same (N, dim)
    float32 output; the ``Timesteps`` module's forward) in one kernel.

    timesteps: (N,) integer or floating tensor (fractional timesteps allowed), any stride; dim >= 1. Columns:
    sin then cos of ``scale * t * exp(-ln(max_period) j / (dim // 2 - downscale_freq_shift))`` for j < dim // 2
    (cos then sin with ``flip_sin_to_cos``), a zero column last for an odd dim. Computed in fp32 in diffusers'
    order of operations as torch runs them on CUDA (see the module docstring); differentiable in floating
    timesteps.

    Example::

        t_emb = timestep_embedding(torch.tensor([999, 500], device="cuda"), 256, flip_sin_to_cos=True)
    """
    check_tensor("timesteps", timesteps, ndims=(1,), dtypes=None)
    if timesteps.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise TypeError(f"timesteps has dtype {timesteps.dtype}; supported: integer or floating timesteps")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim is {dim!r}; supported: an int >= 1")
    half = dim // 2
    for name, v in (("downscale_freq_shift", downscale_freq_shift), ("scale", scale), ("max_period", max_period)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} is {v!r}; supported: a finite number")
    if max_period <= 0:
        raise ValueError(f"max_period is {max_period!r}; supported: a number > 0")
    if half > 0 and half == downscale_freq_shift:
        raise ValueError(f"downscale_freq_shift is {downscale_freq_shift!r} = dim // 2; the frequencies divide "
                         "by dim // 2 - downscale_freq_shift")
    return _timestep_embedding(timesteps, dim, bool(flip_sin_to_cos), float(downscale_freq_shift), float(scale),
                               float(max_period))
