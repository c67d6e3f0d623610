"""Generic forwards of ``patch_diffusers`` for small modules, bound per instance by diffusers.py's table (importing this
module does not import diffusers): the feed-forward activations (its ``geglu`` flag: GEGLU / SwiGLU as the projection
and one fused gated-activation kernel, GELU(approximate="tanh") as one GEMM with a bias + GELU epilogue) and the
sinusoidal ``Timesteps`` embedding as one kernel (its ``embeddings`` flag)."""

from __future__ import annotations

import torch
from torch import nn

from .._env import INTERPRET
from ..nn.mlp import gated_activation
from ..ops.embeddings import timestep_embedding
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


def _timesteps_forward(self, timesteps, *args, **kwargs):
    """diffusers' Timesteps: get_timestep_embedding(timesteps, num_channels, flip_sin_to_cos, downscale_freq_shift,
    scale) as one kernel (flashfuse.ops.embeddings; ~11 small ops in diffusers, evaluated in every DiT block).
    Timesteps that need a gradient, are not 1-D or are on the CPU outside the interpreter keep diffusers'
    forward."""
    on_device = isinstance(timesteps, torch.Tensor) and (
        timesteps.is_cuda or (INTERPRET and timesteps.device.type == "cpu"))
    if (args or kwargs or not on_device or timesteps.dim() != 1 or timesteps.dtype == torch.bool
            or timesteps.is_complex() or (timesteps.requires_grad and torch.is_grad_enabled())):
        return type(self).forward(self, timesteps, *args, **kwargs)
    return timestep_embedding(timesteps, self.num_channels, self.flip_sin_to_cos, self.downscale_freq_shift,
                              self.scale)


def _timesteps_check(module) -> str | None:
    if not all(hasattr(module, name) for name in ("num_channels", "flip_sin_to_cos", "downscale_freq_shift", "scale")):
        return "a Timesteps without num_channels / flip_sin_to_cos / downscale_freq_shift / scale"
    if module.num_channels // 2 == module.downscale_freq_shift:
        return "num_channels // 2 == downscale_freq_shift (diffusers divides by zero there)"
    return None
