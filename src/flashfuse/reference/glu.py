"""Gated linear units in plain PyTorch, readable like a textbook. Tests and benchmarks compare the
Triton kernels in ``ops/glu.py`` with these.

A gated MLP (Llama, Mistral, Qwen: SwiGLU; Gemma: GeGLU) projects x twice, to a gate g and an up u,
and multiplies elementwise:

    h = act(g) * u

    SwiGLU:  act(g) = silu(g) = g * sigmoid(g)
    GeGLU:   act(g) = gelu(g) = g * Phi(g),  Phi(g) = (1 + erf(g / sqrt(2))) / 2    (approximate="none")
                                                    = erfc(-g / sqrt(2)) / 2 (no cancellation for g << 0)
             act(g) ~ g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 g^3))) / 2         (approximate="tanh")

Backward (vector-Jacobian product), for an incoming gradient dh:

    du = dh * act(g)
    dg = dh * u * act'(g)

    silu'(g)      = s * (1 + g * (1 - s)),                     s = sigmoid(g)
    gelu'(g)      = Phi(g) + g * phi(g),                       phi(g) = exp(-g^2 / 2) / sqrt(2 pi)
    gelu_tanh'(g) = (1 + t) / 2 + g / 2 * (1 - t^2) * sqrt(2 / pi) * (1 + 3 * 0.044715 g^2),
                    t = tanh(sqrt(2 / pi) * (g + 0.044715 g^3))

Everything computes in at least fp32 (float64 stays float64) and the result is rounded to the input
dtype once, as the kernels do.
"""

from __future__ import annotations

import math

import torch

APPROXIMATIONS = ("none", "tanh")
GELU_TANH_COEF = 0.044715                 # the cubic term of the tanh approximation (Hendrycks & Gimpel)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def silu(g):
    return g * torch.sigmoid(g)


def gelu(g, approximate: str = "none"):
    if approximate == "tanh":
        return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + GELU_TANH_COEF * g ** 3)))
    return 0.5 * g * torch.erfc(-g / math.sqrt(2.0))             # = (1 + erf(g / sqrt 2)) / 2, no cancellation


def silu_grad(g):
    s = torch.sigmoid(g)
    return s * (1.0 + g * (1.0 - s))


def gelu_grad(g, approximate: str = "none"):
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        t = torch.tanh(k * (g + GELU_TANH_COEF * g ** 3))
        return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * GELU_TANH_COEF * g * g)
    phi = torch.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)
    return 0.5 * torch.erfc(-g / math.sqrt(2.0)) + g * phi


def swiglu_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up; gate, up: (..., intermediate). Differentiable (plain torch ops)."""
    dt = _compute_dtype(gate)
    return (silu(gate.to(dt)) * up.to(dt)).to(gate.dtype)


def geglu_ref(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(gate) * up, exact (erf) or tanh-approximated GELU; gate, up: (..., intermediate)."""
    dt = _compute_dtype(gate)
    return (gelu(gate.to(dt), approximate) * up.to(dt)).to(gate.dtype)


def glu_backward_ref(dout, gate, up, activation: str = "silu"):
    """(dgate, dup) by the formulas above; activation in "silu", "gelu", "gelu_tanh"."""
    dt = _compute_dtype(gate)
    dh, g, u = dout.to(dt), gate.to(dt), up.to(dt)
    if activation == "silu":
        act, act_grad = silu(g), silu_grad(g)
    else:
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        act, act_grad = gelu(g, approximate), gelu_grad(g, approximate)
    return (dh * u * act_grad).to(gate.dtype), (dh * act).to(up.dtype)
