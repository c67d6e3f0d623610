"""Linear layers with the bias and activation fused into the matmul epilogue, and the MLPs built on them.

Layers, top to bottom:
- public functions ``linear``, ``fused_mlp`` (Linear -> act -> Linear: GPT-2, ViT, DiT) and ``gated_mlp``
  (SwiGLU / GeGLU: Llama, Mistral, Qwen, Gemma) validate their arguments, then call one op;
- torch.library custom ops ``flashfuse::linear_fwd``, ``flashfuse::mlp_fwd`` and, for their backward,
  ``flashfuse::act_grad`` and ``flashfuse::matmul_act_grad``, with fake implementations and autograd
  formulas, so ``torch.compile(fullgraph=True)`` sees one op per layer (eager calls run the same
  functions without the dispatcher: ``FlashfuseOp``, see _custom_op.py);
- the launchers and kernels in matmul_details/_kernels.py.

Backward (Z = x W^T + b the pre-activation, Y = act(Z); gated: Y = act(G) * U):
    dZ = dY * act'(Z)              (gated: dG = dY * U * act'(G), dU = dY * act(G))
    dX = dZ W,   dW = dZ^T X,   db = sum_rows dZ
dZ comes from a Triton kernel: elementwise for a single ``linear`` (dY is given), or, inside an MLP, as the
epilogue of the matmul dA = dY2 W2 that produces its input, so dA never reaches HBM; that kernel also
recomputes A = act(Z) for fc2's weight gradient, so the forward saves only x and Z (the hidden activation
A is not kept alive between forward and backward). The three remaining matmuls (dX, dW, and fc2's dW)
have no epilogue to fuse: they go to torch.matmul (cuBLAS), which runs plain GEMMs at the hardware's
peak, and db is a column sum of dZ.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from .matmul_details._kernels import (ACTIVATIONS, GATED_ACTIVATIONS, act_grad, linear_forward,
                                      matmul_act_grad)

SUPPORTED = tuple(a for a in ACTIVATIONS if a is not None) + tuple(GATED_ACTIVATIONS)


# ----------------------------------------------------------------------------------------------------
# torch.library ops
# ----------------------------------------------------------------------------------------------------

def _linear_fwd_impl(x: Tensor, weight: Tensor, up_weight: Optional[Tensor], bias: Optional[Tensor],
                     up_bias: Optional[Tensor], activation: int, save_pre: bool) -> tuple[Tensor, Tensor]:
    out, pre = linear_forward(x, weight, bias, activation=activation, up_weight=up_weight, up_bias=up_bias,
                              save_pre=save_pre)
    return out, (pre if pre is not None else x.new_empty(0))


def _linear_fwd_fake(x, weight, up_weight, bias, up_bias, activation, save_pre):
    M, N = x.shape[0], weight.shape[0]
    pre_shape = (M, 2 * N if up_weight is not None else N) if save_pre else (0,)
    return x.new_empty((M, N)), x.new_empty(pre_shape)


def _mlp_fwd_impl(x: Tensor, w1: Tensor, up_weight: Optional[Tensor], b1: Optional[Tensor],
                  up_bias: Optional[Tensor], w2: Tensor, b2: Optional[Tensor], activation: int,
                  save_pre: bool) -> tuple[Tensor, Tensor]:
    h, pre = linear_forward(x, w1, b1, activation=activation, up_weight=up_weight, up_bias=up_bias,
                            save_pre=save_pre)
    out, _ = linear_forward(h, w2, b2)
    return out, (pre if pre is not None else x.new_empty(0))


def _mlp_fwd_fake(x, w1, up_weight, b1, up_bias, w2, b2, activation, save_pre):
    M, N = x.shape[0], w1.shape[0]
    pre_shape = (M, 2 * N if up_weight is not None else N) if save_pre else (0,)
    return x.new_empty((M, w2.shape[0])), x.new_empty(pre_shape)


def _act_grad_impl(dy: Tensor, pre: Tensor, activation: int, gated: bool) -> Tensor:
    return act_grad(dy, pre, activation=activation, gated=gated)


def _act_grad_fake(dy, pre, activation, gated):
    return pre.new_empty(pre.shape)


def _matmul_act_grad_impl(dy: Tensor, weight_t: Tensor, pre: Tensor, activation: int,
                          gated: bool) -> tuple[Tensor, Tensor]:
    return matmul_act_grad(dy, weight_t, pre, activation=activation, gated=gated)


def _matmul_act_grad_fake(dy, weight_t, pre, activation, gated):
    return pre.new_empty(pre.shape), dy.new_empty((dy.shape[0], weight_t.shape[0]))


# The backward's ops (no autograd of their own). Eager calls on plain tensors skip the custom-op
# dispatcher; torch.compile sees the custom ops (see _custom_op.py).
_act_grad = FlashfuseOp("flashfuse::act_grad", _act_grad_impl, fake=_act_grad_fake)
_matmul_act_grad = FlashfuseOp("flashfuse::matmul_act_grad", _matmul_act_grad_impl, fake=_matmul_act_grad_fake)


def _input_side_grads(needs, dpre, x, weight, up_weight):
    """(dx, dW, dWu, db, dbu) of z = x W^T + b [, u = x Wu^T + bu] from dpre = dz or [dz | du]."""
    gated = up_weight is not None
    n = weight.shape[0]
    dz, du = (dpre[:, :n], dpre[:, n:]) if gated else (dpre, None)
    dx = dw = dwu = db = dbu = None
    if needs[0]:
        dx = dz @ weight if not gated else torch.addmm(dz @ weight, du, up_weight)
    if needs[1]:
        dw = dz.t() @ x
    if gated and needs[2]:
        dwu = du.t() @ x
    if needs[3]:
        db = dz.sum(0)
    if gated and needs[4]:
        dbu = du.sum(0)
    return dx, dw, dwu, db, dbu


def _linear_setup(ctx, inputs, output):
    x, weight, up_weight, bias, up_bias, activation, save_pre = inputs
    ctx.activation = activation
    ctx.save_for_backward(x, weight, up_weight, output[1])


def _linear_backward(ctx, dout, _dpre):
    x, weight, up_weight, pre = ctx.saved_tensors
    dout = last_dim_contiguous(dout)
    if ctx.activation == 0 and up_weight is None:
        dpre = dout
    else:
        dpre = _act_grad(dout, pre, ctx.activation, up_weight is not None)
    return _input_side_grads(ctx.needs_input_grad, dpre, x, weight, up_weight) + (None, None)


_linear_fwd = FlashfuseOp("flashfuse::linear_fwd", _linear_fwd_impl, fake=_linear_fwd_fake,
                          setup_context=_linear_setup, backward=_linear_backward)


def _mlp_setup(ctx, inputs, output):
    x, w1, up_weight, b1, up_bias, w2, b2, activation, save_pre = inputs
    ctx.activation = activation
    ctx.save_for_backward(x, w1, up_weight, w2, output[1])


def _mlp_backward(ctx, dout, _dpre):
    x, w1, up_weight, w2, pre = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dout = last_dim_contiguous(dout)
    # one matmul: dA = dout @ W2, then dZ = dA * act'(Z) in its epilogue; h = act(Z) [* U] recomputed
    dpre, h = _matmul_act_grad(dout, w2.t(), pre, ctx.activation, up_weight is not None)
    dx, dw1, dwu, db1, dbu = _input_side_grads(needs[:5], dpre, x, w1, up_weight)
    dw2 = dout.t() @ h if needs[5] else None
    db2 = dout.sum(0) if needs[6] else None
    return dx, dw1, dwu, db1, dbu, dw2, db2, None, None


_mlp_fwd = FlashfuseOp("flashfuse::mlp_fwd", _mlp_fwd_impl, fake=_mlp_fwd_fake, setup_context=_mlp_setup,
                       backward=_mlp_backward)


# ----------------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------------

def _weight(name: str, w, in_features: int, dtype) -> Tensor:
    check_tensor(name, w, ndims=(2,))
    if w.dtype != dtype:
        raise TypeError(f"{name} has dtype {w.dtype} but x has {dtype}; all inputs must share one dtype")
    if w.shape[1] != in_features:
        raise ValueError(f"{name} has shape {tuple(w.shape)} but x has {in_features} features in its last "
                         f"dim; {name} must be (out_features, {in_features}) as for F.linear")
    # Any strides with a unit stride in one dim (a transposed view too); copy only when neither is, or
    # when a stride is so large that BLOCK * stride would overflow the kernel's int32 tile offsets.
    if (w.stride(0) != 1 and w.stride(1) != 1) or max(w.stride()) >= 2 ** 24:
        w = w.contiguous()
    return w


def _bias(name: str, b, n: int, x) -> Optional[Tensor]:
    if b is None:
        return None
    check_tensor(name, b, ndims=(1,))
    check_same(("x", name), (x, b))
    if b.shape[0] != n:
        raise ValueError(f"{name} has shape {tuple(b.shape)}; expected ({n},), one per output feature")
    return last_dim_contiguous(b)


def _activation_id(activation) -> tuple[int, bool]:
    if activation in GATED_ACTIVATIONS:
        return ACTIVATIONS[GATED_ACTIVATIONS[activation]], True
    if activation in ACTIVATIONS:
        return ACTIVATIONS[activation], False
    raise ValueError(f"activation is {activation!r}; supported: None, "
                     + ", ".join(repr(a) for a in SUPPORTED))


def _prepare(x, weight, bias, activation, up_weight, up_bias, *, name="weight", bias_name="bias"):
    """Validated (x2d, gate/plain weight, up weight, bias, up bias, activation id)."""
    act, gated = _activation_id(activation)
    check_tensor("x", x)
    if x.dim() == 0:
        raise ValueError("x is a 0-dim tensor; expected (..., in_features)")
    k = x.shape[-1]
    weight = _weight(name, weight, k, x.dtype)
    check_same(("x", name), (x, weight), dtype=False)
    if not gated:
        if up_weight is not None or up_bias is not None:
            raise ValueError(f"up_weight / up_bias are only used by the gated activations "
                             f"{tuple(GATED_ACTIVATIONS)}; activation is {activation!r}")
        return x, weight, None, _bias(bias_name, bias, weight.shape[0], x), None, act
    if up_weight is None:  # fused [gate rows; up rows] weight, as Phi-3's gate_up_proj
        if weight.shape[0] % 2:
            raise ValueError(f"{name} has shape {tuple(weight.shape)}: a fused gate/up weight for "
                             f"activation {activation!r} needs an even number of rows (2 * intermediate); "
                             "or pass the up projection separately as up_weight")
        if up_bias is not None:
            raise ValueError("up_bias needs up_weight; with a fused gate/up weight pass one fused bias")
        n = weight.shape[0] // 2
        bias = _bias(bias_name, bias, 2 * n, x)
        gate_b, up_b = (None, None) if bias is None else (bias[:n], bias[n:])
        return x, weight[:n], weight[n:], gate_b, up_b, act
    up_weight = _weight("up_weight", up_weight, k, x.dtype)
    check_same(("x", "up_weight"), (x, up_weight), dtype=False)
    if up_weight.shape != weight.shape:
        raise ValueError(f"up_weight has shape {tuple(up_weight.shape)} but {name} has "
                         f"{tuple(weight.shape)}; gate and up projections must match")
    n = weight.shape[0]
    return x, weight, up_weight, _bias(bias_name, bias, n, x), _bias("up_bias", up_bias, n, x), act


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ----------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------

def linear(x, weight, bias=None, activation=None, *, up_weight=None, up_bias=None):
    """``act(x @ weight.T + bias)`` in one Triton matmul: bias and activation run in its epilogue.

    Shapes: x (..., in_features); weight (out_features, in_features) as ``F.linear`` takes it, with any
    strides (a transposed view such as GPT-2 Conv1D's ``weight.t()`` is read in place, no copy); bias
    (out_features,). Returns (..., out_features) in x's dtype.

    activation: None, "gelu" (erf), "gelu_tanh", "silu", "relu", or gated "swiglu" (silu), "geglu"
    (gelu), "geglu_tanh" (gelu_tanh): ``act(x W_gate^T + b_gate) * (x W_up^T + b_up)``, where either
    ``weight`` is the fused (2 * intermediate, in_features) [gate rows; up rows] matrix with a fused
    (2 * intermediate,) bias, or ``weight`` = W_gate, ``up_weight`` = W_up (and ``up_bias``). Gated
    output is (..., intermediate).

    fp16 / bf16 inputs multiply on tensor cores with fp32 accumulation; the epilogue runs in fp32 and
    rounds once. fp32 inputs use "tf32x3" dots (three tf32 tensor-core products: ~1e-6 relative error,
    like torch's fp32 matmul, several times faster than plain fp32 FMAs; plain tf32 would give ~1e-3).
    Backward: the pre-activation is kept only when a gradient is needed; see the module docstring.

    Example::

        x = torch.randn(8, 1024, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
        y = linear(x, w, activation="gelu_tanh")        # (8, 1024, 16384)
    """
    x2, w, wu, b, bu, act = _prepare(x, weight, bias, activation, up_weight, up_bias)
    lead = x.shape[:-1]
    x2 = last_dim_contiguous(x2.reshape(-1, x2.shape[-1]))
    save = act != 0 or wu is not None
    save = save and _needs_grad(x2, w, wu, b, bu)
    out, _ = _linear_fwd(x2, w, wu, b, bu, act, save)
    return out.reshape(*lead, out.shape[-1])


def _mlp(x, w1, wu, b1, bu, w2, b2, act):
    k, n = x.shape[-1], w1.shape[0]
    name = "fc2_weight" if wu is None else "down_weight"
    w2 = _weight(name, w2, n, x.dtype)
    check_same(("x", name), (x, w2), dtype=False)
    b2 = _bias(name.replace("weight", "bias"), b2, w2.shape[0], x)
    lead = x.shape[:-1]
    x2 = last_dim_contiguous(x.reshape(-1, k))
    save = _needs_grad(x2, w1, wu, b1, bu, w2, b2)
    out, _ = _mlp_fwd(x2, w1, wu, b1, bu, w2, b2, act, save)
    return out.reshape(*lead, out.shape[-1])


def fused_mlp(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, activation="gelu_tanh"):
    """``fc2(act(fc1(x)))`` (GPT-2 / ViT / DiT MLP): two epilogue-fused matmuls, one op.

    Shapes: x (..., in); fc1_weight (hidden, in); fc2_weight (out, hidden) (any strides, e.g. GPT-2
    Conv1D's ``weight.t()``); biases (hidden,), (out,) or None. activation: as ``linear``'s non-gated ones.
    Training saves x and the pre-activation Z (not the hidden activation: the backward recomputes it
    in the epilogue of the matmul that also forms dZ).

    Example::

        y = fused_mlp(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, activation="gelu_tanh")
    """
    if activation in GATED_ACTIVATIONS:
        raise ValueError(f"activation is {activation!r}; fused_mlp takes a plain activation, use "
                         "gated_mlp for gated ones")
    x2, w1, _, b1, _, act = _prepare(x, fc1_weight, fc1_bias, activation, None, None,
                                     name="fc1_weight", bias_name="fc1_bias")
    return _mlp(x2, w1, None, b1, None, fc2_weight, fc2_bias, act)


def gated_mlp(x, gate_weight, up_weight, down_weight, activation="swiglu", *, gate_bias=None, up_bias=None,
              down_bias=None):
    """``down(act(gate(x)) * up(x))``: the SwiGLU / GeGLU MLP of Llama, Mistral, Qwen, Gemma, one op.

    Shapes: x (..., hidden); gate_weight, up_weight (intermediate, hidden); down_weight (hidden_out,
    intermediate); optional biases. activation: "swiglu" (Llama), "geglu" or "geglu_tanh" (Gemma's
    gelu_pytorch_tanh). The forward writes only act(G) * U, one (tokens, intermediate) tensor, never
    G or U unless training needs them; the backward forms dG, dU in the epilogue of the down-projection's
    input-gradient matmul.

    Example::

        y = gated_mlp(x, mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, "swiglu")
    """
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation is {activation!r}; gated_mlp supports "
                         + ", ".join(repr(a) for a in GATED_ACTIVATIONS))
    if up_weight is None:
        raise ValueError("up_weight is None; gated_mlp needs separate gate and up weights")
    x2, wg, wu, bg, bu, act = _prepare(x, gate_weight, gate_bias, activation, up_weight, up_bias,
                                       name="gate_weight", bias_name="gate_bias")
    return _mlp(x2, wg, wu, bg, bu, down_weight, down_bias, act)
