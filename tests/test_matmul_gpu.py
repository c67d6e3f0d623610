"""GPU tier of flashfuse.ops.matmul: bf16 / fp16 at real sizes (TMA and pointer paths, autotuned),
every gradient vs float64, torch.compile(fullgraph=True) equality."""

import pytest
import torch

from flashfuse.ops import matmul as ops
from flashfuse.reference import matmul as ref
from testing import rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

# bf16 keeps 8 mantissa bits: one rounding of the output is ~2e-3 relative; gradients pass through one
# or two more bf16 roundings (dZ, then the matmuls).
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
GRAD_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}


def run_and_compare(run, reference, inputs, dtype):
    ours = [None if t is None else t.to(dtype).detach().requires_grad_() for t in inputs]
    theirs = [None if t is None else t.to(dtype).detach().double().requires_grad_() for t in inputs]
    out = run(*ours)
    ref_out = reference(*theirs)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert rel_err(out, ref_out) < TOL[dtype]
    grad = torch.randn_like(ref_out)
    out.backward(grad.to(dtype))
    ref_out.backward(grad)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a is not None:
            assert rel_err(a.grad, b.grad) < GRAD_TOL[dtype], f"gradient of input {i}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "silu", "relu"])
def test_linear_4096(activation, dtype):
    x = torch.randn(4, 1024, 4096, device="cuda")
    w = torch.randn(4096, 4096, device="cuda") / 64
    b = torch.randn(4096, device="cuda")
    run_and_compare(lambda x, w, b: ops.linear(x, w, b, activation),
                    lambda x, w, b: ref.linear(x, w, b, activation), (x, w, b), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation", ["swiglu", "geglu", "geglu_tanh"])
@pytest.mark.parametrize("fused", [True, False])
def test_linear_gated_4096(activation, dtype, fused):
    x = torch.randn(4096, 4096, device="cuda")
    wg, wu = torch.randn(2, 2816, 4096, device="cuda") / 64
    if fused:
        run_and_compare(lambda x, w: ops.linear(x, w, None, activation),
                        lambda x, w: ref.linear(x, w, None, activation), (x, torch.cat([wg, wu])), dtype)
    else:
        run_and_compare(lambda x, wg, wu: ops.linear(x, wg, None, activation, up_weight=wu),
                        lambda x, wg, wu: ref.linear(x, wg, None, activation, up_weight=wu), (x, wg, wu), dtype)


@pytest.mark.parametrize("shape", [(1000, 1000, 1000), (1, 4096, 4096), (1000, 1001, 999), (77, 4096, 11008)])
def test_linear_odd_sizes(shape):
    """1001 / 999 bf16 rows are not 16-byte aligned: the pointer path; the others go through TMA."""
    M, K, N = shape
    x, w, b = torch.randn(M, K, device="cuda"), torch.randn(N, K, device="cuda") / K ** 0.5, torch.randn(N, device="cuda")
    run_and_compare(lambda x, w, b: ops.linear(x, w, b, "gelu_tanh"),
                    lambda x, w, b: ref.linear(x, w, b, "gelu_tanh"), (x, w, b), torch.bfloat16)


def test_transposed_weight_view():
    conv_w = torch.randn(1024, 4096, device="cuda") / 32  # GPT-2 Conv1D (in, out)
    x, b = torch.randn(2048, 1024, device="cuda"), torch.randn(4096, device="cuda")
    run_and_compare(lambda x, c, b: ops.linear(x, c.t(), b, "gelu_tanh"),
                    lambda x, c, b: ref.linear(x, c.t(), b, "gelu_tanh"), (x, conv_w, b), torch.bfloat16)


def test_fp32_uses_tf32x3_accuracy():
    x, w = torch.randn(1024, 1024, device="cuda"), torch.randn(2048, 1024, device="cuda") / 32
    run_and_compare(lambda x, w: ops.linear(x, w, None, "silu"), lambda x, w: ref.linear(x, w, None, "silu"),
                    (x, w), torch.float32)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_fused_mlp_bf16(activation):
    x = torch.randn(4096, 1024, device="cuda")
    w1, b1 = torch.randn(4096, 1024, device="cuda") / 32, torch.randn(4096, device="cuda")
    w2, b2 = torch.randn(1024, 4096, device="cuda") / 64, torch.randn(1024, device="cuda")
    run_and_compare(lambda *a: ops.fused_mlp(*a, activation), lambda *a: ref.fused_mlp(*a, activation),
                    (x, w1, b1, w2, b2), torch.bfloat16)


@pytest.mark.parametrize("activation", ["swiglu", "geglu_tanh"])
def test_gated_mlp_bf16(activation):
    x = torch.randn(2, 1000, 2048, device="cuda")
    wg, wu = torch.randn(2, 5632, 2048, device="cuda") / 45
    wd = torch.randn(2048, 5632, device="cuda") / 75
    run_and_compare(lambda x, wg, wu, wd: ops.gated_mlp(x, wg, wu, wd, activation),
                    lambda x, wg, wu, wd: ref.gated_mlp(x, wg, wu, wd, activation), (x, wg, wu, wd), torch.bfloat16)


def test_torch_compile_matches_eager():
    """fullgraph=True: each layer is one opaque op. Forward outputs are bit-identical (same kernels and
    tuned configs); gradients where autograd sums two contributions may round differently (eager adds
    the bf16 partial gradients, Inductor may add them in fp32), so they get bf16's resolution."""
    x = torch.randn(1000, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (torch.randn(5632, 2048, device="cuda", dtype=torch.bfloat16) / 45 for _ in range(2))
    wd = (torch.randn(2048, 5632, device="cuda", dtype=torch.bfloat16) / 75).requires_grad_()
    w1 = (torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16) / 45).requires_grad_()

    def f(x, wd, w1):
        h = ops.gated_mlp(x, wg, wu, wd, "swiglu")
        return ops.fused_mlp(h, w1, None, w1.t(), None, "gelu_tanh"), ops.linear(h, w1, None, "relu")
    compiled = torch.compile(f, fullgraph=True)
    outs, outs_c = f(x, wd, w1), compiled(x, wd, w1)
    for o, o_c in zip(outs, outs_c):
        torch.testing.assert_close(o_c, o, rtol=0, atol=0)
    gs = [torch.randn_like(o) for o in outs]
    grads = torch.autograd.grad(outs, (x, wd, w1), gs)
    grads_c = torch.autograd.grad(outs_c, (x, wd, w1), gs)
    for g, g_c in zip(grads, grads_c):
        assert rel_err(g_c, g) < 1e-2


def _configs(gated, backward):
    from flashfuse.ops.matmul_details import _kernels
    return [dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
            for c in _kernels.configs_for(torch.bfloat16, gated, backward)]


def _name(c):
    return f"{c['BLOCK_M']}x{c['BLOCK_N']}w{c['num_warps']}s{c['num_stages']}{'ws' if c['WARP_SPECIALIZE'] else ''}"


@pytest.mark.parametrize("config", _configs(False, False), ids=_name)
@pytest.mark.parametrize("activation", [2, 1])  # gelu_tanh (SFU tanh), gelu (erf); save_pre on
def test_every_forward_config(config, activation, monkeypatch):
    """The autotuner keeps one config per shape: run each one (warp-specialized ones too) explicitly, on
    edge tiles (M, N not multiples of any block), outputs poisoned with NaN first."""
    from flashfuse.ops.matmul_details import _kernels
    real_empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(_kernels.torch, "empty", nan_empty)
    M, K, N = 1000, 1024, 2000
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") / 32).to(torch.bfloat16)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    out, pre = _kernels.linear_forward(x, w, b, activation=activation, save_pre=True, config=config)
    z = x.double() @ w.double().t() + b.double()
    ref_out = ref.linear(x.double(), w.double(), b.double(), "gelu_tanh" if activation == 2 else "gelu")
    assert rel_err(pre, z) < TOL[torch.bfloat16]
    assert rel_err(out, ref_out) < TOL[torch.bfloat16]


@pytest.mark.parametrize("config", _configs(True, False), ids=_name)
def test_every_gated_config(config):
    from flashfuse.ops.matmul_details import _kernels
    M, K, N = 1000, 1024, 1000
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    wg, wu = (torch.randn(2, N, K, device="cuda") / 32).to(torch.bfloat16)
    out, pre = _kernels.linear_forward(x, wg, None, activation=3, up_weight=wu, save_pre=True, config=config)
    g, u = x.double() @ wg.double().t(), x.double() @ wu.double().t()
    assert rel_err(pre, torch.cat([g, u], 1)) < TOL[torch.bfloat16]
    assert rel_err(out, torch.nn.functional.silu(g) * u) < TOL[torch.bfloat16]


@pytest.mark.parametrize("config", _configs(False, True), ids=_name)
@pytest.mark.parametrize("gated", [False, True])
def test_every_backward_config(config, gated):
    """dA = dY W2^T, then (dz [| du], h) at the saved pre-activations, per config."""
    from flashfuse.ops.matmul_details import _kernels
    M, K2, N = 1000, 1024, 1000
    dy = torch.randn(M, K2, device="cuda", dtype=torch.bfloat16)
    w2 = (torch.randn(K2, N, device="cuda") / 32).to(torch.bfloat16)
    pre = torch.randn(M, 2 * N if gated else N, device="cuda", dtype=torch.bfloat16)
    dpre, h = _kernels.matmul_act_grad(dy, w2.t(), pre, activation=2, gated=gated, config=config)
    z = pre[:, :N].double().requires_grad_()
    u = pre[:, N:].double().requires_grad_() if gated else None
    a = torch.nn.functional.gelu(z, approximate="tanh")
    h_ref = a * u if gated else a
    h_ref.backward(dy.double() @ w2.double())
    assert rel_err(h, h_ref) < TOL[torch.bfloat16]
    assert rel_err(dpre[:, :N], z.grad) < GRAD_TOL[torch.bfloat16]
    if gated:
        assert rel_err(dpre[:, N:], u.grad) < GRAD_TOL[torch.bfloat16]
