"""Plain PyTorch GroupNorm fused with a residual add and an activation, readable like a textbook. Tests and
benchmarks compare the Triton kernels (flashfuse.ops.group_norm) with it; autograd gives the reference
gradients.

For x of shape (N, C, *spatial) and G groups of C / G consecutive channels each:

    s = x + residual                                  (residual broadcast to x; rounded to x's dtype)
    for each sample n and group g (its C / G channels x all spatial positions):
        mean = average of s,   var = average of (s - mean)^2          (biased)
        x_hat = (s - mean) / sqrt(var + eps)
    z = x_hat * weight[c] + bias[c]                   (per channel)
    y = act(z),   act in {None, "silu", "mish", "gelu"}

Arithmetic happens in fp32 (or float64 when the inputs are float64, for exact references); the output
has x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _act(z: torch.Tensor, activation):
    if activation is None:
        return z
    if activation == "silu":
        return z * torch.sigmoid(z)
    if activation == "mish":
        return z * torch.tanh(F.softplus(z))
    if activation == "gelu":
        return 0.5 * z * (1 + torch.erf(z / 2 ** 0.5))
    raise ValueError(f"activation is {activation!r}; supported: None, 'silu', 'mish', 'gelu'")


def group_norm_ref(x, num_groups, weight=None, bias=None, eps=1e-5, activation=None, residual=None):
    """x: (N, C, *spatial); weight, bias: (C,) or None; residual broadcastable to x. Returns act(GN(x + r))."""
    s = x if residual is None else x + residual
    h = s.to(torch.promote_types(x.dtype, torch.float32))
    n, c = h.shape[:2]
    groups = h.reshape(n, num_groups, -1)             # a group: C / G channels x all positions, flattened
    mean = groups.mean(-1, keepdim=True)
    var = (groups - mean).pow(2).mean(-1, keepdim=True)
    x_hat = ((groups - mean) / torch.sqrt(var + eps)).reshape(h.shape)
    per_channel = (1, c) + (1,) * (h.dim() - 2)       # broadcast a (C,) parameter over N and the positions
    z = x_hat
    if weight is not None:
        z = z * weight.to(h.dtype).reshape(per_channel)
    if bias is not None:
        z = z + bias.to(h.dtype).reshape(per_channel)
    return _act(z, activation).to(x.dtype)
