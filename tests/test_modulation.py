"""ada_layer_norm / ada_layer_norm_gate, CPU tier: outputs and every gradient against the float64 reference
on odd shapes (Triton's interpreter on CPU tensors; the GPU tier is test_modulation_gpu.py), the column-loop
paths, strided views, diffusers' AdaLayerNormZero / BasicTransformerBlock expressions, the torch.library
registrations, and error messages.

Every buffer the kernels write starts as NaN (fixture ``poison``), so an element a kernel forgets to
write fails the comparison; NaN never passes (rel_err of a NaN is NaN, and NaN < tol is False).
"""

import pytest
import torch

import flashfuse.ops.modulation as mod_ops
from flashfuse.ops.modulation import (ada_layer_norm, ada_layer_norm_gate, ada_layer_norm_zero_forward,
                                      layer_norm_modulate)
from flashfuse.reference.modulation import (ada_layer_norm_gate_ref, ada_layer_norm_ref,
                                            basic_transformer_block_modulation_ref)
from testing import nan_alloc, rel_err  # noqa: E402

F32, F16 = torch.float32, torch.float16
# Relative error ||out - ref|| / ||ref|| against float64: fp32 kernels measure ~1e-7; fp16 rounds each
# output once (~3e-4).
TOL = {F32: 1e-5, F16: 2e-3}


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(mod_ops, "_alloc", nan_alloc)


def check_op(op, ref_op, tensors: dict, kwargs: dict, tol: float, used=None):
    """Run op and ref_op (inputs upcast to float64) on the same tensors, backpropagate the same random
    cotangents, compare the output(s) and every input's gradient. An op returning a tuple (the residual
    form's (y, h)) has each output compared; ``used``: indices of the outputs in the loss (default all)."""
    ours = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    refs = {k: v.detach().double().requires_grad_() for k, v in tensors.items()}
    outs, ref_outs = op(**ours, **kwargs), ref_op(**refs, **kwargs)
    single = not isinstance(outs, tuple)
    outs, ref_outs = ((outs,), (ref_outs,)) if single else (outs, ref_outs)
    assert len(outs) == len(ref_outs)
    for i, (out, ref) in enumerate(zip(outs, ref_outs)):
        assert out.shape == ref.shape, (i, out.shape, ref.shape)
        assert torch.isfinite(out).all(), f"non-finite output {i}"
        err = rel_err(out, ref)
        assert err < tol, f"output {i} rel err {err:.2e} >= {tol:.0e}"
    used = range(len(outs)) if used is None else used
    cots = {i: torch.randn(outs[i].shape, dtype=torch.float64, device=outs[i].device) for i in used}
    sum((outs[i].double() * cot).sum() for i, cot in cots.items()).backward()
    sum((ref_outs[i] * cot).sum() for i, cot in cots.items()).backward()
    for name, t in ours.items():
        assert t.grad is not None, f"no gradient for {name}"
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        assert torch.isfinite(t.grad).all(), f"non-finite d{name}"
        ref_grad = refs[name].grad
        if ref_grad is None:                          # an input only an unused output depends on
            assert not t.grad.any(), f"d{name} should be 0"
            continue
        err = rel_err(t.grad, ref_grad)
        assert err < tol, f"d{name} rel err {err:.2e} >= {tol:.0e}"
    return outs[0] if single else outs


def vec(shape, dtype, device, scale=0.5):
    return (scale * torch.randn(shape, device=device)).to(dtype)


# (B, T, D, dtype, scale / shift batch dims: "2d" (B, D), "3d" (B, 1, D), "bcast" (1, D))
CASES = [
    pytest.param(1, 1, 5, F32, "2d", id="1x1x5-fp32"),
    pytest.param(2, 37, 123, F32, "3d", id="2x37x123-3d-fp32"),
    pytest.param(3, 5, 40, F32, "bcast", id="3x5x40-bcast-fp32"),
    pytest.param(2, 17, 300, F32, "2d", id="2x17x300-fp32"),
    pytest.param(2, 37, 123, F16, "2d", id="2x37x123-fp16"),
    pytest.param(5, 1, 64, F16, "3d", id="5x1x64-fp16"),
]


def _vec_shape(b, d, kind):
    return {"2d": (b, d), "3d": (b, 1, d), "bcast": (1, d)}[kind]


@pytest.mark.parametrize("b, t, d, dtype, kind", CASES)
def test_ada_layer_norm(device, b, t, d, dtype, kind):
    x = (torch.randn(b, t, d, device=device) * 2 + 1).to(dtype)
    tensors = {"x": x, "scale": vec(_vec_shape(b, d, kind), dtype, device),
               "shift": vec(_vec_shape(b, d, kind), dtype, device)}
    out = check_op(ada_layer_norm, ada_layer_norm_ref, tensors, {"eps": 1e-6}, TOL[dtype])
    assert out.dtype == dtype


@pytest.mark.parametrize("b, t, d, dtype, kind", CASES)
def test_ada_layer_norm_gate(device, b, t, d, dtype, kind):
    tensors = {"residual": torch.randn(b, t, d, device=device).to(dtype),
               "gate": vec(_vec_shape(b, d, kind), dtype, device),
               "y": torch.randn(b, t, d, device=device).to(dtype)}
    out = check_op(ada_layer_norm_gate, ada_layer_norm_gate_ref, tensors, {}, TOL[dtype])
    assert out.dtype == dtype


def residual_tensors(b, t, d, dtype, kind, device, gate=True):
    """Inputs of the residual form: x (the branch output), residual (the stream), scale, shift and gate."""
    tensors = {"x": torch.randn(b, t, d, device=device).to(dtype),
               "residual": (torch.randn(b, t, d, device=device) * 2 + 1).to(dtype),
               "scale": vec(_vec_shape(b, d, kind), dtype, device),
               "shift": vec(_vec_shape(b, d, kind), dtype, device)}
    if gate:
        tensors["gate"] = vec(_vec_shape(b, d, kind), dtype, device, scale=1.0)
    return tensors


@pytest.mark.parametrize("gate", [True, False], ids=["gate", "nogate"])
@pytest.mark.parametrize("b, t, d, dtype, kind", CASES)
def test_ada_layer_norm_residual(device, b, t, d, dtype, kind, gate):
    """The residual form (y, h) = (LN(h) * (1 + scale) + shift, residual + gate * x): both outputs and the
    gradients of x, residual, gate, scale, shift, with random cotangents on both outputs."""
    tensors = residual_tensors(b, t, d, dtype, kind, device, gate)
    y, h = check_op(ada_layer_norm, ada_layer_norm_ref, tensors, {"eps": 1e-6}, TOL[dtype])
    assert y.dtype == h.dtype == dtype


@pytest.mark.parametrize("used", [(0,), (1,)], ids=["y-only", "h-only"])
@pytest.mark.parametrize("gate", [True, False], ids=["gate", "nogate"])
def test_residual_one_output_used(device, used, gate):
    """Only y (or only h) in the loss: the other output's gradient arrives as zeros."""
    tensors = residual_tensors(2, 37, 123, F32, "3d", device, gate)
    check_op(ada_layer_norm, ada_layer_norm_ref, tensors, {}, TOL[F32], used=used)


def test_mixed_dtypes(device):
    """fp16 tokens with fp32 modulation vectors: the output is fp32 (torch's promotion, as diffusers'
    expression gives), gradients in each input's dtype."""
    x = torch.randn(2, 9, 48, device=device).to(F16)
    out = check_op(ada_layer_norm, ada_layer_norm_ref,
                   {"x": x, "scale": vec((2, 48), F32, device), "shift": vec((2, 48), F32, device)}, {},
                   TOL[F16])
    assert out.dtype == F32
    out = check_op(ada_layer_norm_gate, ada_layer_norm_gate_ref,
                   {"residual": x, "gate": vec((2, 48), F32, device), "y": x.clone()}, {}, TOL[F16])
    assert out.dtype == F32
    # residual form: an fp32 gate (or an fp32 residual stream) makes h, and then y, fp32
    y, h = check_op(ada_layer_norm, ada_layer_norm_ref,
                    {"x": x, "residual": x * 2, "gate": vec((2, 48), F32, device), "scale": vec((2, 48), F16, device),
                     "shift": vec((2, 48), F16, device)}, {}, TOL[F16])
    assert h.dtype == y.dtype == F32
    y, h = check_op(ada_layer_norm, ada_layer_norm_ref,
                    {"x": x, "residual": x.float() * 2, "scale": vec((2, 48), F16, device),
                     "shift": vec((2, 48), F16, device)}, {}, TOL[F16])
    assert h.dtype == y.dtype == F32


@pytest.mark.parametrize("b, t, d", [(2, 37, 300), (1, 5, 1000), (3, 3, 129)])
def test_column_loop(device, monkeypatch, b, t, d):
    """Small block caps force the column-loop paths (forward Chan statistics + normalize pass, backward
    row-sums pass + owned partial rows updated per row block; several row blocks per program), odd
    widths with a ragged last block; the gate's elementwise tiles split the columns too."""
    monkeypatch.setattr(mod_ops, "MAX_BLOCK_N_FWD", 128)
    monkeypatch.setattr(mod_ops, "MAX_BLOCK_N_BWD", 64)
    monkeypatch.setattr(mod_ops, "GATE_MAX_BLOCK_N", 64)
    monkeypatch.setattr(mod_ops, "TILE_ELEMENTS", 256)
    x = (torch.randn(b, t, d, device=device) * 0.5 + 20.0)  # a large mean: the statistics must not cancel
    check_op(ada_layer_norm, ada_layer_norm_ref,
             {"x": x, "scale": vec((b, d), F32, device), "shift": vec((b, 1, d), F32, device)}, {}, TOL[F32])
    check_op(ada_layer_norm_gate, ada_layer_norm_gate_ref,
             {"residual": x, "gate": vec((b, d), F32, device), "y": torch.randn(b, t, d, device=device)}, {},
             TOL[F32])
    # residual form: the statistics pass stores h, the normalize pass recomputes it; backward adds dh
    for gate in ({"gate": vec((b, 1, d), F32, device)}, {}):
        check_op(ada_layer_norm, ada_layer_norm_ref,
                 {"x": torch.randn(b, t, d, device=device), "residual": x, "scale": vec((b, d), F32, device),
                  "shift": vec((1, d), F32, device), **gate}, {}, TOL[F32])


def test_hidden_65536(device):
    """The production caps: 65536 columns loop over 16384-wide (forward) / 8192-wide (backward) blocks."""
    check_op(ada_layer_norm, ada_layer_norm_ref,
             {"x": torch.randn(1, 2, 65536, device=device) + 3, "scale": vec((1, 65536), F32, device),
              "shift": vec((1, 65536), F32, device)}, {}, TOL[F32])


def test_strided_views(device):
    """diffusers' ``emb.chunk(6, dim=1)`` views (row stride 6 D) and a token slice (strided rows) are
    used in place; a strided last dim is copied."""
    b, t, d = 2, 7, 40
    emb = torch.randn(b, 6 * d, device=device)
    shift, scale, gate = emb.chunk(6, dim=1)[:3]
    big = torch.randn(b, 2 * t, 2 * d, device=device)
    x = big[:, ::2, :d]                                   # strides (4 t d, 4 d, 1)
    assert scale.stride() == (6 * d, 1) and x.stride(1) == 4 * d
    check_op(ada_layer_norm, ada_layer_norm_ref, {"x": x, "scale": scale, "shift": shift}, {}, TOL[F32])
    check_op(ada_layer_norm_gate, ada_layer_norm_gate_ref, {"residual": x, "gate": gate, "y": x * 2}, {},
             TOL[F32])
    # residual form: residual and x are slices of one bigger tensor (different strides, offsets), gate a chunk
    check_op(ada_layer_norm, ada_layer_norm_ref,
             {"x": big[:, 1::2, d:], "residual": x, "gate": gate, "scale": scale, "shift": shift}, {}, TOL[F32])
    xt = torch.randn(b, d, t, device=device).transpose(1, 2)  # last dim strided
    torch.testing.assert_close(ada_layer_norm(xt, scale, shift), ada_layer_norm_ref(xt, scale, shift))
    for ours, ref in zip(ada_layer_norm(xt, scale, shift, residual=x, gate=gate),
                         ada_layer_norm_ref(xt, scale, shift, residual=x, gate=gate)):
        torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("loop", [False, True], ids=["one-block", "column-loop"])
@pytest.mark.parametrize("kind", ["2d", "bcast", None], ids=["gate2d", "gate-bcast", "nogate"])
def test_residual_bitwise_composition(device, monkeypatch, loop, kind):
    """fp16: the fused forward equals ada_layer_norm(ada_layer_norm_gate(residual, gate, x), ...) bit for
    bit (h rounded once, then normalized), in both kernel paths."""
    if loop:
        monkeypatch.setattr(mod_ops, "MAX_BLOCK_N_FWD", 64)
        monkeypatch.setattr(mod_ops, "TILE_ELEMENTS", 256)
    b, t, d = 3, 37, 300
    x, residual = torch.randn(b, t, d, device=device).to(F16), (torch.randn(b, t, d, device=device) * 4).to(F16)
    scale, shift = vec((b, d), F16, device), vec((b, 1, d), F16, device)
    gate = None if kind is None else vec(_vec_shape(b, d, kind), F16, device, scale=1.0)
    y, h = ada_layer_norm(x, scale, shift, residual=residual, gate=gate)
    h2 = residual + x if gate is None else ada_layer_norm_gate(residual, gate, x)
    assert h.dtype == y.dtype == F16
    assert torch.equal(h, h2)
    assert torch.equal(y, ada_layer_norm(h2, scale, shift))


def test_empty(device):
    x = torch.randn(2, 0, 16, device=device, requires_grad=True)
    s = torch.randn(2, 16, device=device, requires_grad=True)
    y = ada_layer_norm(x, s, s)
    assert y.shape == (2, 0, 16)
    y.sum().backward()
    assert torch.equal(s.grad, torch.zeros_like(s))
    s.grad = None
    y, h = ada_layer_norm(x, s, s, residual=x, gate=s)
    assert y.shape == h.shape == (2, 0, 16)
    (y.sum() + h.sum()).backward()
    assert torch.equal(s.grad, torch.zeros_like(s))


def test_deterministic_backward(device):
    x = torch.randn(3, 37, 123, device=device)
    grads = []
    for _ in range(2):
        leaves = [v.detach().clone().requires_grad_() for v in (x, x[:, 0], x[:, 1], x[:, 2] * 0.1)]
        y = ada_layer_norm(leaves[0], leaves[1], leaves[2])
        ada_layer_norm_gate(leaves[0], leaves[3], y).pow(2).sum().backward()
        grads.append([v.grad for v in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------------------
# diffusers: AdaLayerNormZero and BasicTransformerBlock(norm_type="ada_norm_zero")
# ----------------------------------------------------------------------------------------------------

def test_diffusers_ada_layer_norm_zero(device):
    """ada_layer_norm_zero_forward is AdaLayerNormZero.forward: same five outputs (fp32: tight)."""
    from diffusers.models.normalization import AdaLayerNormZero

    d = 48
    module = AdaLayerNormZero(d, num_embeddings=10).to(device).eval()  # eval: no random label drop
    x = torch.randn(3, 11, d, device=device)
    t, labels = torch.tensor([1, 500, 999], device=device), torch.tensor([0, 3, 9], device=device)
    ours = ada_layer_norm_zero_forward(module, x, t, labels, hidden_dtype=torch.float32)
    theirs = module(x, t, labels, hidden_dtype=torch.float32)
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def ada_norm_zero_block(d, affine, device):
    """A diffusers BasicTransformerBlock(ada_norm_zero) of width d, its norm3 affine (weight and bias away from
    1 / 0) or not."""
    from diffusers.models.attention import BasicTransformerBlock

    block = BasicTransformerBlock(d, 2, 20, norm_type="ada_norm_zero", num_embeds_ada_norm=10,
                                  norm_elementwise_affine=affine, norm_eps=1e-5).to(device)
    if affine:
        with torch.no_grad():
            block.norm3.weight.normal_(1.0, 0.3)
            block.norm3.bias.normal_(0.0, 0.3)
    return block


@pytest.mark.parametrize("affine", [False, True])
def test_diffusers_basic_block_norm3(device, affine):
    """BasicTransformerBlock(ada_norm_zero)'s feed-forward modulation ``norm3(h) * (1 + scale_mlp[:, None])
    + shift_mlp[:, None]`` through layer_norm_modulate (the affine norm folded into scale / shift),
    gradients included, against diffusers' expression in float64."""
    d = 40
    block = ada_norm_zero_block(d, affine, device)
    h = torch.randn(2, 9, d, device=device, requires_grad=True)
    scale, shift = (vec((2, d), F32, device).requires_grad_() for _ in range(2))
    out = layer_norm_modulate(block.norm3, h, scale, shift)
    norm3 = block.norm3.double()
    leaves = [v.detach().double().requires_grad_() for v in (h, scale, shift)]
    ref = basic_transformer_block_modulation_ref(*leaves, eps=norm3.eps, weight=norm3.weight, bias=norm3.bias)
    assert rel_err(out, ref) < TOL[F32]
    cot = torch.randn_like(ref)
    (out * cot.float()).sum().backward()
    (ref * cot).sum().backward()
    for ours, theirs in zip((h, scale, shift), leaves):
        assert rel_err(ours.grad, theirs.grad) < TOL[F32]
    if affine:
        assert rel_err(block.norm3.weight.grad, norm3.weight.grad) < TOL[F32]
        assert rel_err(block.norm3.bias.grad, norm3.bias.grad) < TOL[F32]


@pytest.mark.parametrize("affine", [False, True])
def test_diffusers_basic_block_residual_norm3(device, affine):
    """BasicTransformerBlock(ada_norm_zero)'s attention residual followed by norm3's modulation,
    ``h = gate_msa.unsqueeze(1) * attn_output + h; n = norm3(h) * (1 + scale_mlp[:, None]) +
    shift_mlp[:, None]``, is ``n, h = layer_norm_modulate(norm3, attn_output, scale_mlp, shift_mlp,
    residual=h, gate=gate_msa)``: both outputs and every gradient (norm3's weight and bias included)
    against diffusers' expression in float64, random cotangents on n and h."""
    d = 40
    block = ada_norm_zero_block(d, affine, device)
    h = torch.randn(2, 9, d, device=device, requires_grad=True)
    attn = torch.randn(2, 9, d, device=device, requires_grad=True)
    scale, shift, gate = (vec((2, d), F32, device).requires_grad_() for _ in range(3))
    n, h_new = layer_norm_modulate(block.norm3, attn, scale, shift, residual=h, gate=gate)
    norm3 = block.norm3.double()
    leaves = [v.detach().double().requires_grad_() for v in (h, attn, scale, shift, gate)]
    h_ref = leaves[4].unsqueeze(1) * leaves[1] + leaves[0]
    n_ref = basic_transformer_block_modulation_ref(h_ref, *leaves[2:4], eps=norm3.eps, weight=norm3.weight,
                                                   bias=norm3.bias)
    assert rel_err(n, n_ref) < TOL[F32] and rel_err(h_new, h_ref) < TOL[F32]
    cot_n, cot_h = torch.randn_like(n_ref), torch.randn_like(h_ref)
    ((n * cot_n.float()).sum() + (h_new * cot_h.float()).sum()).backward()
    ((n_ref * cot_n).sum() + (h_ref * cot_h).sum()).backward()
    for name, ours, theirs in zip(("h", "attn", "scale", "shift", "gate"), (h, attn, scale, shift, gate), leaves):
        assert rel_err(ours.grad, theirs.grad) < TOL[F32], name
    if affine:
        assert rel_err(block.norm3.weight.grad, norm3.weight.grad) < TOL[F32]
        assert rel_err(block.norm3.bias.grad, norm3.bias.grad) < TOL[F32]


def test_diffusers_expression_fp16(device):
    """In fp16 we round once, diffusers after each op: both stay close to float64; ours is the closer."""
    x = torch.randn(2, 33, 64, device=device).to(F16)
    scale, shift = vec((2, 64), F16, device), vec((2, 64), F16, device)
    exact = ada_layer_norm_ref(x.double(), scale.double(), shift.double())
    ours = ada_layer_norm(x, scale, shift)
    theirs = basic_transformer_block_modulation_ref(x, scale, shift)
    assert ours.dtype == theirs.dtype == F16
    assert rel_err(ours, exact) <= rel_err(theirs, exact) < TOL[F16]


# ----------------------------------------------------------------------------------------------------
# torch.library registration
# ----------------------------------------------------------------------------------------------------

def test_opcheck(device):
    x = torch.randn(2, 5, 40, device=device, requires_grad=True)
    y = torch.randn(2, 5, 40, device=device, requires_grad=True)
    s = torch.randn(2, 40, device=device, requires_grad=True)
    s1 = torch.randn(1, 40, device=device, requires_grad=True)
    torch.library.opcheck(torch.ops.flashfuse.ada_layer_norm_fwd, (x, s, s1, 1e-6))
    torch.library.opcheck(torch.ops.flashfuse.ada_layer_norm_gate_fwd, (x, s, y))
    torch.library.opcheck(torch.ops.flashfuse.ada_layer_norm_residual_fwd, (x, y, s1, s, s1, 1e-6))
    torch.library.opcheck(torch.ops.flashfuse.ada_layer_norm_residual_fwd, (x, y, None, s, s1, 1e-6))


def eager_and_grads(fn, inputs):
    """fn(**inputs) on fresh leaves, and their gradients of out.pow(2).sum()."""
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    out = fn(**leaves)
    out.pow(2).sum().backward()
    return out, {k: v.grad for k, v in leaves.items()}


def test_compile_fullgraph(device):
    """A DiT half-block (modulate, a linear as the branch, gated residual) traces with each op as one node,
    forward and backward, equal to eager."""
    b, t, d = 2, 5, 40
    inputs = {"x": torch.randn(b, t, d, device=device), "emb": torch.randn(b, 3 * d, device=device),
              "w": torch.randn(d, d, device=device) * 0.1}

    def block(x, emb, w):
        shift, scale, gate = emb.chunk(3, dim=1)
        return ada_layer_norm_gate(x, gate, ada_layer_norm(x, scale, shift) @ w)

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    results = [eager_and_grads(fn, inputs) for fn in (block, compiled)]
    torch.testing.assert_close(results[1][0], results[0][0])
    for k in inputs:
        torch.testing.assert_close(results[1][1][k], results[0][1][k])


@pytest.mark.parametrize("gate", [True, False], ids=["gate", "nogate"])
def test_compile_fullgraph_residual(device, gate):
    """A whole DiT block's norms: modulate, attention stand-in, the fused gated residual + modulated norm
    (one flashfuse::ada_layer_norm_residual_fwd node, forward and backward), feed-forward stand-in, gated
    residual; both outputs of the fused op feed the loss. Equal to eager."""
    b, t, d = 2, 5, 40
    inputs = {"x": torch.randn(b, t, d, device=device), "emb": torch.randn(b, 6 * d, device=device),
              "w": torch.randn(d, d, device=device) * 0.1}

    def block(x, emb, w):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        attn = ada_layer_norm(x, scale_msa, shift_msa) @ w
        n, h = ada_layer_norm(attn, scale_mlp, shift_mlp, residual=x, gate=gate_msa if gate else None)
        return ada_layer_norm_gate(h, gate_mlp, n @ w)

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []  # the forward and backward graphs AOTAutograd traces (with the ops' fake functions)

    def record(gm, _example_inputs):
        graphs.append(gm.code)
        return make_boxed_func(gm.forward)

    compiled = torch.compile(block, backend=aot_autograd(fw_compiler=record, bw_compiler=record), fullgraph=True)
    results = [eager_and_grads(fn, inputs) for fn in (block, compiled)]
    assert len(graphs) == 2, "expected one forward and one backward graph"
    assert "ada_layer_norm_residual_fwd" in graphs[0] and "ada_layer_norm_residual_bwd" in graphs[1]
    # the block's last gated residual, and the fused op's gate (when given), each one gate backward
    assert graphs[1].count("ada_layer_norm_gate_bwd.default(") == (2 if gate else 1)
    torch.testing.assert_close(results[1][0], results[0][0])
    for k in inputs:
        torch.testing.assert_close(results[1][1][k], results[0][1][k])


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------

def test_errors(device):
    x = torch.randn(2, 3, 16, device=device)
    s = torch.randn(2, 16, device=device)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions, got shape \(6, 16\)"):
        ada_layer_norm(x.reshape(6, 16), s, s)
    with pytest.raises(ValueError, match=r"scale has shape \(3, 16\); expected \(2, 16\) or \(2, 1, 16\)"):
        ada_layer_norm(x, torch.randn(3, 16, device=device), s)
    with pytest.raises(ValueError, match=r"shift has shape \(2, 3, 16\); expected \(2, 16\) or \(2, 1, 16\)"):
        ada_layer_norm(x, s, x)
    with pytest.raises(ValueError, match=r"scale has shape \(2, 8\)"):
        ada_layer_norm(x, s[:, :8], s)
    with pytest.raises(TypeError, match="scale has dtype torch.int64; supported: float16, bfloat16, float32"):
        ada_layer_norm(x, torch.ones(2, 16, dtype=torch.int64, device=device), s)
    with pytest.raises(ValueError, match="eps is -1.0; supported: a finite number >= 0"):
        ada_layer_norm(x, s, s, eps=-1.0)
    with pytest.raises(ValueError, match=r"x has shape \(2, 3, 0\); expected \(batch, tokens, dim\) with dim >= 1"):
        ada_layer_norm(torch.randn(2, 3, 0, device=device), s[:, :0], s[:, :0])
    with pytest.raises(ValueError, match=r"y has shape \(2, 4, 16\) but residual has \(2, 3, 16\)"):
        ada_layer_norm_gate(x, s, torch.randn(2, 4, 16, device=device))
    with pytest.raises(ValueError, match=r"gate has shape \(2, 17\)"):
        ada_layer_norm_gate(x, torch.randn(2, 17, device=device), x)
    with pytest.raises(TypeError, match="gate must be a torch.Tensor, got float"):
        ada_layer_norm_gate(x, 0.5, x)
    with pytest.raises(ValueError, match="norm is .*; supported: a torch.nn.LayerNorm over the last dim"):
        layer_norm_modulate(torch.nn.GroupNorm(4, 16), x, s, s)
    # the residual form
    with pytest.raises(ValueError, match="gate is given without residual; gate needs residual"):
        ada_layer_norm(x, s, s, gate=s)
    with pytest.raises(ValueError, match="gate is given without residual; gate needs residual"):
        layer_norm_modulate(torch.nn.LayerNorm(16), x, s, s, gate=s)
    with pytest.raises(ValueError, match=r"residual has shape \(2, 4, 16\) but x has \(2, 3, 16\); they must match"):
        ada_layer_norm(x, s, s, residual=torch.randn(2, 4, 16, device=device), gate=s)
    with pytest.raises(ValueError, match=r"residual must have 3 dimensions, got shape \(6, 16\)"):
        ada_layer_norm(x, s, s, residual=x.reshape(6, 16))
    with pytest.raises(ValueError, match=r"gate has shape \(3, 16\); expected \(2, 16\) or \(2, 1, 16\)"):
        ada_layer_norm(x, s, s, residual=x, gate=torch.randn(3, 16, device=device))
    with pytest.raises(TypeError, match="residual has dtype torch.int64; supported: float16, bfloat16, float32"):
        ada_layer_norm(x, s, s, residual=torch.ones(2, 3, 16, dtype=torch.int64, device=device))
    with pytest.raises(TypeError, match="gate must be a torch.Tensor, got float"):
        ada_layer_norm(x, s, s, residual=x, gate=0.5)
