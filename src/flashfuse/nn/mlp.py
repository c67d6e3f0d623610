"""MLP modules, drop-ins for HF / timm MLP blocks.

Gated MLPs (``SwiGLUMLP``, ``GeGLUMLP``) run their projections on cuBLAS (``F.linear``) and the gated
activation as one fused elementwise kernel (``swiglu`` / ``geglu``, forward and backward at copy bandwidth).
The alternative, the activation in the epilogue of flashfuse's Triton matmul (``gated_mlp``), keeps
act(G) * U out of HBM but its matmuls trail cuBLAS: on an H200 (bf16, 8192 x 4096 -> 14336) the fused
gate/up projection took 3.39 ms forward and 9.23 ms forward+backward against 3.01 / 8.88 ms for cuBLAS
plus eager PyTorch's two-kernel activation in the same run, so the epilogue does not pay there.
``FusedMLP`` (Linear -> GELU -> Linear) keeps the epilogue-fused matmuls (``fused_mlp``).

Parameter names match the modules they replace, so their state dicts load unchanged:
``SwiGLUMLP`` / ``GeGLUMLP``: ``gate_proj``, ``up_proj``, ``down_proj`` (HF LlamaMLP, MistralMLP, Qwen2MLP,
GemmaMLP); ``FusedMLP``: ``fc1``, ``fc2`` (timm / ViT / DiT ``Mlp``; GPT-2's Conv1D weights are the
transposes: ``fc1.weight = c_fc.weight.t()``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.glu import geglu, swiglu
from ..ops.matmul import GATED_ACTIVATIONS, fused_mlp


def gated_activation(gate, up, activation: str):
    """act(gate) * up for a GATED_ACTIVATIONS name, one fused kernel (gate / up may be views of one tensor)."""
    if activation == "swiglu":
        return swiglu(gate, up)
    return geglu(gate, up, approximate="tanh" if activation == "geglu_tanh" else "none")

_PLAIN = ("gelu", "gelu_tanh", "silu", "relu")


class _GateUpProjection(torch.autograd.Function):
    """(gate, up) = (x W_g^T + b_g, x W_u^T + b_u): two cuBLAS GEMMs reading one input.

    Backward: dx = dgate W_g + dup W_u as one GEMM plus one GEMM accumulating into its output (cuBLAS
    beta = 1: one extra read of dx in the epilogue), where autograd would write both products and sum them
    in a separate (tokens, hidden) elementwise pass (read 2, write 1). Llama-3.2-1B at 32768 tokens: that
    pass is 3 x 134 MB per layer. dW_g = dgate^T x, dW_u = dup^T x, db = column sums, as F.linear's.
    """

    @staticmethod
    def forward(ctx, x, w_gate, b_gate, w_up, b_up):
        ctx.save_for_backward(x, w_gate, w_up)
        ctx.has_bias = (b_gate is not None, b_up is not None)
        return F.linear(x, w_gate, b_gate), F.linear(x, w_up, b_up)

    @staticmethod
    def backward(ctx, d_gate, d_up):
        x, w_gate, w_up = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])                                      # (tokens, hidden)
        grads = [(d.reshape(-1, d.shape[-1]) if d is not None else None) for d in (d_gate, d_up)]
        dx = None
        if ctx.needs_input_grad[0]:
            for d, w in zip(grads, (w_gate, w_up)):
                if d is not None:
                    dx = torch.mm(d, w) if dx is None else dx.addmm_(d, w)   # (tokens, hidden)
            dx = dx.view(x.shape) if dx is not None else None
        out = [dx]
        for d, has_bias, i in zip(grads, ctx.has_bias, (1, 3)):
            out.append(d.t().mm(x2) if d is not None and ctx.needs_input_grad[i] else None)
            out.append(d.sum(0) if d is not None and has_bias and ctx.needs_input_grad[i + 1] else None)
        return tuple(out)


def gate_up_projection(x, gate_proj: nn.Linear, up_proj: nn.Linear):
    """(gate_proj(x), up_proj(x)), with the one-pass input gradient of ``_GateUpProjection`` where it
    applies (input and weights of one dtype, no autocast); otherwise two F.linear calls."""
    w_gate, w_up = gate_proj.weight, up_proj.weight
    if (x.dtype == w_gate.dtype == w_up.dtype and not torch.is_autocast_enabled(x.device.type)
            and torch.is_grad_enabled() and (x.requires_grad or w_gate.requires_grad or w_up.requires_grad)):
        return _GateUpProjection.apply(x, w_gate, gate_proj.bias, w_up, up_proj.bias)
    return F.linear(x, w_gate, gate_proj.bias), F.linear(x, w_up, up_proj.bias)


class _GatedMLP(nn.Module):
    activation: str

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x):
        gate, up = gate_up_projection(x, self.gate_proj, self.up_proj)
        return F.linear(gated_activation(gate, up, self.activation), self.down_proj.weight, self.down_proj.bias)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class SwiGLUMLP(_GatedMLP):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``: HF LlamaMLP / MistralMLP / Qwen2MLP.

    x (..., hidden_size) -> (..., hidden_size). Example::

        mlp = SwiGLUMLP(4096, 14336, device="cuda", dtype=torch.bfloat16)
        mlp.load_state_dict(llama_layer.mlp.state_dict())
    """

    activation = "swiglu"


class GeGLUMLP(_GatedMLP):
    """``down_proj(gelu(gate_proj(x)) * up_proj(x))``: HF GemmaMLP (approximate="tanh", Gemma's
    gelu_pytorch_tanh) or the erf GELU (approximate="none").

    Example::

        mlp = GeGLUMLP(3072, 24576, approximate="tanh", device="cuda", dtype=torch.bfloat16)
    """

    def __init__(self, hidden_size: int, intermediate_size: int, approximate: str = "tanh", bias: bool = False,
                 device=None, dtype=None):
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate is {approximate!r}; supported: 'tanh', 'none'")
        super().__init__(hidden_size, intermediate_size, bias, device, dtype)
        self.approximate = approximate
        self.activation = "geglu_tanh" if approximate == "tanh" else "geglu"


class FusedMLP(nn.Module):
    """``fc2(act(fc1(x)))`` with the bias and activation in fc1's matmul epilogue (one op, fwd + bwd).

    in_features -> hidden_features -> out_features (default in_features); activation in "gelu",
    "gelu_tanh" (GPT-2's gelu_new), "silu", "relu". Example::

        mlp = FusedMLP(768, 3072, activation="gelu_tanh", device="cuda", dtype=torch.bfloat16)
        y = mlp(torch.randn(8, 1024, 768, device="cuda", dtype=torch.bfloat16))
    """

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 activation: str = "gelu_tanh", bias: bool = True, device=None, dtype=None):
        super().__init__()
        if activation not in _PLAIN:
            hint = " (gated ones: use SwiGLUMLP / GeGLUMLP)" if activation in GATED_ACTIVATIONS else ""
            raise ValueError(f"activation is {activation!r}; supported: {', '.join(map(repr, _PLAIN))}{hint}")
        out_features = out_features or in_features
        self.activation = activation
        self.fc1 = nn.Linear(in_features, hidden_features, bias=bias, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden_features, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x):
        return fused_mlp(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, self.activation)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
