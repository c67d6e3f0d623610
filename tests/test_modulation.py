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


def check_op(op, ref_op, tensors: dict, kwargs: dict, tol: float):
    """Run op and ref_op (inputs upcast to float64) on the same tensors, backpropagate the same random
    cotangent, compare the output and every input's gradient."""
    ours = {k: v.detach().clone().requires_grad_() for k, v in tensors.items()}
    refs = {k: v.detach().double().requires_grad_() for k, v in tensors.items()}
    out = op(**ours, **kwargs)
    ref = ref_op(**refs, **kwargs)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert torch.isfinite(out).all(), "non-finite output"
    err = rel_err(out, ref)
    assert err < tol, f"output rel err {err:.2e} >= {tol:.0e}"
    cot = torch.randn(out.shape, dtype=torch.float64, device=out.device)
    (out.double() * cot).sum().backward()
    (ref * cot).sum().backward()
    for name, t in ours.items():
        assert t.grad is not None, f"no gradient for {name}"
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        assert torch.isfinite(t.grad).all(), f"non-finite d{name}"
        err = rel_err(t.grad, refs[name].grad)
        assert err < tol, f"d{name} rel err {err:.2e} >= {tol:.0e}"
    return out


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
    xt = torch.randn(b, d, t, device=device).transpose(1, 2)  # last dim strided
    torch.testing.assert_close(ada_layer_norm(xt, scale, shift), ada_layer_norm_ref(xt, scale, shift))


def test_empty(device):
    x = torch.randn(2, 0, 16, device=device, requires_grad=True)
    s = torch.randn(2, 16, device=device, requires_grad=True)
    y = ada_layer_norm(x, s, s)
    assert y.shape == (2, 0, 16)
    y.sum().backward()
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


@pytest.mark.parametrize("affine", [False, True])
def test_diffusers_basic_block_norm3(device, affine):
    """BasicTransformerBlock(ada_norm_zero)'s feed-forward modulation ``norm3(h) * (1 + scale_mlp[:, None])
    + shift_mlp[:, None]`` through layer_norm_modulate (the affine norm folded into scale / shift),
    gradients included, against diffusers' expression in float64."""
    from diffusers.models.attention import BasicTransformerBlock

    d = 40
    block = BasicTransformerBlock(d, 2, 20, norm_type="ada_norm_zero", num_embeds_ada_norm=10,
                                  norm_elementwise_affine=affine, norm_eps=1e-5).to(device)
    if affine:
        with torch.no_grad():
            block.norm3.weight.normal_(1.0, 0.3)
            block.norm3.bias.normal_(0.0, 0.3)
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
    results = []
    for fn in (block, compiled):
        leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
        out = fn(**leaves)
        out.pow(2).sum().backward()
        results.append((out, {k: v.grad for k, v in leaves.items()}))
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
