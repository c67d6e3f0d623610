"""CPU tier of flashfuse.ops.matmul: the Triton kernels in the interpreter, tiny odd shapes, fp32 (and
fp16), against float64 references; every gradient; the error messages."""

import pytest
import torch

from flashfuse.ops import matmul as ops
from flashfuse.ops.matmul_details import _kernels
from flashfuse.reference import matmul as ref
from testing import rel_err  # noqa: E402

PLAIN = [None, "gelu", "gelu_tanh", "silu", "relu"]
GATED = ["swiglu", "geglu", "geglu_tanh"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def leaves(*tensors, dtype):
    return [None if t is None else t.to(dtype).detach().requires_grad_() for t in tensors]


def check_grads(run, reference, inputs, dtype, tol):
    """run / reference take the inputs; compare outputs and every gradient vs float64."""
    ours = leaves(*inputs, dtype=dtype)
    theirs = leaves(*inputs, dtype=torch.float64)
    out = run(*ours)
    ref_out = reference(*theirs)
    assert out.shape == ref_out.shape and out.dtype == dtype
    assert rel_err(out, ref_out) < tol
    grad = torch.randn_like(ref_out)
    out.backward(grad.to(dtype))
    ref_out.backward(grad)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a is None:
            continue
        assert a.grad is not None, f"input {i} got no gradient"
        assert rel_err(a.grad, b.grad) < tol, f"input {i} gradient"


@pytest.mark.parametrize("activation", PLAIN)
@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("shape", [(37, 45, 29), (1, 45, 29)])
def test_linear_plain(device, activation, has_bias, shape):
    M, K, N = shape
    x, w = torch.randn(M, K, device=device), torch.randn(N, K, device=device) / K ** 0.5
    b = torch.randn(N, device=device) if has_bias else None
    check_grads(lambda x, w, b: ops.linear(x, w, b, activation),
                lambda x, w, b: ref.linear(x, w, b, activation), (x, w, b), torch.float32, TOL[torch.float32])


@pytest.mark.parametrize("activation", GATED)
@pytest.mark.parametrize("has_bias", [True, False])
def test_linear_gated_fused_weight(device, activation, has_bias):
    M, K, I = 37, 45, 29
    x, w = torch.randn(M, K, device=device), torch.randn(2 * I, K, device=device) / K ** 0.5
    b = torch.randn(2 * I, device=device) if has_bias else None
    check_grads(lambda x, w, b: ops.linear(x, w, b, activation),
                lambda x, w, b: ref.linear(x, w, b, activation), (x, w, b), torch.float32, TOL[torch.float32])


@pytest.mark.parametrize("activation", GATED)
def test_linear_gated_separate_weights(device, activation):
    M, K, I = 37, 45, 29
    x = torch.randn(2, M, K, device=device)  # 3-D x
    wg, wu = (torch.randn(I, K, device=device) / K ** 0.5 for _ in range(2))
    bg, bu = torch.randn(I, device=device), torch.randn(I, device=device)
    check_grads(lambda x, wg, wu, bg, bu: ops.linear(x, wg, bg, activation, up_weight=wu, up_bias=bu),
                lambda x, wg, wu, bg, bu: ref.linear(x, wg, bg, activation, up_weight=wu, up_bias=bu),
                (x, wg, wu, bg, bu), torch.float32, TOL[torch.float32])


@pytest.mark.parametrize("activation", ["gelu_tanh", "geglu"])
def test_transposed_weight_view_and_3d_x(device, activation):
    """GPT-2 Conv1D stores (in, out): weight = conv.weight.t() must work without a copy."""
    K, N = 45, 58
    x = torch.randn(3, 5, K, device=device)
    conv_w = torch.randn(K, N, device=device) / K ** 0.5
    b = torch.randn(N, device=device)

    def run(x, conv_w, b):
        w = conv_w.t()
        assert w.stride() == (1, N)
        return ops.linear(x, w, b, activation)
    check_grads(run, lambda x, conv_w, b: ref.linear(x, conv_w.t(), b, activation), (x, conv_w, b),
                torch.float32, TOL[torch.float32])


def test_aligned_shapes_take_tma_path(device, monkeypatch):
    """K and N multiples of 16 bytes: operands and outputs go through tensor descriptors (TMA)."""
    seen = []
    real = _kernels._linear_kernel.run

    def spy(*args, **kwargs):
        seen.append((kwargs["USE_TMA"], kwargs["USE_TMA_OUT"]))
        return real(*args, **kwargs)
    monkeypatch.setattr(_kernels._linear_kernel, "run", spy)
    x, w, b = torch.randn(40, 64, device=device), torch.randn(72, 64, device=device) / 8, torch.randn(72, device=device)
    for weight in (w, w.t().contiguous().t()):  # K-contiguous and transposed weights
        out = ops.linear(x, weight, b, "silu")
        assert rel_err(out, ref.linear(x.double(), w.double(), b.double(), "silu")) < 1e-5
    x_odd = torch.randn(40, 65, device=device)[:, :63]  # row stride 65 * 4 bytes: not 16-byte aligned
    out = ops.linear(x_odd, torch.randn(72, 63, device=device), None, "relu")
    assert seen == [(True, True), (True, True), (False, True)]


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu", "swiglu", "geglu_tanh"])
def test_fp16(device, activation):
    M, K, N = 37, 45, 58
    x, w = torch.randn(M, K, device=device), torch.randn(N, K, device=device) / K ** 0.5
    b = torch.randn(N, device=device)
    check_grads(lambda x, w, b: ops.linear(x, w, b, activation),
                lambda x, w, b: ref.linear(x, w, b, activation), (x, w, b), torch.float16, TOL[torch.float16])


def test_no_grad_saves_nothing_and_matches(device):
    x, w = torch.randn(37, 45, device=device), torch.randn(58, 45, device=device, requires_grad=True)
    with torch.no_grad():
        out = ops.linear(x, w, None, "geglu_tanh")
    assert out.grad_fn is None
    assert rel_err(out, ref.linear(x.double(), w.double(), None, "geglu_tanh")) < 1e-5


def test_empty_rows(device):
    out = ops.linear(torch.randn(0, 45, device=device), torch.randn(29, 45, device=device), None, "gelu")
    assert out.shape == (0, 29)


def test_output_poisoned_buffers_all_written(device, monkeypatch):
    """Fill every output the kernels allocate with NaN first: an unwritten element would fail."""
    real_empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(_kernels.torch, "empty", nan_empty)
    x, w = torch.randn(37, 45, device=device), torch.randn(2 * 29, 45, device=device) / 7
    check_grads(lambda x, w: ops.linear(x, w, None, "swiglu"), lambda x, w: ref.linear(x, w, None, "swiglu"),
                (x, w), torch.float32, TOL[torch.float32])
    w1, w2 = torch.randn(29, 45, device=device) / 7, torch.randn(33, 29, device=device) / 6
    check_grads(lambda x, w1, w2: ops.fused_mlp(x, w1, None, w2, None, "gelu"),
                lambda x, w1, w2: ref.fused_mlp(x, w1, None, w2, None, "gelu"), (x, w1, w2), torch.float32,
                TOL[torch.float32])


# ---------------------------------------------------------------------------------------------------
# MLPs
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("activation", PLAIN)
def test_fused_mlp(device, activation):
    M, K, H, O = 37, 45, 29, 23
    x = torch.randn(2, M, K, device=device)
    w1, b1 = torch.randn(H, K, device=device) / K ** 0.5, torch.randn(H, device=device)
    w2, b2 = torch.randn(O, H, device=device) / H ** 0.5, torch.randn(O, device=device)
    check_grads(lambda *a: ops.fused_mlp(*a, activation), lambda *a: ref.fused_mlp(*a, activation),
                (x, w1, b1, w2, b2), torch.float32, TOL[torch.float32])


def test_fused_mlp_conv1d_weights_no_bias(device):
    """GPT-2 layout: both weights as transposed views, and no biases."""
    K, H = 45, 58
    x = torch.randn(1, 1, K, device=device)
    c1, c2 = torch.randn(K, H, device=device) / K ** 0.5, torch.randn(H, K, device=device) / H ** 0.5
    check_grads(lambda x, c1, c2: ops.fused_mlp(x, c1.t(), None, c2.t(), None, "gelu_tanh"),
                lambda x, c1, c2: ref.fused_mlp(x, c1.t(), None, c2.t(), None, "gelu_tanh"),
                (x, c1, c2), torch.float32, TOL[torch.float32])


@pytest.mark.parametrize("activation", GATED)
@pytest.mark.parametrize("has_bias", [False, True])
def test_gated_mlp(device, activation, has_bias):
    M, K, I = 37, 45, 29
    x = torch.randn(M, K, device=device)
    wg, wu = (torch.randn(I, K, device=device) / K ** 0.5 for _ in range(2))
    wd = torch.randn(K, I, device=device) / I ** 0.5
    biases = (torch.randn(I, device=device), torch.randn(I, device=device), torch.randn(K, device=device))
    if not has_bias:
        biases = (None, None, None)

    def run(x, wg, wu, wd, bg, bu, bd, fn):
        return fn(x, wg, wu, wd, activation, gate_bias=bg, up_bias=bu, down_bias=bd)
    check_grads(lambda *a: run(*a, ops.gated_mlp), lambda *a: run(*a, ref.gated_mlp),
                (x, wg, wu, wd) + biases, torch.float32, TOL[torch.float32])


def test_torch_compile_fullgraph_forward_and_backward(device):
    x = torch.randn(37, 45, device=device, requires_grad=True)
    wg, wu = torch.randn(29, 45, device=device), torch.randn(29, 45, device=device)
    wd = torch.randn(45, 29, device=device, requires_grad=True)

    def f(x, wd):
        return ops.gated_mlp(x, wg, wu, wd, "swiglu").sum() + ops.linear(x, wd.t(), None, "gelu").sum()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    out, out_c = f(x, wd), compiled(x, wd)
    grads, grads_c = torch.autograd.grad(out, (x, wd)), torch.autograd.grad(out_c, (x, wd))
    torch.testing.assert_close(out_c, out)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g)


# ---------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------

def test_errors(device):
    x, w = torch.randn(5, 8, device=device), torch.randn(6, 8, device=device)
    with pytest.raises(ValueError, match=r"weight has shape \(6, 7\).*8 features"):
        ops.linear(x, torch.randn(6, 7, device=device))
    with pytest.raises(ValueError, match=r"activation is 'tanh'; supported: None, 'gelu'"):
        ops.linear(x, w, None, "tanh")
    with pytest.raises(ValueError, match=r"weight has shape \(7, 8\).*even number of rows"):
        ops.linear(x, torch.randn(7, 8, device=device), None, "swiglu")
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        ops.linear(x.long(), w)
    with pytest.raises(TypeError, match="weight has dtype torch.float16 but x has torch.float32"):
        ops.linear(x, w.half())
    with pytest.raises(ValueError, match=r"bias has shape \(5,\); expected \(6,\)"):
        ops.linear(x, w, torch.randn(5, device=device))
    with pytest.raises(ValueError, match="up_weight / up_bias are only used by the gated"):
        ops.linear(x, w, None, "gelu", up_weight=w)
    with pytest.raises(ValueError, match=r"up_weight has shape \(5, 8\) but weight has \(6, 8\)"):
        ops.linear(x, w, None, "swiglu", up_weight=torch.randn(5, 8, device=device))
    with pytest.raises(ValueError, match="weight must have 2 dimensions"):
        ops.linear(x, torch.randn(8, device=device))
    with pytest.raises(ValueError, match="fused_mlp takes a plain activation"):
        ops.fused_mlp(x, w, None, w.t(), None, "swiglu")
    with pytest.raises(ValueError, match=r"fc2_weight has shape \(6, 8\).*6 features"):
        ops.fused_mlp(x, w, None, torch.randn(6, 8, device=device), None)
    with pytest.raises(ValueError, match="gated_mlp supports 'swiglu'"):
        ops.gated_mlp(x, w, w, w.t(), "gelu")
    with pytest.raises(ValueError, match=r"down_bias has shape \(3,\); expected \(8,\)"):
        ops.gated_mlp(x, w, w, w.t(), down_bias=torch.randn(3, device=device))
