"""Norm modules, drop-ins for HF's LlamaRMSNorm / GemmaRMSNorm and torch.nn.LayerNorm (same parameter
names, so state dicts load unchanged), running flashfuse's Triton kernels forward and backward.

Both take an optional ``residual``: ``norm(x, residual)`` returns ``(norm(x + residual), x + residual)``
(the fused add of a pre-norm transformer block).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.norm import CASTING_MODES, layer_norm, rms_norm


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * (offset + weight)``.

    hidden_size: size of the last dim; eps as HF's ``variance_epsilon`` (also readable under that name).
    offset=1.0 with casting_mode="gemma" is GemmaRMSNorm (weight initialized to zeros, applied as
    1 + weight); the defaults (offset 0, "llama") are LlamaRMSNorm (weight initialized to ones). See
    flashfuse.ops.norm.rms_norm for the casting modes.

    Example::

        norm = RMSNorm(4096, eps=1e-6, device="cuda", dtype=torch.bfloat16)
        y = norm(x)                      # x (..., 4096)
        y, h = norm(x, residual=h)       # h <- x + h, y = norm(h)
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, offset: float = 0.0, casting_mode: str = "llama",
                 device=None, dtype=None):
        super().__init__()
        if casting_mode not in CASTING_MODES:
            raise ValueError(f"casting_mode is {casting_mode!r}; supported: "
                             f"{', '.join(map(repr, CASTING_MODES))}")
        self.hidden_size = hidden_size
        self.eps = eps
        self.offset = offset
        self.casting_mode = casting_mode
        # offset + weight starts at 1: ones when offset is 0 (Llama), zeros when offset is 1 (Gemma).
        init = torch.zeros if offset == 1.0 else torch.ones
        self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))

    @property
    def variance_epsilon(self) -> float:
        """HF LlamaRMSNorm's name for eps."""
        return self.eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual, offset=self.offset, casting_mode=self.casting_mode)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, casting_mode={self.casting_mode!r}"


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm (same constructor, parameters and state dict) with a Triton forward/backward and
    an optional fused residual add. A multi-dim ``normalized_shape`` normalizes the trailing dims as one.

    Example::

        ln = LayerNorm(768, device="cuda", dtype=torch.bfloat16)
        y = ln(x)                        # x (..., 768)
        y, h = ln(x, residual=h)
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias,
                         device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        shape = tuple(self.normalized_shape)
        k = len(shape)
        if tuple(x.shape[x.dim() - k:]) != shape or x.dim() < k:
            raise ValueError(f"x has shape {tuple(x.shape)}; its last {k} dim(s) must equal normalized_shape "
                             f"{shape}")
        if k == 1:
            return layer_norm(x, self.weight, self.bias, self.eps, residual)
        n = math.prod(shape)
        flat = x.shape[:x.dim() - k] + (n,)
        weight = None if self.weight is None else self.weight.reshape(n)
        bias = None if self.bias is None else self.bias.reshape(n)
        if residual is not None and residual.shape != x.shape:
            raise ValueError(f"residual has shape {tuple(residual.shape)} but x has {tuple(x.shape)}; "
                             "they must match")
        out = layer_norm(x.reshape(flat), weight, bias, self.eps,
                         None if residual is None else residual.reshape(flat))
        if residual is None:
            return out.view(x.shape)
        return out[0].view(x.shape), out[1].view(x.shape)
