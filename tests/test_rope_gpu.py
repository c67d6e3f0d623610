"""Rotary embedding, GPU tier (`pytest -m gpu`): bf16 / fp16 at Llama sizes (16384 tokens, 32 query / 8 kv
heads, head dim 128), Gemma's head dim 256, partial rotary, varlen, decode offsets, in place,
torch.compile(fullgraph=True).

Error: ||out - ref|| / ||ref|| against a float64 reference on the GPU. The kernel computes in fp32 and
rounds once to bf16/fp16, so it must also be at least as accurate as HF's own bf16/fp16 expression
(three roundings).
"""

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_llama_rope
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as hf_phi3_rope

import flashfuse.ops.rope as rope_ops
from flashfuse.nn.rope import RotaryEmbedding
from flashfuse.ops.rope import apply_rotary_emb, apply_rotary_emb_qk, apply_rotary_pos_emb
from flashfuse.reference.rope import apply_rotary_emb_ref, apply_rotary_pos_emb_ref, rotary_tables
from testing import rel_err  # noqa: E402

pytestmark = pytest.mark.gpu

F16, BF16, F64 = torch.float16, torch.bfloat16, torch.float64
# One rounding of each output: bf16 half-ulp is 2^-9 = 2e-3 relative (max), fp16 2^-11 = 5e-4; the norm-wise
# error is below that. Gradients are the same map transposed, same bound.
TOL = {BF16: 4e-3, F16: 1e-3}


def assert_close(name, out, ref, dtype):
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"{name}: relative error {err:.3g} > {TOL[dtype]:.1g}"


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def hf_tables(batch, seqlen, rotary_dim, dtype, position_ids=None, device="cuda"):
    """cos/sin as HF's LlamaRotaryEmbedding.forward returns them: duplicated halves, cast to x's dtype."""
    if position_ids is None:
        position_ids = torch.arange(seqlen, device=device)[None].expand(batch, -1)
    exponents = torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim
    inv_freq = 1.0 / (500000.0 ** exponents)
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("batch,seqlen,nheads_q,nheads_k,headdim,rotary_dim", [
    (4, 4096, 32, 8, 128, 128),      # Llama-3 8B, 16384 tokens
    (1, 3000, 24, 8, 96, 32),        # Phi-3-like partial rotary, odd seqlen
    (2, 1023, 8, 4, 256, 256),       # Gemma head dim 256
])
def test_apply_rotary_pos_emb_llama(dtype, batch, seqlen, nheads_q, nheads_k, headdim, rotary_dim):
    """HF's layout: q, k transposed views of the projections; against HF's function and float64."""
    q_proj = torch.randn(batch, seqlen, nheads_q * headdim, device="cuda", dtype=dtype, requires_grad=True)
    k_proj = torch.randn(batch, seqlen, nheads_k * headdim, device="cuda", dtype=dtype, requires_grad=True)
    q = q_proj.view(batch, seqlen, nheads_q, headdim).transpose(1, 2)
    k = k_proj.view(batch, seqlen, nheads_k, headdim).transpose(1, 2)
    position_ids = torch.arange(seqlen, device="cuda")[None].expand(batch, -1) + 17
    cos, sin = hf_tables(batch, seqlen, rotary_dim, dtype, position_ids)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin)
    hf = hf_llama_rope if rotary_dim == headdim else hf_phi3_rope
    q64, k64 = leaf(q.double()), leaf(k.double())
    q_ref, k_ref = apply_rotary_pos_emb_ref(q64, k64, cos.double(), sin.double())
    with torch.no_grad():
        q_hf, k_hf = hf(q, k, cos, sin)
    for name, out, hf_out, ref in (("q", q_out, q_hf, q_ref), ("k", k_out, k_hf, k_ref)):
        assert out.dtype == hf_out.dtype == dtype
        err, hf_err = rel_err(out, ref), rel_err(hf_out, ref)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3g}"
        assert err <= hf_err * 1.05, f"{name}: error {err:.3g} above HF's own {hf_err:.3g}"
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    dq, dk = torch.autograd.grad((q_out, k_out), (q_proj, k_proj), (gq, gk))
    dq_ref, dk_ref = torch.autograd.grad((q_ref, k_ref), (q64, k64), (gq.double(), gk.double()))
    assert_close("dq", dq.view(batch, seqlen, nheads_q, headdim).transpose(1, 2), dq_ref, dtype)
    assert_close("dk", dk.view(batch, seqlen, nheads_k, headdim).transpose(1, 2), dk_ref, dtype)


# The schedules benchmarks/tune_norm_rope.py sweeps: (TILE_ELEMENTS, WARPS_PER_1K, TILES_PER_PROGRAM, PREFETCH).
SCHEDULES = [(1024, 4, 0, True), (1024, 4, 1, False), (1024, 4, 0, False), (1024, 4, 2, True),
             (2048, 4, 0, True), (4096, 4, 0, True), (4096, 1, 0, True), (1024, 2, 0, True), (1024, 8, 0, True)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(map(str, s)))
@pytest.mark.parametrize("interleaved", [False, True])
def test_schedules_llama_shape(monkeypatch, schedule, interleaved):
    """Every schedule the tune script may pick, bf16 at the bench's shape (q 32 heads, k 8, hd 128, HF's
    duplicated-halves tables, forward and backward) and with partial rotary (pass-through copy), into
    NaN-poisoned outputs so an unwritten element fails."""
    for name, value in zip(("TILE_ELEMENTS", "WARPS_PER_1K", "TILES_PER_PROGRAM", "PREFETCH"), schedule):
        monkeypatch.setattr(rope_ops, name, value)
    q = torch.randn(4, 4096, 32, 128, device="cuda", dtype=BF16)
    k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=BF16)
    for rotary_dim, half_offset in ((128, 64), (64, 0)):
        angles = torch.rand(4096, rotary_dim // 2, device="cuda", dtype=torch.float64) * 6.3
        cos, sin = angles.cos(), angles.sin()
        table_cos = torch.cat([cos, cos], -1) if half_offset else cos
        table_sin = torch.cat([sin, sin], -1) if half_offset else sin
        for conjugate in (False, True):
            q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
            rope_ops.rotary_forward(q, table_cos.to(BF16), table_sin.to(BF16), q_out, y=k, out_y=k_out,
                                    rotary_dim=rotary_dim, interleaved=interleaved, conjugate=conjugate,
                                    cos_half_offset=half_offset)
            c, s = cos.to(BF16).double(), sin.to(BF16).double()
            for name, out, x in (("q", q_out, q), ("k", k_out, k)):
                ref = apply_rotary_emb_ref(x.double(), c, -s if conjugate else s, interleaved)
                assert_close(f"{name} (rotary {rotary_dim}, conjugate {conjugate})", out, ref, BF16)


@pytest.mark.parametrize("dtype,interleaved,headdim,rotary_dim", [
    (BF16, False, 128, 128), (F16, True, 128, 128), (BF16, True, 128, 32), (F16, False, 80, 40)])
def test_apply_rotary_emb_large(dtype, interleaved, headdim, rotary_dim):
    """flash-attn semantics at 16384 tokens, fp32 tables, int offset; then a packed varlen batch."""
    x = torch.randn(4, 4096, 32, headdim, device="cuda", dtype=dtype, requires_grad=True)
    cos, sin = rotary_tables(rotary_dim, 8192, device="cuda")
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=1000)
    x64 = leaf(x.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved, seqlen_offsets=1000)
    assert out.dtype == dtype
    assert_close("out", out, ref, dtype)
    g = torch.randn_like(out)
    assert_close("dx", torch.autograd.grad(out, x, g)[0], torch.autograd.grad(ref, x64, g.double())[0], dtype)

    lengths = [1, 4095, 37, 2048, 3000, 1]
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    xv = torch.randn(sum(lengths), 8, headdim, device="cuda", dtype=dtype, requires_grad=True)
    offsets = torch.tensor([5, 0, 4000, 17, 100, 8000], device="cuda", dtype=torch.int32)
    out = apply_rotary_emb(xv, cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu, max_seqlen=4095)
    xv64 = leaf(xv.double())
    ref = apply_rotary_emb_ref(xv64, cos.double(), sin.double(), interleaved, seqlen_offsets=offsets,
                               cu_seqlens=cu)
    assert_close("varlen out", out, ref, dtype)
    g = torch.randn_like(out)
    assert_close("varlen dx", torch.autograd.grad(out, xv, g)[0], torch.autograd.grad(ref, xv64, g.double())[0],
                 dtype)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_decode_and_inplace(dtype):
    """Decode step: one token per sequence, per-sequence offsets; in place on the kv cache slot."""
    batch = 64
    cos, sin = rotary_tables(128, 32768, device="cuda")
    offsets = torch.randint(0, 32767, (batch,), device="cuda", dtype=torch.int32)
    x = torch.randn(batch, 1, 32, 128, device="cuda", dtype=dtype)
    ref = apply_rotary_emb_ref(x.double(), cos.double(), sin.double(), seqlen_offsets=offsets)
    assert_close("decode", apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets), ref, dtype)
    expected = apply_rotary_emb(x, cos, sin, seqlen_offsets=offsets)
    ptr = x.data_ptr()
    out = apply_rotary_emb(x, cos, sin, inplace=True, seqlen_offsets=offsets)
    assert out.data_ptr() == ptr and torch.equal(out, expected)

    base = torch.randn(2, 2048, 32, 128, device="cuda", dtype=dtype, requires_grad=True)
    y = base * 1                                       # a non-leaf to rotate in place
    apply_rotary_emb(y, cos, sin, inplace=True, interleaved=True)
    b64 = leaf(base.double())
    ref = apply_rotary_emb_ref(b64, cos.double(), sin.double(), True)
    assert_close("inplace out", y, ref, dtype)
    g = torch.randn_like(y)
    assert_close("inplace dx", torch.autograd.grad(y, base, g)[0], torch.autograd.grad(ref, b64, g.double())[0],
                 dtype)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_rotary_embedding_module(dtype):
    rope = RotaryEmbedding(128, base=500000.0, device="cuda")
    q = torch.randn(2, 4096, 32, 128, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(2, 4096, 8, 128, device="cuda", dtype=dtype, requires_grad=True)
    position_ids = torch.randint(0, 100000, (2, 4096), device="cuda")
    cos, sin = rotary_tables(128, 100000, base=500000.0, device="cuda")
    q64, k64 = leaf(q.double()), leaf(k.double())
    for kwargs, ref_kwargs in (({"seqlen_offset": 3}, {"seqlen_offsets": 3}),
                               ({"position_ids": position_ids}, {"position_ids": position_ids})):
        q_out, k_out = rope(q, k, **kwargs)
        q_ref, k_ref = (apply_rotary_emb_ref(t, cos.double(), sin.double(), **ref_kwargs) for t in (q64, k64))
        assert_close("q", q_out, q_ref, dtype)
        assert_close("k", k_out, k_ref, dtype)
        gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
        dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (gq, gk))
        dq_ref, dk_ref = torch.autograd.grad((q_ref, k_ref), (q64, k64), (gq.double(), gk.double()))
        assert_close("dq", dq, dq_ref, dtype)
        assert_close("dk", dk, dk_ref, dtype)


def test_torch_compile_fullgraph():
    """fullgraph=True (a graph break raises) over all entry points, forward and backward: the compiled graph
    calls the same custom ops as eager, so every output and each output's own gradient are bit-identical
    (gradients are taken one output at a time: a sum of several bf16 gradients depends on the order)."""
    torch._dynamo.reset()
    q = torch.randn(2, 2048, 32, 128, device="cuda", dtype=BF16, requires_grad=True)
    k = torch.randn(2, 2048, 8, 128, device="cuda", dtype=BF16, requires_grad=True)
    cos_hf, sin_hf = hf_tables(2, 2048, 128, BF16)
    cos, sin = rotary_tables(128, 4096, device="cuda")
    rope = RotaryEmbedding(128, device="cuda")
    rope(q, k, seqlen_offset=100)                      # fill the table cache outside the graph

    def fn(q, k):
        a, b = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos_hf, sin_hf)
        c = apply_rotary_emb(q, cos, sin, interleaved=True, seqlen_offsets=7)
        d, e = rope(q, k, seqlen_offset=100)
        f, _ = apply_rotary_emb_qk(q, k, cos, sin)
        return a, b, c, d, e, f

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        outs = f(q, k)
        # Each output against the input it depends on (a compiled graph is one autograd node over both
        # inputs, so "unused" gradients come back as zeros there and as None in eager).
        grads = [torch.autograd.grad(o, t, torch.ones_like(o), retain_graph=True)[0]
                 for o, t in zip(outs, (q, k, q, q, k, q))]
        results.append(list(outs) + grads)
    for i, (eager, compiled) in enumerate(zip(*results)):
        assert torch.equal(compiled, eager), f"tensor {i}: compiled differs from eager"
