"""rms_norm / layer_norm, CPU tier: outputs and every gradient against the float64 reference on odd shapes
(Triton's interpreter on CPU tensors; the GPU tier is test_norm_gpu.py), the nn modules against HF's
LlamaRMSNorm / GemmaRMSNorm and torch.nn.LayerNorm, the torch.library registrations, and error messages.

Every buffer the kernels write starts as NaN (fixture ``poison``), so an element a kernel forgets to
write fails the comparison; NaN never passes (rel_err of a NaN is NaN, and NaN < tol is False).
"""

import pytest
import torch

import flashfuse.ops.norm as norm_ops
from flashfuse.nn.norm import LayerNorm, RMSNorm
from flashfuse.ops.norm import layer_norm, rms_norm
from flashfuse.reference.norm import layer_norm_ref, rms_norm_ref
from testing import nan_alloc, rel_err  # noqa: E402

F32, F16 = torch.float32, torch.float16
# Relative error ||out - ref|| / ||ref|| against float64: fp32 kernels measure ~1e-7; fp16 rounds each
# output once (llama casting twice), ~3e-4.
TOL = {F32: 1e-5, F16: 2e-3}


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(norm_ops, "_alloc", nan_alloc)


def leaf(t, dtype=None):
    return None if t is None else t.detach().to(dtype or t.dtype).requires_grad_()


def check_op(op, ref_op, tensors: dict, kwargs: dict, tol: float, residual=None):
    """Run op and ref_op (inputs upcast to float64) on the same tensors, backpropagate the same random
    cotangents through every output, compare outputs and every input's gradient."""
    ours = {k: leaf(v) for k, v in tensors.items()}
    refs = {k: leaf(v, torch.float64) for k, v in tensors.items()}
    out = op(**ours, **kwargs)
    ref = ref_op(**refs, **kwargs)
    outs, ref_outs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    assert len(outs) == len(ref_outs)
    loss, ref_loss = 0, 0
    for o, r in zip(outs, ref_outs):
        assert o.shape == r.shape, (o.shape, r.shape)
        assert torch.isfinite(o).all(), "non-finite output"
        err = rel_err(o, r)
        assert err < tol, f"output rel err {err:.2e} >= {tol:.0e}"
        cot = torch.randn(o.shape, dtype=torch.float64, device=o.device)
        loss = loss + (o.double() * cot).sum()
        ref_loss = ref_loss + (r * cot).sum()
    loss.backward()
    ref_loss.backward()
    for name, t in ours.items():
        if t is None:
            continue
        assert t.grad is not None, f"no gradient for {name}"
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        assert torch.isfinite(t.grad).all(), f"non-finite d{name}"
        err = rel_err(t.grad, refs[name].grad)
        assert err < tol, f"d{name} rel err {err:.2e} >= {tol:.0e}"
    return out


def make(shape, dtype, device, *, weight="same", bias=False, residual=False, scale=1.0, shift=0.0):
    n = shape[-1]
    t = {"x": (torch.randn(shape, device=device) * scale + shift).to(dtype)}
    wdtype = {"same": dtype, "fp32": F32}.get(weight)
    t["weight"] = None if wdtype is None else (1 + 0.5 * torch.randn(n, device=device)).to(wdtype)
    if bias:
        t["bias"] = (0.5 * torch.randn(n, device=device)).to(wdtype or dtype)
    if residual:
        t["residual"] = torch.randn(shape, device=device).to(dtype)
    return t


# ----------------------------------------------------------------------------------------------------
# rms_norm / layer_norm against the float64 reference
# ----------------------------------------------------------------------------------------------------

# (shape, dtype, weight: "same" | "fp32" | None, residual, offset, casting_mode)
RMS_CASES = [
    pytest.param((1, 5), F32, "same", False, 0.0, "llama", id="1x5-fp32"),
    pytest.param((37, 123), F32, "same", True, 0.0, "llama", id="37x123-res-fp32"),
    pytest.param((5, 3000), F32, "same", True, 1.0, "gemma", id="5x3000-res-gemma-fp32"),
    pytest.param((2, 3, 4, 40), F32, None, False, 0.0, "llama", id="4d-noweight-fp32"),
    pytest.param((3, 17, 5), F32, None, True, 0.0, "gemma", id="noweight-res-gemma-fp32"),
    pytest.param((37, 123), F16, "same", False, 0.0, "llama", id="37x123-fp16"),
    pytest.param((37, 123), F16, "fp32", True, 0.0, "llama", id="fp32weight-res-llama-fp16"),
    pytest.param((37, 123), F16, "fp32", False, 1.0, "gemma", id="fp32weight-gemma-fp16"),
    pytest.param((9, 3000), F16, "same", True, 1.0, "llama", id="offset-llama-res-fp16"),
    pytest.param((123, 64), F32, "same", False, 0.5, "gemma", id="manyrows-offset-fp32"),
]


@pytest.mark.parametrize("shape, dtype, weight, residual, offset, casting_mode", RMS_CASES)
def test_rms_norm(device, shape, dtype, weight, residual, offset, casting_mode):
    t = make(shape, dtype, device, weight=weight, residual=residual)
    out = check_op(rms_norm, rms_norm_ref, t, dict(eps=1e-6, offset=offset, casting_mode=casting_mode),
                   TOL[dtype])
    y = out[0] if residual else out
    want = torch.promote_types(dtype, t["weight"].dtype) if casting_mode == "llama" and weight else dtype
    assert y.dtype == want


# (shape, dtype, weight, bias, residual)
LN_CASES = [
    pytest.param((1, 5), F32, "same", True, False, id="1x5-fp32"),
    pytest.param((37, 123), F32, "same", True, True, id="37x123-res-fp32"),
    pytest.param((5, 3000), F32, "same", False, True, id="5x3000-nobias-res-fp32"),
    pytest.param((2, 3, 40), F32, None, False, False, id="noaffine-fp32"),
    pytest.param((4, 37), F32, None, True, True, id="bias-only-res-fp32"),
    pytest.param((37, 123), F16, "same", True, False, id="37x123-fp16"),
    pytest.param((17, 300), F16, "fp32", True, True, id="fp32params-res-fp16"),
]


@pytest.mark.parametrize("shape, dtype, weight, bias, residual", LN_CASES)
def test_layer_norm(device, shape, dtype, weight, bias, residual):
    # A mean far from 0 checks that the variance is not E[s^2] - mean^2.
    t = make(shape, dtype, device, weight=weight, bias=bias, residual=residual, scale=2.0, shift=8.0)
    out = check_op(layer_norm, layer_norm_ref, t, dict(eps=1e-5), TOL[dtype])
    assert (out[0] if residual else out).dtype == dtype


@pytest.mark.parametrize("op", ["rms", "ln"])
def test_hidden_65536(device, op):
    """The production caps: 65536 columns loop over 16384-wide (forward) / 8192-wide (backward) blocks."""
    if op == "rms":
        t = make((2, 65536), F32, device, residual=True)
        check_op(rms_norm, rms_norm_ref, t, dict(offset=1.0, casting_mode="gemma"), TOL[F32])
    else:
        t = make((2, 65536), F32, device, bias=True, residual=True, shift=3.0)
        check_op(layer_norm, layer_norm_ref, t, {}, TOL[F32])


@pytest.mark.parametrize("shape, residual", [((37, 3000), True), ((5, 1000), False), ((3, 600), True)])
def test_column_loop(device, monkeypatch, shape, residual):
    """Small block caps force the column-loop paths (forward two-pass, backward row-sums kernel + 2-D
    grid) on odd widths, including a last block of 3000 - 11 * 256 = 184 columns."""
    monkeypatch.setattr(norm_ops, "MAX_BLOCK_N_FWD", 256)
    monkeypatch.setattr(norm_ops, "MAX_BLOCK_N_BWD", 128)
    t = make(shape, F32, device, residual=residual)
    check_op(rms_norm, rms_norm_ref, t, dict(casting_mode="llama"), TOL[F32])
    t = make(shape, F32, device, bias=True, residual=residual, scale=0.5, shift=20.0)
    check_op(layer_norm, layer_norm_ref, t, {}, TOL[F32])


@pytest.mark.parametrize("programs, stages, reg_prefetch, sum_block_p", [
    (1, 1, False, 64),      # one program over every row, no prefetch
    (3, 1, True, 2),        # the register prefetch; 3 uneven runs of rows; partial sums 2 rows a step
    (7, 2, False, 4),       # pipelined loads (sequential in the interpreter), runs of 5-6 rows
    (64, 4, False, 16),     # more programs than row blocks: one row block each
])
def test_backward_schedules(device, monkeypatch, programs, stages, reg_prefetch, sum_block_p):
    """The backward's knobs (the tune script sweeps them on the GPU): programs in the persistent grid,
    load pipelining, the partial-row sum's step. Gradients must not depend on them."""
    monkeypatch.setattr(norm_ops, "INTERPRETER_BWD_PROGRAMS", programs)
    monkeypatch.setattr(norm_ops, "BWD_STAGES", stages)
    monkeypatch.setattr(norm_ops, "BWD_REG_PREFETCH", reg_prefetch)
    monkeypatch.setattr(norm_ops, "PARAM_SUM_BLOCK_P", sum_block_p)
    t = make((37, 123), F32, device, bias=True, residual=True, shift=3.0)
    check_op(layer_norm, layer_norm_ref, t, {}, TOL[F32])
    t = make((37, 40), F32, device, residual=True)      # 40 columns: 4096 // 64 = 64 rows per block
    check_op(rms_norm, rms_norm_ref, t, dict(offset=1.0, casting_mode="gemma"), TOL[F32])


def test_backward_stages_fit_shared_memory(monkeypatch):
    """Pipeline stages are capped so the staged rows of s, dy (and dsum) fit BWD_SMEM_BUDGET."""
    monkeypatch.setattr(norm_ops, "BWD_STAGES", 4)
    monkeypatch.setattr(norm_ops, "BWD_SMEM_BUDGET", 160 * 1024)
    assert norm_ops._bwd_stages(1, 4096, (torch.bfloat16,) * 2) == 4               # 16 KB a stage
    assert norm_ops._bwd_stages(1, 8192, (F32,) * 3) == 2                          # 96 KB a stage
    assert norm_ops._bwd_stages(4, 8192, (F32,) * 3) == 1                          # 384 KB: no staging


def test_strided_inputs(device):
    """Qwen3's QK-norm on (B, S, H, D) slices of a packed projection: leading dims that do not merge into
    one row stride are copied; a plain row slice is used in place; a strided last dim is copied."""
    b, s, h, d = 2, 3, 4, 40
    qkv = torch.randn(b, s, 3 * h, d, device=device)
    w = torch.randn(d, device=device)
    q = qkv[:, :, :h]                                   # strides (S*3H*D, 3H*D, D, 1): not mergeable
    torch.testing.assert_close(rms_norm(q, w), rms_norm_ref(q, w), rtol=1e-5, atol=1e-5)
    wide = torch.randn(37, 246, device=device)
    x = wide[:, :123]                                   # row stride 246, a view
    assert norm_ops._rows(x, 123).data_ptr() == x.data_ptr()
    torch.testing.assert_close(rms_norm(x, w.new_ones(123)), rms_norm_ref(x, w.new_ones(123)))
    xt = torch.randn(123, 37, device=device).t()        # last dim strided
    torch.testing.assert_close(layer_norm(xt), layer_norm_ref(xt), rtol=1e-5, atol=1e-5)
    check_op(rms_norm, rms_norm_ref, {"x": q, "weight": w}, {}, TOL[F32])


def test_zero_rows(device):
    x = torch.randn(0, 3, 16, device=device, requires_grad=True)
    w = torch.randn(16, device=device, requires_grad=True)
    y, s = rms_norm(x, w, residual=torch.randn(0, 3, 16, device=device))
    assert y.shape == s.shape == (0, 3, 16)
    y.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(w.grad, torch.zeros_like(w))


def test_deterministic_backward(device):
    t = make((37, 123), F32, device, bias=True, residual=True)
    grads = []
    for _ in range(2):
        leaves = {k: leaf(v) for k, v in t.items()}
        y, s = layer_norm(**leaves)
        (y.sum() + 2 * s.sum()).backward()
        grads.append([leaves[k].grad for k in ("x", "weight", "bias", "residual")])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_unused_outputs(device):
    """Only the sum used (dy materialized as zeros) or only y used: gradients still flow correctly."""
    t = make((5, 40), F32, device, residual=True)
    x, r, w = leaf(t["x"]), leaf(t["residual"]), leaf(t["weight"])
    _, s = rms_norm(x, w, residual=r)
    s.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    torch.testing.assert_close(r.grad, torch.ones_like(r))
    torch.testing.assert_close(w.grad, torch.zeros_like(w))


# ----------------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------------

def test_opcheck(device):
    x = torch.randn(7, 40, device=device, requires_grad=True)
    r = torch.randn(7, 40, device=device, requires_grad=True)
    w = torch.randn(40, device=device, requires_grad=True)
    b = torch.randn(40, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.flashfuse.rms_norm_fwd, (x, r, w, 1e-6, 1.0, True))
    torch.library.opcheck(torch.ops.flashfuse.rms_norm_fwd, (x, None, None, 1e-6, 0.0, False))
    torch.library.opcheck(torch.ops.flashfuse.layer_norm_fwd, (x, r, w, b, 1e-5))
    torch.library.opcheck(torch.ops.flashfuse.layer_norm_fwd, (x, None, None, b, 1e-5))


def test_compile_fullgraph(device):
    """The custom ops trace as one node each (fake + autograd registrations), forward and backward."""
    t = make((5, 3, 40), F32, device, bias=True, residual=True)

    def block(x, residual, weight, bias):
        y, h = rms_norm(x, weight, residual=residual)
        return layer_norm(y, weight, bias, residual=h)

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    eager_in = {k: leaf(v) for k, v in t.items()}
    comp_in = {k: leaf(v) for k, v in t.items()}
    for fn, inputs in ((block, eager_in), (compiled, comp_in)):
        y, h = fn(**inputs)
        (y.pow(2).sum() + h.sum()).backward()
    torch.testing.assert_close(compiled(**t), block(**t))
    for k in t:
        torch.testing.assert_close(comp_in[k].grad, eager_in[k].grad)


# ----------------------------------------------------------------------------------------------------
# nn modules against HF and torch
# ----------------------------------------------------------------------------------------------------

def _compare_modules(ours, theirs, x, tol):
    theirs.load_state_dict(ours.state_dict())
    xa, xb = leaf(x), leaf(x)
    ya, yb = ours(xa), theirs(xb)
    assert ya.dtype == yb.dtype and ya.shape == yb.shape
    assert rel_err(ya, yb) < tol
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    assert rel_err(xa.grad, xb.grad) < tol
    assert rel_err(ours.weight.grad, theirs.weight.grad) < tol
    if getattr(ours, "bias", None) is not None:
        assert rel_err(ours.bias.grad, theirs.bias.grad) < tol


@pytest.mark.parametrize("dtype", [F32, F16])
def test_rmsnorm_module_matches_hf(device, dtype):
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    x = torch.randn(3, 7, 123, device=device, dtype=dtype)
    llama = RMSNorm(123, eps=1e-5, device=device, dtype=dtype)
    assert torch.equal(llama.weight, torch.ones(123, device=device, dtype=dtype))
    llama.weight.data.normal_(1.0, 0.3)
    hf = LlamaRMSNorm(123, eps=1e-5).to(device=device, dtype=dtype)
    assert llama.variance_epsilon == hf.variance_epsilon
    _compare_modules(llama, hf, x, TOL[dtype])
    gemma = RMSNorm(123, eps=1e-6, offset=1.0, casting_mode="gemma", device=device, dtype=dtype)
    assert torch.equal(gemma.weight, torch.zeros(123, device=device, dtype=dtype))
    gemma.weight.data.normal_(0.0, 0.3)
    _compare_modules(gemma, GemmaRMSNorm(123, eps=1e-6).to(device=device, dtype=dtype), x, TOL[dtype])


def test_rmsnorm_module_fp32_weight_fp16_input(device):
    """Mixed precision as HF runs it: fp32 master weight, fp16 activations (output promoted to fp32)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    ours = RMSNorm(123, device=device)
    ours.weight.data.normal_(1.0, 0.3)
    _compare_modules(ours, LlamaRMSNorm(123).to(device), torch.randn(9, 123, device=device, dtype=F16),
                     TOL[F16])


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"eps": 1e-6}])
def test_layernorm_module_matches_torch(device, kwargs):
    ours = LayerNorm(123, device=device, **kwargs)
    theirs = torch.nn.LayerNorm(123, device=device, **kwargs)
    ours.weight.data.normal_(1.0, 0.3)
    if ours.bias is not None:
        ours.bias.data.normal_(0.0, 0.3)
    _compare_modules(ours, theirs, torch.randn(4, 9, 123, device=device) + 3, TOL[F32])


def test_layernorm_module_multidim_and_residual(device):
    ours = LayerNorm((3, 40), device=device)
    theirs = torch.nn.LayerNorm((3, 40), device=device)
    ours.weight.data.normal_(1.0, 0.3)
    ours.bias.data.normal_(0.0, 0.3)
    _compare_modules(ours, theirs, torch.randn(5, 3, 40, device=device), TOL[F32])
    x, r = torch.randn(2, 5, 3, 40, device=device), torch.randn(2, 5, 3, 40, device=device)
    y, h = ours(x, residual=r)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(y, theirs(x + r), rtol=1e-5, atol=1e-5)
    noaffine = LayerNorm(40, elementwise_affine=False, device=device)
    torch.testing.assert_close(noaffine(x), torch.nn.functional.layer_norm(x, (40,)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"last 2 dim\(s\) must equal normalized_shape \(3, 40\)"):
        ours(torch.randn(5, 40, 3, device=device))


def test_rmsnorm_module_residual(device):
    norm = RMSNorm(40, device=device)
    x, r = torch.randn(6, 40, device=device), torch.randn(6, 40, device=device)
    y, h = norm(x, r)
    torch.testing.assert_close(h, x + r)
    torch.testing.assert_close(y, rms_norm_ref(x + r, norm.weight), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="casting_mode is 'mistral'"):
        RMSNorm(40, casting_mode="mistral")


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------

def test_errors(device):
    x = torch.randn(4, 16, device=device)
    w = torch.randn(16, device=device)
    with pytest.raises(ValueError, match=r"weight has shape \(15,\); expected \(16,\)"):
        rms_norm(x, torch.randn(15, device=device))
    with pytest.raises(ValueError, match=r"bias has shape \(4, 16\); expected \(16,\)"):
        layer_norm(x, w, torch.randn(4, 16, device=device))
    with pytest.raises(TypeError, match="x has dtype torch.int64; supported: float16, bfloat16, float32"):
        rms_norm(torch.ones(4, 16, dtype=torch.int64, device=device), w)
    with pytest.raises(TypeError, match="weight has dtype torch.int32"):
        layer_norm(x, torch.ones(16, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match=r"residual has shape \(4, 8\) but x has \(4, 16\)"):
        rms_norm(x, w, residual=torch.randn(4, 8, device=device))
    with pytest.raises(TypeError, match="residual has dtype torch.float16 but x has torch.float32"):
        layer_norm(x, w, residual=torch.randn(4, 16, device=device, dtype=F16))
    with pytest.raises(ValueError, match="casting_mode is 'llama2'; supported: 'llama', 'gemma'"):
        rms_norm(x, w, casting_mode="llama2")
    with pytest.raises(ValueError, match="eps is -1.0; supported: a finite number >= 0"):
        rms_norm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="offset is nan"):
        rms_norm(x, w, offset=float("nan"))
    with pytest.raises(ValueError, match=r"x has shape \(4, 0\); expected \(..., hidden\) with hidden >= 1"):
        layer_norm(torch.randn(4, 0, device=device))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        rms_norm([1.0, 2.0])
