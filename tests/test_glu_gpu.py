"""swiglu / geglu, GPU tier (`pytest -m gpu`): bf16 / fp16 at real sizes (Llama-3-8B's 14336, Llama-2's
11008, odd widths), halves of a fused projection, every gradient, torch.compile(fullgraph=True).

Reference: reference/glu.py on the same inputs upcast to float32 (its error, ~1e-7, is far below the bf16 /
fp16 rounding being judged; float64 at 4096 x 14336 buys nothing)."""

import pytest
import torch

from flashfuse.ops.glu import geglu, swiglu
from flashfuse.reference.glu import geglu_ref, swiglu_ref

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
# ||x - ref|| / ||ref||: one rounding of an fp32 value, at most 2^-9 (bf16) / 2^-11 (fp16) per element.
REL = {BF16: 4e-3, F16: 1e-3}

OPS = {
    "swiglu": (swiglu, swiglu_ref),
    "geglu": (lambda g, u: geglu(g, u), lambda g, u: geglu_ref(g, u, "none")),
    "geglu_tanh": (lambda g, u: geglu(g, u, approximate="tanh"), lambda g, u: geglu_ref(g, u, "tanh")),
}


def assert_close(name, x, ref, dtype):
    assert x.dtype == dtype and x.shape == ref.shape, f"{name}: {x.dtype} {tuple(x.shape)}"
    assert torch.isfinite(x).all(), f"{name}: {int((~torch.isfinite(x)).sum())} NaN/Inf values"
    rel = ((x.float() - ref).norm() / ref.norm()).item()
    assert rel <= REL[dtype], f"{name}: relative error {rel:.3e} > {REL[dtype]:.0e} ({dtype})"


def run_and_check(op_name, proj_shape, inter, dtype, fused):
    """(rows..., 2 * inter) fused projection, or separate gate / up; out and every gradient."""
    op, ref_fn = OPS[op_name]
    if fused:
        proj = (torch.randn(proj_shape, device="cuda") * 2).to(dtype).requires_grad_(True)
        leaves = (proj,)
        split = lambda p: (p[..., :inter], p[..., inter:])          # noqa: E731
    else:
        shape = proj_shape[:-1] + (inter,)
        gate = (torch.randn(shape, device="cuda") * 2).to(dtype).requires_grad_(True)
        up = torch.randn(shape, device="cuda").to(dtype).requires_grad_(True)
        leaves = (gate, up)
        split = lambda g, u: (g, u)                                 # noqa: E731
    out = op(*split(*leaves))
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    leaves32 = [t.detach().float().requires_grad_(True) for t in leaves]
    ref = ref_fn(*split(*leaves32))
    ref_grads = torch.autograd.grad(ref, leaves32, dout.float())
    assert_close("out", out, ref.detach(), dtype)
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert_close(f"grad {i}", g, r, dtype)


@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.parametrize("rows, inter, dtype, fused", [
    ((4096,), 14336, BF16, True),          # Llama-3-8B MLP, fused gate_up projection
    ((2, 2048), 11008, F16, False),        # Llama-2-7B, separate projections
    ((8, 511), 3000, BF16, False),         # odd rows, a partial last block
    ((1,), 5, F16, True),
    ((37,), 65536, BF16, True),            # huge rows: 32 blocks per row
], ids=["4096x14336-bf16-fused", "2x2048x11008-fp16", "8x511x3000-bf16", "1x5-fp16-fused",
        "37x65536-bf16-fused"])
def test_glu_gpu(op_name, rows, inter, dtype, fused):
    run_and_check(op_name, rows + (2 * inter,), inter, dtype, fused)


@pytest.mark.parametrize("approximate", [None, "none", "tanh"], ids=["swiglu", "geglu", "geglu_tanh"])
def test_torch_compile_fullgraph(approximate):
    """fullgraph=True (a graph break raises) around the split of a fused projection, the op and a scale
    (exact in bf16, so Inductor may fuse it anywhere): the compiled graph runs the same kernels on the same
    views as eager, so out and the gradient are bit-identical."""
    torch._dynamo.reset()

    def fn(proj):
        gate, up = proj.chunk(2, dim=-1)
        h = swiglu(gate, up) if approximate is None else geglu(gate, up, approximate=approximate)
        return h * 2.0

    proj = torch.randn(2, 2048, 2 * 14336, device="cuda", dtype=BF16, requires_grad=True)
    dout = torch.randn(2, 2048, 14336, device="cuda", dtype=BF16)
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        out = f(proj)
        results.append((out,) + torch.autograd.grad(out, proj, dout))
    for name, eager, compiled in zip(("out", "dproj"), *results):
        assert torch.isfinite(compiled).all(), name
        assert torch.equal(compiled, eager), (f"{name}: compiled differs from eager by up to "
                                              f"{(compiled.float() - eager.float()).abs().max().item():.3e}")
