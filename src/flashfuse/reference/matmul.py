"""Plain PyTorch references for flashfuse.ops.matmul (tests and benchmarks compare against these).

    linear:      y = act(x W^T + b)
    gated:       y = act(x W_gate^T + b_gate) * (x W_up^T + b_up)
    fused_mlp:   y = fc2(act(fc1(x)))
    gated_mlp:   y = down(act(gate(x)) * up(x))
"""

from __future__ import annotations

import torch.nn.functional as F

ACTIVATIONS = {
    None: lambda z: z,
    "gelu": F.gelu,
    "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


def linear(x, weight, bias=None, activation=None, *, up_weight=None, up_bias=None):
    """act(x W^T + b); gated activations split a fused (2I, in) weight into [gate; up] rows unless
    up_weight is given."""
    if activation in GATED:
        if up_weight is None:
            gate_w, up_w = weight.chunk(2, dim=0)
            gate_b, up_b = (None, None) if bias is None else bias.chunk(2)
        else:
            gate_w, up_w, gate_b, up_b = weight, up_weight, bias, up_bias
        gate = F.linear(x, gate_w, gate_b)
        up = F.linear(x, up_w, up_b)
        return ACTIVATIONS[GATED[activation]](gate) * up
    return ACTIVATIONS[activation](F.linear(x, weight, bias))


def fused_mlp(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, activation="gelu_tanh"):
    return F.linear(linear(x, fc1_weight, fc1_bias, activation), fc2_weight, fc2_bias)


def gated_mlp(x, gate_weight, up_weight, down_weight, activation="swiglu", *, gate_bias=None, up_bias=None,
              down_bias=None):
    h = linear(x, gate_weight, gate_bias, activation, up_weight=up_weight, up_bias=up_bias)
    return F.linear(h, down_weight, down_bias)
