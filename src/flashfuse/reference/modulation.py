"""Plain PyTorch adaptive LayerNorm (DiT's adaLN-Zero modulation) and its gated residual, readable like a
textbook. Tests and benchmarks compare the Triton kernels (flashfuse.ops.modulation) with them.

x: (B, T, D) tokens; scale, shift, gate: (B, D) or (B, 1, D), one vector per sample (a batch dim of 1
broadcasts over the batch), computed from the timestep / class embedding.

    x_hat = (x - mean(x)) / sqrt(var(x) + eps)          over D, biased variance, no affine weights
    ada_layer_norm(x, scale, shift)  = x_hat * (1 + scale) + shift
    ada_layer_norm_gate(residual, gate, y) = residual + gate * y
    ada_layer_norm(x, scale, shift, residual=r, gate=g) = (ada_layer_norm(h, scale, shift), h)
        with h = ada_layer_norm_gate(r, g, x)   (r + x without a gate)

Arithmetic happens in fp32 (float64 for float64 inputs), one rounding to the output dtype
promote(x, scale, shift) (promote(residual, gate, y) for the gate) at the end.

``basic_transformer_block_modulation_ref`` is diffusers' own expression, rounding after every step as it
does, for the equality tests of the drop-in helpers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _compute_dtype(*ts: torch.Tensor) -> torch.dtype:
    dtype = torch.float32
    for t in ts:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _per_sample(v: torch.Tensor) -> torch.Tensor:
    """(B, D) or (B, 1, D) -> (B, 1, D), broadcasting over the T tokens."""
    return v[:, None, :] if v.dim() == 2 else v


def ada_layer_norm_ref(x, scale, shift, eps=1e-6, residual=None, gate=None):
    """x: (B, T, D); scale, shift: (B, D) or (B, 1, D). Returns LN(x) * (1 + scale) + shift.

    With residual (B, T, D) (and gate, scale's shapes, or None for 1): the LayerNorm's input is the new
    residual stream h = residual + gate * x, rounded once to promote(residual, gate, x); returns (y, h)."""
    if residual is not None:
        if gate is None:
            dtype = _compute_dtype(residual, x)
            h = (residual.to(dtype) + x.to(dtype)).to(torch.promote_types(residual.dtype, x.dtype))
        else:
            h = ada_layer_norm_gate_ref(residual, gate, x)
        return ada_layer_norm_ref(h, scale, shift, eps), h
    dtype = _compute_dtype(x, scale, shift)
    h = x.to(dtype)
    mean = h.mean(-1, keepdim=True)
    var = (h - mean).pow(2).mean(-1, keepdim=True)
    x_hat = (h - mean) * torch.rsqrt(var + eps)
    y = x_hat * (1 + _per_sample(scale).to(dtype)) + _per_sample(shift).to(dtype)
    return y.to(torch.promote_types(torch.promote_types(x.dtype, scale.dtype), shift.dtype))


def ada_layer_norm_gate_ref(residual, gate, y):
    """residual, y: (B, T, D); gate: (B, D) or (B, 1, D). Returns residual + gate * y."""
    dtype = _compute_dtype(residual, gate, y)
    out = residual.to(dtype) + _per_sample(gate).to(dtype) * y.to(dtype)
    return out.to(torch.promote_types(torch.promote_types(residual.dtype, gate.dtype), y.dtype))


def basic_transformer_block_modulation_ref(x, scale, shift, eps=1e-6, weight=None, bias=None):
    """diffusers' ``norm(x) * (1 + scale[:, None]) + shift[:, None]`` (AdaLayerNormZero, and
    BasicTransformerBlock's ada_norm_zero norm3 with an optional affine LayerNorm), in its own dtypes."""
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps) * (1 + scale[:, None]) + shift[:, None]
