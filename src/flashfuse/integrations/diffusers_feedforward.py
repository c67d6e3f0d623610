"""The feed-forward activations of ``patch_diffusers`` (its ``geglu`` flag): GEGLU / SwiGLU as the projection and one
fused gated-activation kernel, GELU(approximate="tanh") as one GEMM with a bias + GELU epilogue. Generic forwards bound
per instance by diffusers.py's table; importing this module does not import diffusers."""

from __future__ import annotations

import torch
from torch import nn

from ..nn.mlp import gated_activation
from .diffusers_attention import _kernel_ok


def _geglu_forward(self, hidden_states, *args, **kwargs):
    """GEGLU / SwiGLU: proj -> [hidden; gate] -> hidden * act(gate): the projection on cuBLAS, then one fused
    gated-activation kernel on the two halves of its output (views, no copies)."""
    if args or kwargs.get("scale") is not None or not _kernel_ok(hidden_states):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    up, gate = self.proj(hidden_states).chunk(2, dim=-1)
    return gated_activation(gate, up, self._flashfuse_act)


def _gelu_tanh_forward(self, hidden_states, *args, **kwargs):
    """diffusers' GELU(approximate="tanh"): proj then the tanh GELU as one cuBLASLt GEMM with a bias + GELU epilogue
    (on CUDA, torch._addmm_activation computes the tanh form, through the epilogue or, where cuBLASLt does not
    apply, a GEMM then gelu(approximate="tanh")). Inputs that need a gradient, CPU tensors, other dtypes than the
    projection's, keep diffusers' forward."""
    proj = self.proj
    if (args or kwargs or not hidden_states.is_cuda or hidden_states.dtype != proj.weight.dtype
            or (torch.is_grad_enabled() and (hidden_states.requires_grad or proj.weight.requires_grad
                                             or proj.bias.requires_grad))):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    rows = hidden_states.reshape(-1, hidden_states.shape[-1])
    out = torch._addmm_activation(proj.bias, rows, proj.weight.t(), use_gelu=True)
    return out.view(*hidden_states.shape[:-1], out.shape[-1])


def _gelu_tanh_check(module) -> str | None:
    if type(module.proj) is not nn.Linear or module.proj.bias is None:
        return f"proj is {module.proj!r}, not a Linear with a bias"
    if getattr(module, "approximate", None) != "tanh":
        return f"approximate={getattr(module, 'approximate', None)!r} (the GEMM epilogue computes the tanh GELU)"
    return None


def _proj_check(module) -> str | None:
    if type(module.proj) is not nn.Linear:
        return f"proj is {type(module.proj).__name__}, not Linear (a LoRA or quantized layer)"
    name = type(module).__name__
    if name == "SwiGLU" and type(module.activation) is not nn.SiLU:
        return f"activation {module.activation!r}"
    return None


def _proj_activation(module) -> str:
    """diffusers' GEGLU is the exact (erf) GELU; SwiGLU's activation is SiLU (checked by _proj_check)."""
    return {"GEGLU": "geglu", "SwiGLU": "swiglu"}[type(module).__name__]
