"""rms_norm / layer_norm, GPU tier: bf16 / fp16 at real sizes (4096 x 4096, 65536-wide rows, odd shapes),
every gradient against the float64 reference, HF modules in bf16, and torch.compile(fullgraph=True)."""

import pytest
import torch

import flashfuse.ops.norm as norm_ops
from flashfuse.nn.norm import LayerNorm, RMSNorm
from flashfuse.ops.norm import layer_norm, rms_norm
from flashfuse.reference.norm import layer_norm_ref, rms_norm_ref
from test_norm import check_op, make, poison, rel_err  # noqa: F401  (poison: autouse NaN-filled buffers)

pytestmark = pytest.mark.gpu

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
# Relative error against float64 for outputs rounded once or twice (llama casting) to the dtype (bf16 unit
# roundoff 2^-9: ~3e-3 measured; fp16 2^-12). Gradients: dx rounded once, dw summed in fp32 then rounded.
TOL = {BF16: 1e-2, F16: 2e-3, F32: 1e-5}

SHAPES = [(4096, 4096), (1000, 65536), (37, 3000), (5, 123), (4099, 5), (16, 1, 8, 128)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_gpu(shape, dtype, residual):
    t = make(shape, dtype, "cuda", residual=residual)
    check_op(rms_norm, rms_norm_ref, t, dict(eps=1e-6), TOL[dtype])
    t = make(shape, dtype, "cuda", residual=residual, weight="fp32")
    check_op(rms_norm, rms_norm_ref, t, dict(eps=1e-6, offset=1.0, casting_mode="gemma"), TOL[dtype])


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_gpu(shape, dtype, residual):
    t = make(shape, dtype, "cuda", bias=True, residual=residual, scale=2.0, shift=4.0)
    check_op(layer_norm, layer_norm_ref, t, dict(eps=1e-5), TOL[dtype])


# The backward knobs benchmarks/tune_norm_rope.py sweeps (flashfuse.ops.norm constants).
BWD_VARIANTS = [
    dict(BWD_STAGES=1, BWD_REG_PREFETCH=True, BWD_WARPS_PER_SM=64),
    dict(BWD_STAGES=2), dict(BWD_STAGES=4), dict(BWD_STAGES=1),
    dict(BWD_WARPS_PER_SM=16), dict(BWD_WARPS_PER_SM=64, BWD_STAGES=4), dict(BWD_ELEMENTS_PER_WARP=256),
]


@pytest.mark.parametrize("variant", BWD_VARIANTS, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items()))
@pytest.mark.parametrize("shape", [(4096, 4096), (4099, 8192), (2048, 2048), (37, 3000), (64, 65536)],
                         ids=lambda s: "x".join(map(str, s)))
def test_backward_variants_gpu(monkeypatch, variant, shape):
    """Every backward schedule the tune script may pick: LayerNorm with a residual and RMSNorm (llama
    casting), bf16, all gradients; fp32 rows at 8192 with a residual cap the pipeline stages to fit
    shared memory."""
    for name, value in variant.items():
        monkeypatch.setattr(norm_ops, name, value)
    t = make(shape, BF16, "cuda", bias=True, residual=True, scale=2.0, shift=4.0)
    check_op(layer_norm, layer_norm_ref, t, dict(eps=1e-5), TOL[BF16])
    t = make(shape, BF16, "cuda")
    check_op(rms_norm, rms_norm_ref, t, dict(eps=1e-6), TOL[BF16])
    if shape[1] == 8192:
        t = make((1031, 8192), F32, "cuda", bias=True, residual=True)
        check_op(layer_norm, layer_norm_ref, t, dict(eps=1e-5), TOL[F32])


def test_qk_norm_strided_gpu():
    """Qwen3-style per-head norm on q / k slices of a packed (B, S, 3H, D) projection, bf16."""
    b, s, h, d = 2, 512, 16, 128
    qkv = torch.randn(b, s, 3 * h, d, device="cuda", dtype=BF16)
    w = (1 + 0.3 * torch.randn(d, device="cuda")).to(BF16)
    for part in (qkv[:, :, :h], qkv[:, :, h:2 * h]):
        check_op(rms_norm, rms_norm_ref, {"x": part, "weight": w}, {}, TOL[BF16])


def test_hf_modules_bf16():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    x = torch.randn(4, 1024, 4096, device="cuda", dtype=BF16)
    for ours, theirs in ((RMSNorm(4096, eps=1e-5), LlamaRMSNorm(4096, eps=1e-5)),
                         (RMSNorm(4096, offset=1.0, casting_mode="gemma"), GemmaRMSNorm(4096)),
                         (LayerNorm(4096), torch.nn.LayerNorm(4096))):
        ours, theirs = ours.to("cuda", BF16), theirs.to("cuda", BF16)
        with torch.no_grad():
            ours.weight.normal_(0.0 if isinstance(theirs, GemmaRMSNorm) else 1.0, 0.3)
        theirs.load_state_dict(ours.state_dict())
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        assert ya.dtype == yb.dtype
        assert rel_err(ya, yb) < TOL[BF16]
        g = torch.randn_like(ya)
        ya.backward(g)
        yb.backward(g)
        assert rel_err(xa.grad, xb.grad) < TOL[BF16]
        assert rel_err(ours.weight.grad, theirs.weight.grad) < TOL[BF16]


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_compile_fullgraph_gpu(dtype):
    """A pre-norm block (fused add + RMSNorm, then LayerNorm) under torch.compile(fullgraph=True) is
    bitwise equal to eager, forward and every gradient: the norms are one opaque op each, and the glue
    (a multiply by 2) is exact."""
    t = make((8, 512, 4096), dtype, "cuda", bias=True, residual=True)

    def block(x, residual, weight, bias):
        y, h = rms_norm(x, weight, residual=residual)
        return layer_norm(y * 2, weight, bias, residual=h)

    compiled = torch.compile(block, fullgraph=True)
    cotangents = [torch.randn(t["x"].shape, device="cuda", dtype=dtype) for _ in range(2)]
    results = []
    for fn in (block, compiled):
        inputs = {k: v.clone().requires_grad_() for k, v in t.items()}
        outs = fn(**inputs)
        torch.autograd.backward(outs, cotangents)
        results.append((outs, {k: v.grad for k, v in inputs.items()}))
    (outs_e, grads_e), (outs_c, grads_c) = results
    for a, b in zip(outs_c, outs_e):
        assert torch.equal(a, b)
    for k in t:
        assert torch.equal(grads_c[k], grads_e[k]), f"d{k} differs under torch.compile"
