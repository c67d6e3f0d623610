"""Plain PyTorch RMSNorm and LayerNorm, readable like a textbook. Tests and benchmarks compare the
Triton kernels (flashfuse.ops.norm) with them; autograd gives the reference gradients.

For one row s of N numbers (s = x + residual when a residual is fused, else s = x):

    RMSNorm:    x_hat = s / sqrt(mean(s^2) + eps)
    LayerNorm:  x_hat = (s - mean(s)) / sqrt(mean((s - mean(s))^2) + eps)     (biased variance)
    y = x_hat * (offset + weight) + bias

Arithmetic happens in fp32 (or float64 when the inputs are float64, for exact references).
RMSNorm casting modes, as in HF transformers:
    "llama": x_hat is rounded to x's dtype, then multiplied by the weight (LlamaRMSNorm:
             ``weight * x_hat.to(input_dtype)``); output dtype promote(x.dtype, weight.dtype).
    "gemma": the weight multiply happens in fp32 too, one rounding to x's dtype at the end
             (GemmaRMSNorm: ``(x_hat * (1 + weight.float())).type_as(x)``).
"""

from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def rms_norm_ref(x, weight=None, eps=1e-6, residual=None, *, offset=0.0, casting_mode="llama"):
    """x: (..., hidden); weight: (hidden,) or None; residual: like x. Returns y, or (y, x + residual)."""
    s = x if residual is None else x + residual            # the residual stream, in x's dtype
    h = s.to(_compute_dtype(x))
    x_hat = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if casting_mode == "llama":
        y = x_hat.to(x.dtype)
        if weight is not None:
            out_dtype = torch.promote_types(x.dtype, weight.dtype)
            y = ((offset + weight.to(_compute_dtype(x))) * y.to(_compute_dtype(x))).to(out_dtype)
    else:
        y = x_hat if weight is None else x_hat * (offset + weight.to(_compute_dtype(x)))
        y = y.to(x.dtype)
    return y if residual is None else (y, s)


def layer_norm_ref(x, weight=None, bias=None, eps=1e-5, residual=None):
    """x: (..., hidden); weight, bias: (hidden,) or None; residual: like x. Returns y, or (y, x + residual)."""
    s = x if residual is None else x + residual
    h = s.to(_compute_dtype(x))
    mean = h.mean(-1, keepdim=True)
    var = (h - mean).pow(2).mean(-1, keepdim=True)
    y = (h - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.to(h.dtype)
    if bias is not None:
        y = y + bias.to(h.dtype)
    y = y.to(x.dtype)
    return y if residual is None else (y, s)
