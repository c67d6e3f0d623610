"""ada_layer_norm / ada_layer_norm_gate, GPU tier: bf16 / fp16 at DiT / SD3 / Flux sizes and odd shapes,
every gradient against the float64 reference, the residual form (gated residual + modulated LayerNorm in
one kernel, bitwise the two-kernel composition), diffusers' AdaLayerNormZero in bf16, and
torch.compile(fullgraph=True) bitwise equal to eager."""

import pytest
import torch

from flashfuse.ops.modulation import ada_layer_norm, ada_layer_norm_gate, ada_layer_norm_zero_forward
from flashfuse.reference.modulation import ada_layer_norm_gate_ref, ada_layer_norm_ref
from test_modulation import check_op, poison, rel_err, vec  # noqa: F401  (poison: autouse NaN-filled buffers)

pytestmark = pytest.mark.gpu

BF16, F16 = torch.bfloat16, torch.float16
# Outputs rounded once to the dtype (bf16 unit roundoff 2^-9, fp16 2^-12); dscale / dshift / dgate are fp32
# sums over up to 4096 tokens, rounded once.
TOL = {BF16: 1e-2, F16: 2e-3}

# (B, T, D): DiT-XL/2 at 256 px (256 tokens of 1152), SD3-medium (4096 tokens of 1536), Flux (4096 of
# 3072), a 65536-wide row (column loops), odd shapes.
SHAPES = [(8, 256, 1152), (2, 4096, 1536), (1, 4096, 3072), (2, 3, 65536), (3, 37, 123), (5, 1, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_ada_layer_norm_gpu(shape, dtype):
    b, t, d = shape
    tensors = {"x": torch.randn(shape, device="cuda").to(dtype), "scale": vec((b, d), dtype, "cuda"),
               "shift": vec((b, 1, d), dtype, "cuda")}
    check_op(ada_layer_norm, ada_layer_norm_ref, tensors, {"eps": 1e-6}, TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_ada_layer_norm_gate_gpu(shape, dtype):
    b, t, d = shape
    tensors = {"residual": torch.randn(shape, device="cuda").to(dtype), "gate": vec((b, d), dtype, "cuda"),
               "y": torch.randn(shape, device="cuda").to(dtype)}
    check_op(ada_layer_norm_gate, ada_layer_norm_gate_ref, tensors, {}, TOL[dtype])


# The residual form at DiT-XL/2's block size (the fused gate + norm3 modulation), a column-loop width and
# an odd shape.
RESIDUAL_SHAPES = [(2, 256, 1152), (2, 3, 65536), (3, 37, 123)]


@pytest.mark.parametrize("gate", ["2d", "3d", None], ids=["gate2d", "gate3d", "nogate"])
@pytest.mark.parametrize("shape", RESIDUAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_ada_layer_norm_residual_gpu(shape, dtype, gate):
    """(y, h) = ada_layer_norm(x, scale, shift, residual=, gate=): both outputs and the gradients of x,
    residual, gate, scale and shift against float64, random cotangents on both outputs."""
    b, t, d = shape
    tensors = {"x": torch.randn(shape, device="cuda").to(dtype),
               "residual": (torch.randn(shape, device="cuda") * 2 + 1).to(dtype),
               "scale": vec((b, d), dtype, "cuda"), "shift": vec((b, 1, d), dtype, "cuda")}
    if gate is not None:
        tensors["gate"] = vec((b, d) if gate == "2d" else (b, 1, d), dtype, "cuda", scale=1.0)
    y, h = check_op(ada_layer_norm, ada_layer_norm_ref, tensors, {"eps": 1e-6}, TOL[dtype])
    assert y.dtype == h.dtype == dtype


@pytest.mark.parametrize("shape", RESIDUAL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_residual_bitwise_composition_gpu(shape, dtype):
    """The fused forward is bitwise the two-kernel composition it replaces (h rounded once, then normalized)."""
    b, t, d = shape
    x, residual = torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)
    scale, shift, gate = (vec((b, d), dtype, "cuda") for _ in range(3))
    y, h = ada_layer_norm(x, scale, shift, residual=residual, gate=gate)
    h2 = ada_layer_norm_gate(residual, gate, x)
    assert torch.equal(h, h2)
    assert torch.equal(y, ada_layer_norm(h2, scale, shift))


def test_diffusers_ada_layer_norm_zero_gpu():
    """bf16 AdaLayerNormZero: ours (one rounding) is at least as close to float64 as diffusers (three)."""
    from diffusers.models.normalization import AdaLayerNormZero

    module = AdaLayerNormZero(1152, num_embeddings=1000).to("cuda", BF16).eval()
    x = torch.randn(4, 256, 1152, device="cuda", dtype=BF16)
    t, labels = torch.tensor([1, 10, 500, 999], device="cuda"), torch.tensor([0, 1, 2, 3], device="cuda")
    ours = ada_layer_norm_zero_forward(module, x, t, labels, hidden_dtype=BF16)
    theirs = module(x, t, labels, hidden_dtype=BF16)
    for a, b in zip(ours[1:], theirs[1:]):
        assert torch.equal(a, b)
    emb = module.linear(module.silu(module.emb(t, labels, hidden_dtype=BF16)))
    shift, scale = emb.chunk(6, dim=1)[:2]
    exact = ada_layer_norm_ref(x.double(), scale.double(), shift.double())
    assert rel_err(ours[0], exact) <= rel_err(theirs[0], exact) + 1e-4
    assert rel_err(ours[0], exact) < TOL[BF16]


def assert_compiled_matches_eager(block, inputs, cot):
    """block(**inputs) under torch.compile(fullgraph=True) equals eager bitwise: output and every input gradient."""
    compiled = torch.compile(block, fullgraph=True)
    results = []
    for fn in (block, compiled):
        leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
        out = fn(**leaves)
        out.backward(cot)
        results.append((out, {k: v.grad for k, v in leaves.items()}))
    assert torch.equal(results[1][0], results[0][0])
    for k in inputs:
        assert torch.equal(results[1][1][k], results[0][1][k]), f"d{k} differs under torch.compile"


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_compile_fullgraph_gpu(dtype):
    """A DiT half-block (modulate, a stand-in branch, gated residual) under torch.compile(fullgraph=True):
    bitwise equal to eager, forward and every gradient (the ops are opaque nodes; the glue, a multiply by
    2, is exact, where a matmul's backward could pick other cuBLAS kernels under Inductor)."""
    b, t, d = 4, 256, 1152
    inputs = {"x": torch.randn(b, t, d, device="cuda", dtype=dtype),
              "emb": torch.randn(b, 3 * d, device="cuda", dtype=dtype)}

    def block(x, emb):
        shift, scale, gate = emb.chunk(3, dim=1)
        return ada_layer_norm_gate(x, gate, ada_layer_norm(x, scale, shift) * 2)

    assert_compiled_matches_eager(block, inputs, torch.randn(b, t, d, device="cuda", dtype=dtype))


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_compile_fullgraph_residual_gpu(dtype):
    """A DiT block's norms with the fused residual form (both its outputs used) under
    torch.compile(fullgraph=True): bitwise equal to eager, forward and every gradient."""
    b, t, d = 2, 256, 1152
    inputs = {"x": torch.randn(b, t, d, device="cuda", dtype=dtype),
              "emb": torch.randn(b, 6 * d, device="cuda", dtype=dtype)}

    def block(x, emb):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        n, h = ada_layer_norm(ada_layer_norm(x, scale_msa, shift_msa) * 2, scale_mlp, shift_mlp, residual=x,
                              gate=gate_msa)
        return ada_layer_norm_gate(h, gate_mlp, n * 2)

    assert_compiled_matches_eager(block, inputs, torch.randn(b, t, d, device="cuda", dtype=dtype))
