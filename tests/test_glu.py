"""swiglu / geglu, CPU tier: forward and both gradients against the float64 reference on odd shapes,
views of a fused projection (no copies), NaN-poisoned output buffers, saturated inputs, argument errors,
torch.compile(fullgraph=True). Kernels run in Triton's interpreter here; the GPU tier is test_glu_gpu.py."""

import math

import pytest
import torch
import torch.nn.functional as F

from flashfuse.ops.glu import geglu, glu_backward, glu_forward, swiglu
from flashfuse.reference.glu import geglu_ref, glu_backward_ref, swiglu_ref

F32, F16 = torch.float32, torch.float16
# ||x - ref|| / ||ref||: fp32 computes and rounds in fp32 (~1e-7 seen); fp16 rounds once at the end,
# at most 2^-11 ~ 4.9e-4 per element.
REL = {F32: 1e-6, F16: 1e-3}

# (name, kernel, float64-capable reference, activation code of the launchers)
OPS = [
    ("swiglu", swiglu, swiglu_ref, "silu"),
    ("geglu", lambda g, u: geglu(g, u), lambda g, u: geglu_ref(g, u, "none"), "gelu"),
    ("geglu_tanh", lambda g, u: geglu(g, u, approximate="tanh"), lambda g, u: geglu_ref(g, u, "tanh"),
     "gelu_tanh"),
]
OP_IDS = [op[0] for op in OPS]


def assert_close(name, x, ref, dtype):
    assert x.shape == ref.shape, f"{name}: shape {tuple(x.shape)}, reference {tuple(ref.shape)}"
    assert x.dtype == dtype, f"{name}: dtype {x.dtype}, expected {dtype}"
    assert torch.isfinite(x).all(), f"{name}: {int((~torch.isfinite(x)).sum())} NaN/Inf values"
    rel = (x.double() - ref).norm().item() / max(ref.norm().item(), 1e-30)
    assert rel <= REL[dtype], f"{name}: relative error {rel:.3e} > {REL[dtype]:.0e} ({dtype})"


def check_op(op, ref_fn, gate, up, leaves=None):
    """op(gate, up) and d/d(leaves) against ref_fn on float64 copies. leaves: the tensors that require
    grad (gate and up themselves, or the fused projection they are views of), with a function mapping
    float64 copies of the leaves to (gate, up)."""
    leaves = leaves or ((gate, up), lambda g, u: (g, u))
    tensors, to_inputs = leaves
    out = op(gate, up)
    assert out.is_contiguous() and out.shape == gate.shape
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, tensors, dout)
    tensors64 = [t.detach().double().requires_grad_(True) for t in tensors]
    ref = ref_fn(*to_inputs(*tensors64))
    ref_grads = torch.autograd.grad(ref, tensors64, dout.double())
    assert_close("out", out.detach(), ref.detach(), gate.dtype)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(f"grad {i}", g, r, gate.dtype)


# ----------------------------------------------------------------------------------------------------
# Forward and every gradient vs float64
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, op, ref_fn, act", OPS, ids=OP_IDS)
@pytest.mark.parametrize("shape, dtype", [
    ((1, 5), F32), ((37, 123), F32), ((5, 3000), F32),          # 3000 > MAX_BLOCK: two blocks, one partial
    ((2, 3, 37), F16), ((123, 5), F16), ((1,), F32), ((2, 1, 2048), F16),
], ids=["1x5-fp32", "37x123-fp32", "5x3000-fp32", "2x3x37-fp16", "123x5-fp16", "1-fp32", "2x1x2048-fp16"])
def test_forward_backward(name, op, ref_fn, act, shape, dtype, device):
    gate = (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_(True)
    up = torch.randn(shape, device=device).to(dtype).requires_grad_(True)
    check_op(op, ref_fn, gate, up)


@pytest.mark.parametrize("name, op, ref_fn, act", OPS, ids=OP_IDS)
def test_saturated_inputs(name, op, ref_fn, act, device):
    """Large |gate|: exp(-g) would overflow past g < -88 (the kernel clamps it), the sigmoids saturate,
    erfc underflows; every value and gradient stays finite and matches the reference (silu(-100) ~ -0,
    gelu'(100) = 1, ...)."""
    gate = torch.linspace(-100, 100, 97, device=device).reshape(1, 97).requires_grad_(True)
    up = torch.randn(1, 97, device=device).requires_grad_(True)
    check_op(op, ref_fn, gate, up)


def test_matches_torch_functional(device):
    """The references equal torch's own activations (so the kernels match F.silu / F.gelu too)."""
    g, u = torch.randn(7, 33, dtype=torch.float64, device=device), torch.randn(7, 33, dtype=torch.float64,
                                                                               device=device)
    torch.testing.assert_close(swiglu_ref(g, u), F.silu(g) * u, rtol=1e-14, atol=1e-14)
    for approximate in ("none", "tanh"):
        torch.testing.assert_close(geglu_ref(g, u, approximate), F.gelu(g, approximate=approximate) * u,
                                   rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("act, ref_fn", [("silu", swiglu_ref), ("gelu", lambda g, u: geglu_ref(g, u, "none")),
                                         ("gelu_tanh", lambda g, u: geglu_ref(g, u, "tanh"))])
def test_reference_vjp_formulas(act, ref_fn, device):
    """The closed-form VJP written in reference/glu.py (and in the kernel) equals autograd's."""
    g = (torch.randn(5, 41, dtype=torch.float64, device=device) * 4).requires_grad_(True)
    u = torch.randn(5, 41, dtype=torch.float64, device=device).requires_grad_(True)
    dh = torch.randn(5, 41, dtype=torch.float64, device=device)
    expect = torch.autograd.grad(ref_fn(g, u), (g, u), dh)
    got = glu_backward_ref(dh, g.detach(), u.detach(), act)
    for e, x in zip(expect, got):
        torch.testing.assert_close(x, e, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------------
# Strided inputs: halves of a fused projection are read in place
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, op, ref_fn, act", OPS, ids=OP_IDS)
@pytest.mark.parametrize("dtype", [F32, F16], ids=["fp32", "fp16"])
def test_fused_projection_views(name, op, ref_fn, act, dtype, device):
    """gate, up = proj.chunk(2, -1) of a (batch, seqlen, 2 * I) projection; the gradient reaches proj."""
    inter = 37
    proj = torch.randn(2, 7, 2 * inter, device=device).to(dtype).requires_grad_(True)
    gate, up = proj.chunk(2, dim=-1)
    assert not gate.is_contiguous()
    check_op(op, ref_fn, gate, up, leaves=((proj,), lambda p: p.chunk(2, dim=-1)))


def test_views_are_not_copied(device, monkeypatch):
    """The kernel reads the fused projection's own memory: no contiguous copy is made of a chunk view."""
    proj = torch.randn(3, 5, 2 * 19, device=device)
    gate, up = proj.chunk(2, dim=-1)
    seen = []
    real = glu_forward.__globals__["_glu_fwd_kernel"]

    class Spy:
        def __getitem__(self, grid):
            def launch(g, u, o, *args, **kwargs):
                seen.append((g.data_ptr(), u.data_ptr(), g.stride(0), u.stride(0)))
                return real[grid](g, u, o, *args, **kwargs)
            return launch

    monkeypatch.setitem(glu_forward.__globals__, "_glu_fwd_kernel", Spy())
    out = glu_forward(gate, up, "silu")
    assert seen == [(proj.data_ptr(), proj.data_ptr() + 19 * proj.element_size(), 38, 38)]
    torch.testing.assert_close(out, F.silu(gate) * up, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name, op, ref_fn, act", OPS, ids=OP_IDS)
def test_other_layouts(name, op, ref_fn, act, device):
    """Layouts that need a copy are still right: leading dims that do not merge into one row stride (a
    transposed view), a strided last dim, and gate / up with different strides."""
    gate = torch.randn(6, 4, 23, device=device).transpose(0, 1).requires_grad_(True)  # (4, 6, 23)
    up = torch.randn(4, 23, 6, device=device).transpose(1, 2).requires_grad_(True)    # last-dim stride 6
    check_op(op, ref_fn, gate, up)
    g2 = torch.randn(9, 2 * 30, device=device)[:, ::2].requires_grad_(True)   # last-dim stride 2
    u2 = torch.randn(9, 30, device=device).requires_grad_(True)
    check_op(op, ref_fn, g2, u2)


def test_expanded_grad_output(device):
    """A stride-0 incoming gradient (from .sum()) is handled: dgate = up * silu'(gate), dup = silu(gate)."""
    gate = torch.randn(3, 17, device=device, requires_grad=True)
    up = torch.randn(3, 17, device=device, requires_grad=True)
    swiglu(gate, up).sum().backward()
    expect = glu_backward_ref(torch.ones(3, 17, dtype=torch.float64, device=device), gate.detach().double(),
                              up.detach().double(), "silu")
    assert_close("dgate", gate.grad, expect[0], F32)
    assert_close("dup", up.grad, expect[1], F32)


# ----------------------------------------------------------------------------------------------------
# Launchers: every element written (NaN-poisoned buffers), several blocks per row
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("block", [None, 16], ids=["default-block", "block16"])
def test_launchers_write_every_element(act, block, device):
    """Outputs go into NaN-filled, strided buffers (column slices of wider ones): every element of the
    view is written with the reference value, nothing outside it is touched. block=16 on 37 columns
    gives two full (unmasked) blocks and a partial one per row."""
    rows, cols = 11, 37
    gate, up, dout = (torch.randn(rows, cols, device=device) * 2 for _ in range(3))
    kwargs = {"block": block, "num_warps": 1} if block else {}
    buf = torch.full((rows, cols + 5), float("nan"), device=device)
    out = glu_forward(gate, up, act, out=buf[:, :cols], **kwargs)
    assert out.data_ptr() == buf.data_ptr()
    assert torch.isnan(buf[:, cols:]).all()
    ref = glu_backward_ref(torch.ones_like(gate).double(), gate.double(), torch.ones_like(up).double(), act)[1]
    assert_close("out", out, ref * up.double(), F32)

    bufs = [torch.full((rows, cols + 3), float("nan"), device=device) for _ in range(2)]
    dgate, dup = glu_backward(dout, gate, up, act, dgate=bufs[0][:, :cols], dup=bufs[1][:, :cols], **kwargs)
    for b in bufs:
        assert torch.isnan(b[:, cols:]).all()
    ref_dgate, ref_dup = glu_backward_ref(dout.double(), gate.double(), up.double(), act)
    assert_close("dgate", dgate, ref_dgate, F32)
    assert_close("dup", dup, ref_dup, F32)


def test_nan_inputs_propagate(device):
    """A NaN in gate or up gives NaN in that output element (and only there): never a silent number."""
    gate, up = torch.randn(4, 9, device=device), torch.randn(4, 9, device=device)
    gate[1, 2] = float("nan")
    up[3, 8] = float("nan")
    for out in (swiglu(gate, up), geglu(gate, up), geglu(gate, up, approximate="tanh")):
        bad = torch.isnan(out)
        assert bad[1, 2] and bad[3, 8] and int(bad.sum()) == 2


def test_empty(device):
    for shape in [(0, 5), (3, 0), (2, 0, 7)]:
        gate = torch.randn(shape, device=device, requires_grad=True)
        up = torch.randn(shape, device=device, requires_grad=True)
        out = swiglu(gate, up)
        assert out.shape == shape
        dgate, dup = torch.autograd.grad(out, (gate, up), torch.ones_like(out))
        assert dgate.shape == shape and dup.shape == shape


# ----------------------------------------------------------------------------------------------------
# Errors and torch.compile
# ----------------------------------------------------------------------------------------------------

def test_errors(device):
    g = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match=r"up has shape \(4, 7\) but gate has \(4, 8\); they must have the same"):
        swiglu(g, torch.randn(4, 7, device=device))
    with pytest.raises(ValueError, match=r"up has shape \(1, 8\) but gate has \(4, 8\)"):
        geglu(g, torch.randn(1, 8, device=device))                      # no broadcasting
    with pytest.raises(ValueError, match=r"approximate is 'erf'; supported: 'none' \(exact erf GELU\) or 'tanh'"):
        geglu(g, g, approximate="erf")
    with pytest.raises(TypeError, match="gate has dtype torch.int64; supported: float16, bfloat16, float32"):
        swiglu(g.long(), g.long())
    with pytest.raises(TypeError, match="up has dtype torch.int32; supported"):
        geglu(g, g.int())
    with pytest.raises(TypeError, match="up has dtype torch.float16 but gate has torch.float32"):
        swiglu(g, g.half())
    with pytest.raises(TypeError, match="gate must be a torch.Tensor, got float"):
        swiglu(1.0, g)
    with pytest.raises(ValueError, match="gate is a 0-dim tensor"):
        swiglu(torch.tensor(1.0, device=device), torch.tensor(2.0, device=device))
    with pytest.raises(ValueError, match="gate is on meta"):
        swiglu(g.to("meta"), g.to("meta"))


@pytest.mark.parametrize("approximate", [None, "none", "tanh"], ids=["swiglu", "geglu", "geglu_tanh"])
def test_torch_compile_fullgraph_small(approximate, device):
    """fullgraph=True (a graph break raises) over chunk + op + a following op, forward and backward: the
    compiled graph calls the same custom ops on the same views, so results are bit-identical to eager."""
    torch._dynamo.reset()

    def fn(proj):
        gate, up = proj.chunk(2, dim=-1)
        h = swiglu(gate, up) if approximate is None else geglu(gate, up, approximate=approximate)
        return h * 2.0

    proj = torch.randn(3, 5, 2 * 13, device=device, requires_grad=True)
    dout = torch.randn(3, 5, 13, device=device)
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        out = f(proj)
        results.append((out,) + torch.autograd.grad(out, proj, dout))
    for name, eager, compiled in zip(("out", "dproj"), *results):
        assert torch.isfinite(compiled).all(), name
        assert torch.equal(compiled, eager), f"{name}: compiled differs from eager"
    assert math.isfinite(results[0][0].sum().item())
