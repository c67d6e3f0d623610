"""GroupNormAct: torch.nn.GroupNorm (same constructor, parameters and state dict) fused with an optional
activation and residual add, running flashfuse's Triton kernels forward and backward."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..ops.group_norm import group_norm

_ACTIVATIONS = (None, "silu", "mish", "gelu")


class GroupNormAct(nn.GroupNorm):
    """``act(GroupNorm(x + residual))``: a drop-in for ``nn.GroupNorm`` followed by ``nn.SiLU`` / ``nn.Mish`` /
    ``nn.GELU`` (diffusers' ResnetBlock2D norm + nonlinearity, with the time-embedding add fused in).

    num_groups, num_channels, eps, affine as torch.nn.GroupNorm; activation: None, "silu", "mish" or "gelu"
    (exact). forward(x, residual=None): x (N, C, *spatial) in NCHW or channels_last (kept), residual
    broadcastable to x (e.g. the time embedding (N, C, 1, 1)). See flashfuse.ops.group_norm.group_norm.

    Example::

        norm = GroupNormAct(32, 320, eps=1e-6, activation="silu", device="cuda", dtype=torch.float16)
        norm.load_state_dict(resnet.norm2.state_dict())
        h = norm(h, residual=temb[:, :, None, None])     # silu(norm2(h + temb))
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 activation: Optional[str] = None, device=None, dtype=None):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation is {activation!r}; supported: None, 'silu', 'mish', 'gelu'")
        super().__init__(num_groups, num_channels, eps=eps, affine=affine, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() >= 2 and x.shape[1] != self.num_channels:
            raise ValueError(f"x has {x.shape[1]} channels (x.shape[1]); this GroupNormAct expects "
                             f"{self.num_channels}")
        return group_norm(x, self.num_groups, self.weight, self.bias, self.eps, self.activation, residual)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation!r}"
