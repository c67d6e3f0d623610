"""Rotary embedding, CPU tier: every option and every gradient against the float64 reference
(flashfuse.reference.rope), HF transformers' own apply_rotary_pos_emb, on small odd shapes (Triton's
interpreter on CPU tensors; test_rope_gpu.py runs bf16/fp16 at Llama sizes).

Shapes: seqlen in {1, 5, 37}; (headdim, rotary_dim) in {(16, 16), (40, 8), (64, 32)} (full and partial
rotary); both layouts (GPT-NeoX halves, GPT-J interleaved). Error: ||out - ref|| / ||ref|| (NaN fails).
"""

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_llama_rope
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb as hf_phi3_rope

import flashfuse.ops.rope as rope_ops
from flashfuse.nn.rope import RotaryEmbedding
from flashfuse.ops.rope import (apply_rotary_emb, apply_rotary_emb_qk, apply_rotary_pos_emb,
                                rotary_backward, rotary_forward)
from flashfuse.reference.rope import (apply_rotary_emb_ref, apply_rotary_pos_emb_ref, rotary_tables)
from testing import rel_err  # noqa: E402

F32, F16, F64 = torch.float32, torch.float16, torch.float64
TOL = {F32: 1e-6, F16: 2e-3}          # fp32: a few roundings of 6e-8; fp16: half-ulp 4.9e-4 per element
SHAPES = [(16, 16), (40, 8), (64, 32)]  # (headdim, rotary_dim)
# Every (seqlen, shape) once, the layout alternating, so each layout meets every seqlen and every shape
# (cheaper than the full product: the interpreter runs one program per token).
CASES = [(seqlen, headdim, rotary_dim, (i + j) % 2 == 1)
         for i, seqlen in enumerate((1, 5, 37)) for j, (headdim, rotary_dim) in enumerate(SHAPES)]


def assert_close(name, out, ref, dtype):
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"{name}: relative error {err:.3g} > {TOL[dtype]:.1g}"


def tables(rotary_dim, seqlen_ro, device, batch=None):
    """Random-phase tables (not only p * inv_freq) so every position reads a distinct row."""
    angles = torch.rand((seqlen_ro, rotary_dim // 2) if batch is None else (batch, seqlen_ro, rotary_dim // 2),
                        device=device) * 6.3
    return angles.cos(), angles.sin()


def check_grads(out, ref, inputs, ref_inputs, dtype, names):
    """Every gradient, with one random upstream gradient shared by kernel and float64 reference."""
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, g)
    ref_grads = torch.autograd.grad(ref, ref_inputs, g.double())
    for name, gr, rg in zip(names, grads, ref_grads):
        assert gr.dtype == dtype, f"{name}: dtype {gr.dtype}"
        assert_close(name, gr, rg, dtype)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# ----------------------------------------------------------------------------------------------------
# apply_rotary_emb (flash-attn semantics)
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seqlen,headdim,rotary_dim,interleaved", CASES)
def test_apply_rotary_emb(device, seqlen, headdim, rotary_dim, interleaved):
    x = torch.randn(2, seqlen, 3, headdim, device=device, requires_grad=True)
    cos, sin = tables(rotary_dim, seqlen + 4, device)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=3)
    x64 = leaf(x.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved, seqlen_offsets=3)
    assert out.dtype == F32
    assert_close("out", out, ref, F32)
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:]), "pass-through features must be copied"
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))


@pytest.mark.parametrize("interleaved", [False, True])
def test_fp16_and_fp32_tables(device, interleaved):
    """fp16 x with fp32 tables (the nn module's) and with fp16 tables; output in x's dtype."""
    x = torch.randn(1, 37, 2, 40, device=device, dtype=F16, requires_grad=True)
    for cos, sin in (tables(40, 37, device), tuple(t.half() for t in tables(40, 37, device))):
        out = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
        x64 = leaf(x.double())
        ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved)
        assert out.dtype == F16
        assert_close("out", out, ref, F16)
        check_grads(out, ref, (x,), (x64,), F16, ("dx",))


def test_strided_input_no_copy(device):
    """x a slice of a packed qkv (batch, seqlen, 3, nheads, headdim): read with its strides."""
    qkv = torch.randn(2, 37, 3, 4, 64, device=device)
    x = qkv[:, :, 1]
    cos, sin = tables(32, 37, device)
    out = apply_rotary_emb(x, cos, sin)
    assert_close("out", out, apply_rotary_emb_ref(x.double(), cos.double(), sin.double()), F32)


@pytest.mark.parametrize("headdim,rotary_dim", [(40, 8), (64, 64)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_seqlen_offsets_tensor(device, headdim, rotary_dim, interleaved):
    x = torch.randn(3, 5, 2, headdim, device=device, requires_grad=True)
    cos, sin = tables(rotary_dim, 20, device)
    offsets = torch.tensor([0, 7, 15], dtype=torch.int32, device=device)
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    x64 = leaf(x.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved, seqlen_offsets=offsets.long())
    assert_close("out", out, ref, F32)
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))


@pytest.mark.parametrize("interleaved", [False, True])
def test_position_ids(device, interleaved):
    x = torch.randn(2, 37, 3, 40, device=device, requires_grad=True)
    cos, sin = tables(8, 50, device)
    position_ids = torch.stack([torch.randperm(50, device=device)[:37] for _ in range(2)])
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, position_ids=position_ids)
    x64 = leaf(x.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved, position_ids=position_ids)
    assert_close("out", out, ref, F32)
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))


def test_position_outside_table_is_nan(device):
    """A position the table does not cover poisons that token (never a silent identity rotation)."""
    x = torch.randn(1, 5, 2, 16, device=device)
    cos, sin = tables(16, 8, device)
    position_ids = torch.tensor([[0, 1, 8, -1, 2]], device=device)
    out = apply_rotary_emb(x, cos, sin, position_ids=position_ids)
    assert torch.isnan(out[0, 2:4]).all()
    ok = [0, 1, 4]
    ref = apply_rotary_emb_ref(x.double(), cos.double(), sin.double(), position_ids=position_ids.clamp(0, 7))
    assert_close("in-table tokens", out[:, ok], ref[:, ok], F32)


@pytest.mark.parametrize("headdim,rotary_dim,interleaved", [(16, 16, True), (40, 8, False), (64, 32, True)])
def test_varlen(device, headdim, rotary_dim, interleaved):
    """Sequences of 1, 5 and 37 tokens packed, with per-sequence offsets; then per-sequence tables."""
    cu = torch.tensor([0, 1, 6, 43], dtype=torch.int32, device=device)
    x = torch.randn(43, 3, headdim, device=device, requires_grad=True)
    x64 = leaf(x.double())
    cos, sin = tables(rotary_dim, 45, device)
    offsets = torch.tensor([4, 0, 8], dtype=torch.int64, device=device)
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=offsets, cu_seqlens=cu, max_seqlen=37)
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved, seqlen_offsets=offsets,
                               cu_seqlens=cu)
    assert_close("out", out, ref, F32)
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))

    cos3, sin3 = tables(rotary_dim, 37, device, batch=3)
    out = apply_rotary_emb(x, cos3, sin3, interleaved, cu_seqlens=cu, max_seqlen=37)
    ref = apply_rotary_emb_ref(x64, cos3.double(), sin3.double(), interleaved, cu_seqlens=cu)
    assert_close("out (per-sequence tables)", out, ref, F32)
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))


def test_varlen_position_ids(device):
    cu = torch.tensor([0, 5, 5, 42], dtype=torch.int32, device=device)      # an empty sequence too
    x = torch.randn(42, 2, 64, device=device, requires_grad=True)
    cos, sin = tables(32, 64, device)
    position_ids = torch.randint(0, 64, (42,), device=device)
    out = apply_rotary_emb(x, cos, sin, cu_seqlens=cu, max_seqlen=37, position_ids=position_ids)
    x64 = leaf(x.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), cu_seqlens=cu, position_ids=position_ids)
    assert_close("out", out, ref, F32)
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))


def test_per_batch_tables(device):
    x = torch.randn(2, 5, 3, 40, device=device, requires_grad=True)
    cos, sin = tables(8, 9, device, batch=2)
    out = apply_rotary_emb(x, cos, sin, seqlen_offsets=4)
    x64 = leaf(x.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), seqlen_offsets=4)
    assert_close("out", out, ref, F32)
    check_grads(out, ref, (x,), (x64,), F32, ("dx",))


@pytest.mark.parametrize("headdim,rotary_dim", [(40, 8), (64, 64)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace(device, headdim, rotary_dim, interleaved):
    """inplace=True: same values as out of place, written into x's storage, gradients still right."""
    base = torch.randn(1, 37, 3, headdim, device=device, requires_grad=True)
    cos, sin = tables(rotary_dim, 37, device)
    expected = apply_rotary_emb(base, cos, sin, interleaved)
    x = base.clone()                                  # not a leaf: in-place is allowed under autograd
    ptr = x.data_ptr()
    out = apply_rotary_emb(x, cos, sin, interleaved, inplace=True)
    assert out is x and x.data_ptr() == ptr, "inplace=True must return x itself"
    assert torch.equal(x, expected), "in-place result differs from out-of-place"
    x64 = leaf(base.double())
    ref = apply_rotary_emb_ref(x64, cos.double(), sin.double(), interleaved)
    check_grads(out, ref, (base,), (x64,), F32, ("dx",))

    plain = base.detach().clone()                     # no autograd: the custom op alone
    apply_rotary_emb(plain, cos, sin, interleaved, inplace=True)
    assert torch.equal(plain, expected.detach())


def test_every_element_written(device):
    """Launcher into NaN-poisoned outputs: rotary and pass-through features all written, both tensors."""
    x = torch.randn(2, 37, 3, 40, device=device)
    y = torch.randn(2, 37, 5, 40, device=device)
    cos, sin = tables(8, 37, device)
    out, out_y = torch.full_like(x, float("nan")), torch.full_like(y, float("nan"))
    rotary_forward(x, cos, sin, out, y=y, out_y=out_y, rotary_dim=8)
    for name, o, t in (("out", out, x), ("out_y", out_y, y)):
        assert_close(name, o, apply_rotary_emb_ref(t.double(), cos.double(), sin.double()), F32)


def test_backward_launcher_writes_every_element(device):
    """rotary_backward into NaN-poisoned gradients: the rotation by -theta, pass-through copied."""
    dy = torch.randn(2, 37, 3, 40, device=device)
    dy_k = torch.randn(2, 37, 1, 40, device=device)
    cos, sin = tables(8, 40, device)
    dx, dx_k = torch.full_like(dy, float("nan")), torch.full_like(dy_k, float("nan"))
    rotary_backward(dy, cos, sin, dx, y=dy_k, out_y=dx_k, rotary_dim=8, interleaved=True, seqlen_offset=3)
    for name, out, g in (("dx", dx, dy), ("dx_k", dx_k, dy_k)):
        ref = apply_rotary_emb_ref(g.double(), cos.double(), -sin.double(), True, seqlen_offsets=3)
        assert_close(name, out, ref, F32)


# (TILE_ELEMENTS, TILES_PER_PROGRAM, PREFETCH): with 8 rotary + 32 pass-through features a tile of 64
# elements holds 1 head, 128 holds 2; tiles of x (5 heads) then of y (3 heads) per token.
SCHEDULES = [
    (64, 0, True),       # one program per token looping over 8 one-head tiles, the next tile prefetched
    (128, 3, True),      # groups of 3 two-head tiles (3 + 2 per token): x and y tiles in one group
    (128, 2, False),     # groups of 2, no prefetch
    (1024, 1, False),    # one program per (token, tile), a tile holding all heads of x or of y
]


@pytest.mark.parametrize("tile,tiles_per_program,prefetch", SCHEDULES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_tile_schedules(device, monkeypatch, tile, tiles_per_program, prefetch, interleaved):
    """The launch knobs the tune script sweeps on the GPU: every schedule writes every element of both
    tensors (NaN-poisoned outputs; x and y with different head counts and head dims, pass-through
    features), in place on a packed varlen batch, and its backward is the rotation by -theta."""
    monkeypatch.setattr(rope_ops, "TILE_ELEMENTS", tile)
    monkeypatch.setattr(rope_ops, "TILES_PER_PROGRAM", tiles_per_program)
    monkeypatch.setattr(rope_ops, "PREFETCH", prefetch)
    x = torch.randn(2, 5, 5, 40, device=device)
    y = torch.randn(2, 5, 3, 24, device=device)
    cos, sin = tables(8, 9, device)
    for conjugate in (False, True):
        out, out_y = torch.full_like(x, float("nan")), torch.full_like(y, float("nan"))
        rotary_forward(x, cos, sin, out, y=y, out_y=out_y, rotary_dim=8, interleaved=interleaved,
                       conjugate=conjugate, seqlen_offset=2)
        s = -sin.double() if conjugate else sin.double()
        for name, o, t in (("out", out, x), ("out_y", out_y, y)):
            assert_close(name, o, apply_rotary_emb_ref(t.double(), cos.double(), s, interleaved,
                                                       seqlen_offsets=2), F32)
    cu = torch.tensor([0, 1, 7], dtype=torch.int32, device=device)
    packed = torch.randn(7, 5, 40, device=device)
    expected = apply_rotary_emb_ref(packed.double(), cos.double(), sin.double(), interleaved, cu_seqlens=cu)
    apply_rotary_emb(packed, cos, sin, interleaved, inplace=True, cu_seqlens=cu, max_seqlen=6)
    assert_close("in place, varlen", packed, expected, F32)


def test_double_backward(device):
    """The backward is the same op with conjugate flipped, so it is differentiable: d(dx . v)/dg = R v."""
    x = torch.randn(2, 5, 3, 40, device=device, requires_grad=True)
    g = torch.randn(2, 5, 3, 40, device=device, requires_grad=True)
    v = torch.randn(2, 5, 3, 40, device=device)
    cos, sin = tables(8, 5, device)
    dx, = torch.autograd.grad(apply_rotary_emb(x, cos, sin), x, g, create_graph=True)
    dg, = torch.autograd.grad(dx, g, v)
    assert_close("d2", dg, apply_rotary_emb_ref(v.double(), cos.double(), sin.double()), F32)


# ----------------------------------------------------------------------------------------------------
# apply_rotary_pos_emb (HF transformers drop-in)
# ----------------------------------------------------------------------------------------------------

def hf_tables(batch, seqlen, rotary_dim, device, dtype=F32, position_ids=None):
    """cos/sin exactly as HF's LlamaRotaryEmbedding.forward builds them (duplicated halves)."""
    if position_ids is None:
        position_ids = torch.arange(seqlen, device=device)[None].expand(batch, -1)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, device=device, dtype=F32) / rotary_dim))
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def hf_views(batch, seqlen, nheads, headdim, device, dtype=F32):
    """q as HF's attention makes it: a (batch, nheads, seqlen, headdim) transposed view of a projection."""
    proj = torch.randn(batch, seqlen, nheads * headdim, device=device, dtype=dtype)
    return leaf(proj).view(batch, seqlen, nheads, headdim).transpose(1, 2)


@pytest.mark.parametrize("seqlen,headdim,rotary_dim", [(1, 16, 16), (5, 40, 8), (37, 64, 32)])
def test_apply_rotary_pos_emb_matches_hf(device, seqlen, headdim, rotary_dim):
    """GQA q (4 heads) and k (2 heads), transposed views; full rotary against Llama's function, partial
    against Phi-3's (the split HF's partial-rotary models use)."""
    q, k = hf_views(2, seqlen, 4, headdim, device), hf_views(2, seqlen, 2, headdim, device)
    q_leaf, k_leaf = q._base, k._base
    position_ids = torch.stack([torch.arange(seqlen, device=device), torch.arange(seqlen, device=device) + 9])
    cos, sin = hf_tables(2, seqlen, rotary_dim, device, position_ids=position_ids)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin)
    hf = hf_llama_rope if rotary_dim == headdim else hf_phi3_rope
    q_hf, k_hf = hf(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    assert q_out.dtype == q_hf.dtype and k_out.dtype == k_hf.dtype
    assert_close("q_embed vs HF", q_out, q_hf, F32)
    assert_close("k_embed vs HF", k_out, k_hf, F32)
    q64, k64 = leaf(q.double()), leaf(k.double())
    q_ref, k_ref = apply_rotary_pos_emb_ref(q64, k64, cos.double(), sin.double())
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    dq, dk = torch.autograd.grad((q_out, k_out), (q_leaf, k_leaf), (gq, gk))
    dq_ref, dk_ref = torch.autograd.grad((q_ref, k_ref), (q64, k64), (gq.double(), gk.double()))
    assert_close("dq", dq.view(2, seqlen, 4, headdim).transpose(1, 2), dq_ref, F32)
    assert_close("dk", dk.view(2, seqlen, 2, headdim).transpose(1, 2), dk_ref, F32)


def test_apply_rotary_pos_emb_unsqueeze_dim_2(device):
    """q, k as (batch, seqlen, nheads, headdim), cos shared over the batch (HF's (1, seqlen, dim))."""
    q = torch.randn(2, 37, 4, 64, device=device, requires_grad=True)
    k = torch.randn(2, 37, 1, 64, device=device, requires_grad=True)
    cos, sin = hf_tables(1, 37, 64, device)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    q_hf, k_hf = hf_llama_rope(q, k, cos, sin, unsqueeze_dim=2)
    assert_close("q", q_out, q_hf, F32)
    assert_close("k", k_out, k_hf, F32)
    q64, k64 = leaf(q.double()), leaf(k.double())
    q_ref, k_ref = apply_rotary_pos_emb_ref(q64, k64, cos.double(), sin.double(), unsqueeze_dim=2)
    check_grads(torch.cat([q_out, k_out], 2), torch.cat([q_ref, k_ref], 2), (q, k), (q64, k64), F32,
                ("dq", "dk"))


def test_apply_rotary_pos_emb_dtype_promotion(device):
    """fp16 q/k with fp32 cos/sin: HF's expression promotes to fp32, and so do we; grads stay fp16."""
    q = torch.randn(2, 4, 5, 40, device=device, dtype=F16, requires_grad=True)
    k = torch.randn(2, 2, 5, 40, device=device, dtype=F16, requires_grad=True)
    cos, sin = hf_tables(2, 5, 8, device)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin)
    q_hf, k_hf = hf_phi3_rope(q, k, cos, sin)
    assert q_out.dtype == q_hf.dtype == F32 and k_out.dtype == k_hf.dtype == F32
    assert_close("q", q_out, q_hf, F32)
    assert_close("k", k_out, k_hf, F32)
    q64, k64 = leaf(q.double()), leaf(k.double())
    q_ref, k_ref = apply_rotary_pos_emb_ref(q64, k64, cos.double(), sin.double())
    check_grads(torch.cat([q_out, k_out], 1), torch.cat([q_ref, k_ref], 1), (q, k), (q64, k64), F16,
                ("dq", "dk"))

    q_out, _ = apply_rotary_pos_emb(q, k, cos.half(), sin.half())
    assert q_out.dtype == F16


def test_apply_rotary_pos_emb_position_table(device):
    """transformers < 4.38 style: a (max_positions, dim) table indexed by position_ids (batch, seqlen)."""
    q, k = torch.randn(2, 4, 5, 64, device=device), torch.randn(2, 2, 5, 64, device=device)
    cos, sin = hf_tables(1, 20, 64, device)
    cos, sin = cos[0], sin[0]
    position_ids = torch.tensor([[3, 4, 5, 6, 7], [0, 1, 2, 19, 11]], device=device)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, position_ids)
    q_hf, k_hf = hf_llama_rope(q, k, cos[position_ids], sin[position_ids])
    assert_close("q", q_out, q_hf, F32)
    assert_close("k", k_out, k_hf, F32)


def test_apply_rotary_pos_emb_unequal_halves(device):
    """An exact drop-in reads both halves of cos/sin, so tables whose halves differ still match HF."""
    q, k = torch.randn(1, 3, 5, 16, device=device), torch.randn(1, 1, 5, 16, device=device)
    cos, sin = torch.randn(1, 5, 16, device=device), torch.randn(1, 5, 16, device=device)
    for out, hf in zip(apply_rotary_pos_emb(q, k, cos, sin), hf_llama_rope(q, k, cos, sin)):
        assert_close("out", out, hf, F32)


# ----------------------------------------------------------------------------------------------------
# nn.RotaryEmbedding and apply_rotary_emb_qk
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim,headdim,interleaved", [(64, 64, False), (8, 40, True), (32, 64, False)])
def test_rotary_embedding_module(device, dim, headdim, interleaved):
    rope = RotaryEmbedding(dim, base=500.0, interleaved=interleaved, device=device)
    q = torch.randn(2, 5, 4, headdim, device=device, requires_grad=True)
    k = torch.randn(2, 5, 2, headdim, device=device, requires_grad=True)
    cos, sin = rotary_tables(dim, 64, base=500.0, device=device)
    q64, k64 = leaf(q.double()), leaf(k.double())
    offsets = torch.tensor([3, 30], device=device)
    position_ids = torch.tensor([[9, 2, 7, 0, 1]], device=device)     # (1, seqlen): shared by the batch
    for kwargs, ref_kwargs in (({}, {}), ({"seqlen_offset": 7}, {"seqlen_offsets": 7}),
                               ({"seqlen_offset": offsets}, {"seqlen_offsets": offsets}),
                               ({"position_ids": position_ids}, {"position_ids": position_ids.expand(2, -1)})):
        q_out, k_out = rope(q, k, **kwargs)
        q_ref, k_ref = (apply_rotary_emb_ref(t, cos.double(), sin.double(), interleaved, **ref_kwargs)
                        for t in (q64, k64))
        assert_close(f"q {kwargs}", q_out, q_ref, F32)
        assert_close(f"k {kwargs}", k_out, k_ref, F32)
        check_grads(torch.cat([q_out, k_out], 2), torch.cat([q_ref, k_ref], 2), (q, k), (q64, k64), F32,
                    ("dq", "dk"))


def test_rotary_embedding_cache_grows(device):
    rope = RotaryEmbedding(16, device=device)
    q, k = torch.randn(1, 5, 2, 16, device=device), torch.randn(1, 5, 1, 16, device=device)
    rope(q, k)
    assert rope._cos_cached.shape == (8, 8) and rope._cos_cached.dtype == F32
    cached = rope._cos_cached
    rope(q, k, seqlen_offset=3)
    assert rope._cos_cached is cached, "a table that is long enough is reused"
    q_out, _ = rope(q, k, seqlen_offset=40)
    assert rope._cos_cached.shape == (64, 8)
    cos, sin = rotary_tables(16, 64, device=device)
    assert_close("q after growth", q_out, apply_rotary_emb_ref(q.double(), cos.double(), sin.double(),
                                                               seqlen_offsets=40), F32)


def test_apply_rotary_emb_qk_fp16(device):
    q = torch.randn(2, 37, 4, 40, device=device, dtype=F16, requires_grad=True)
    k = torch.randn(2, 37, 1, 40, device=device, dtype=F16, requires_grad=True)
    cos, sin = tables(40, 40, device)
    q_out, k_out = apply_rotary_emb_qk(q, k, cos, sin, interleaved=True, seqlen_offsets=2)
    q64, k64 = leaf(q.double()), leaf(k.double())
    q_ref, k_ref = (apply_rotary_emb_ref(t, cos.double(), sin.double(), True, seqlen_offsets=2)
                    for t in (q64, k64))
    assert q_out.dtype == k_out.dtype == F16
    check_grads(torch.cat([q_out, k_out], 2), torch.cat([q_ref, k_ref], 2), (q, k), (q64, k64), F16,
                ("dq", "dk"))
    assert_close("q", q_out, q_ref, F16)
    assert_close("k", k_out, k_ref, F16)


# ----------------------------------------------------------------------------------------------------
# torch.compile (fake impls + autograd registration; GPU tier repeats it at real size)
# ----------------------------------------------------------------------------------------------------

def test_torch_compile_fullgraph_small(device):
    torch._dynamo.reset()
    q = torch.randn(2, 5, 4, 40, device=device, requires_grad=True)
    k = torch.randn(2, 5, 2, 40, device=device, requires_grad=True)
    cos, sin = tables(8, 9, device)
    cos_hf, sin_hf = hf_tables(2, 5, 40, device)

    def fn(q, k):
        a = apply_rotary_emb(q, cos, sin, interleaved=True, seqlen_offsets=2)
        b, c = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos_hf, sin_hf)
        return a, b, c

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        outs = f(q, k)
        # One output at a time, against the input it depends on (a sum of several gradients depends on
        # the order of the additions, which the compiled backward may change).
        grads = [torch.autograd.grad(o, t, torch.ones_like(o), retain_graph=True)[0]
                 for o, t in zip(outs, (q, q, k))]
        results.append(list(outs) + grads)
    for name, eager, compiled in zip(("a", "b", "c", "da/dq", "db/dq", "dc/dk"), *results):
        assert torch.equal(compiled, eager), f"{name}: compiled differs from eager"


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------

def test_errors(device):
    x = torch.randn(2, 5, 3, 16, device=device)
    cos, sin = tables(16, 8, device)
    with pytest.raises(ValueError, match=r"rotary_dim is 32 .* x has headdim 16"):
        apply_rotary_emb(x, *tables(32, 8, device))
    with pytest.raises(ValueError, match=r"cos has shape \(8, 8\) but sin has \(8, 4\)"):
        apply_rotary_emb(x, cos, sin[:, :4])
    with pytest.raises(ValueError, match=r"seqlen_offsets is 4 .* 8 positions"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=4)
    with pytest.raises(ValueError, match=r"seqlen_offsets has shape \(3,\); expected \(2,\)"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=torch.zeros(3, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="position_ids and seqlen_offsets were both given"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=1, position_ids=torch.zeros(2, 5, dtype=torch.long,
                                                                                 device=device))
    with pytest.raises(TypeError, match="position_ids has dtype torch.float32"):
        apply_rotary_emb(x, cos, sin, position_ids=torch.zeros(2, 5, device=device))
    with pytest.raises(ValueError, match=r"x must have 4 dimensions"):
        apply_rotary_emb(x[0], cos, sin)
    with pytest.raises(NotImplementedError, match="cos requires grad"):
        apply_rotary_emb(x, cos.clone().requires_grad_(True), sin)
    with pytest.raises(ValueError, match="inplace=True needs x with a contiguous last dim"):
        apply_rotary_emb(x.transpose(-1, -2).contiguous().transpose(-1, -2), cos, sin, inplace=True)
    with pytest.raises(ValueError, match=r"per-sequence table needs 2 rows"):
        apply_rotary_emb(x, *tables(16, 8, device, batch=3))

    xv = torch.randn(10, 3, 16, device=device)
    cu = torch.tensor([0, 4, 10], device=device)
    with pytest.raises(TypeError, match="cu_seqlens has dtype torch.int64; supported: int32"):
        apply_rotary_emb(xv, cos, sin, cu_seqlens=cu, max_seqlen=6)
    with pytest.raises(ValueError, match="max_seqlen is None"):
        apply_rotary_emb(xv, cos, sin, cu_seqlens=cu.int())
    with pytest.raises(ValueError, match="max_seqlen is 5 but a sequence in cu_seqlens has 6 tokens"):
        apply_rotary_emb(xv, cos, sin, cu_seqlens=cu.int(), max_seqlen=5)
    with pytest.raises(ValueError, match="cu_seqlens ends at 12 but x has only 10 rows"):
        apply_rotary_emb(xv, cos, sin, cu_seqlens=torch.tensor([0, 6, 12], dtype=torch.int32, device=device),
                         max_seqlen=6)


def test_errors_hf(device):
    q, k = torch.randn(2, 4, 5, 40, device=device), torch.randn(2, 2, 5, 40, device=device)
    cos, sin = hf_tables(2, 5, 40, device)
    with pytest.raises(ValueError, match=r"rotary_dim is 7 \(cos.shape\[-1\]\); supported: an even number"):
        apply_rotary_pos_emb(q, k, cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match=r"rotary_dim is 64 .* q has headdim 40"):
        apply_rotary_pos_emb(q, k, *hf_tables(2, 5, 64, device))
    with pytest.raises(ValueError, match=r"cos has shape \(2, 5, 40\) but sin has \(2, 5, 8\)"):
        apply_rotary_pos_emb(q, k, cos, sin[..., :8])
    with pytest.raises(ValueError, match=r"cos has shape \(2, 5, 40\); expected \(2 or 1, 4, rotary_dim\)"):
        apply_rotary_pos_emb(q, torch.randn(2, 4, 1, 40, device=device), cos, sin, unsqueeze_dim=2)
    with pytest.raises(ValueError, match="unsqueeze_dim is 3"):
        apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)
    with pytest.raises(ValueError, match="k has .* they must agree in batch and seqlen"):
        apply_rotary_pos_emb(q, k[:, :, :4], cos, sin)
    with pytest.raises(TypeError, match="k has dtype torch.float16 but q has torch.float32"):
        apply_rotary_pos_emb(q, k.half(), cos, sin)
    with pytest.raises(ValueError, match="pass position_ids"):
        apply_rotary_pos_emb(q, k, cos[0], sin[0])
    with pytest.raises(ValueError, match=r"dim is 7; supported: an even rotary dim"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match=r"rotary_dim is 64 .* q has headdim 40"):
        RotaryEmbedding(64, device=device)(q, torch.randn(2, 4, 1, 40, device=device))
    with pytest.raises(ValueError, match="position_ids and seqlen_offset were both given"):
        RotaryEmbedding(8, device=device)(q, q, seqlen_offset=2, position_ids=torch.zeros(2, 4, dtype=torch.long))
