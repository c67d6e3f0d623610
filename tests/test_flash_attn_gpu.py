"""FlashAttention API, GPU tier (`pytest -m gpu`): fp16/bf16 at real sizes, every head dim in {32, 40, 59,
64, 80, 96, 111, 128, 160, 192, 224, 256}, every (seqlen_q, seqlen_k) of flash-attn's test list, MHA / MQA /
GQA, causal / window / softcap / ALiBi, dropout, varlen, deterministic gradients, torch.compile.

Error criterion: flash-attn's (attention_utils.check_attention) with the reference computed on the GPU in
float32 upcast, as flash-attn's own tests do (float64 at S = 2048 is slow and buys nothing: the fp32
reference error, ~1e-6, is 1000x below the fp16/bf16 rounding being judged). The case table is not a
cartesian product: each head dim appears twice (fp16 and bf16), each shape 3-4 times, each option with
both dtypes, so the tier stays around three minutes on an H100.
"""

from functools import partial

import pytest
import torch

from attention_utils import (assert_finite, assert_zero_rows, check_attention, cu_seqlens,  # noqa: F401
                             dropout_mask_for, exact_fp32_reference, flash_ref, no_key_rows_flash,
                             no_key_rows_varlen, rand, rand_qkv, sdpa_ref, varlen_ref, with_alibi)
from flashfuse import (flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func,
                       scaled_dot_product_attention)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32_reference")]

F16, BF16 = torch.float16, torch.bfloat16
MHA, GQA, MQA = (6, 6), (6, 2), (6, 1)                     # (nheads_q, nheads_k)
REF = torch.float32                                        # reference dtype on the GPU (see the docstring)


# (dtype, headdim, (seqlen_q, seqlen_k), (nheads_q, nheads_k), options)
GPU_CASES = [
    (F16, 32, (113, 203), MHA, {}),
    (BF16, 32, (2048, 2048), MQA, {"causal": True}),
    (F16, 40, (108, 256), GQA, {"window_size": (64, 32)}),
    (BF16, 40, (1024, 1023), MHA, {"softcap": 3.0}),
    (F16, 59, (256, 512), MQA, {"alibi": "h", "causal": True}),
    (BF16, 59, (512, 256), GQA, {"causal": True}),                            # rows with no key
    (F16, 64, (1023, 1024), MHA, {"causal": True, "window_size": (100, -1)}),
    (BF16, 64, (113, 203), GQA, {"alibi": "bh"}),
    (F16, 80, (1024, 1023), GQA, {"causal": True}),
    (BF16, 80, (108, 256), MQA, {"window_size": (-1, 17)}),
    (F16, 96, (512, 256), MHA, {"window_size": (32, 32)}),                   # rows with no key
    (BF16, 96, (2048, 2048), GQA, {"softcap": 5.0, "softmax_scale": 0.2, "causal": True}),
    (F16, 111, (256, 512), GQA, {}),
    (BF16, 111, (1023, 1024), MHA, {"alibi": "h"}),
    (F16, 64, (300, 257), GQA, {"alibi": "bh", "softmax_scale": 0.0}),      # Triton's (Gluon divides by the scale)
    (BF16, 128, (256, 512), GQA, {"alibi": "h", "softmax_scale": -0.1, "causal": True}),     # a negative scale
    (F16, 128, (2048, 2048), MHA, {"causal": True}),
    (BF16, 128, (256, 512), GQA, {"window_size": (256, 64), "alibi": "bh"}),
    (F16, 160, (113, 203), MQA, {"softcap": 2.5, "window_size": (40, 40)}),
    (BF16, 160, (512, 256), MHA, {}),
    (F16, 192, (1024, 1023), MQA, {"window_size": (50, 50)}),
    (BF16, 192, (108, 256), GQA, {"causal": True, "softcap": 4.0}),
    (F16, 224, (1023, 1024), GQA, {"alibi": "bh", "causal": True}),
    (BF16, 224, (113, 203), MHA, {"window_size": (20, -1)}),
    (F16, 256, (512, 256), GQA, {"softcap": 3.0, "alibi": "h"}),
    (BF16, 256, (2048, 2048), MHA, {}),
]


def _case_id(case):
    dtype, headdim, (sq, sk), heads, opts = case
    kind = {MHA: "mha", GQA: "gqa", MQA: "mqa"}[heads]
    names = "-".join(f"{k}{v}".replace(" ", "") for k, v in opts.items()) or "plain"
    return f"{str(dtype)[6:]}-d{headdim}-{sq}x{sk}-{kind}-{names}"


@pytest.mark.parametrize("dtype, headdim, seqlens, heads, opts", GPU_CASES, ids=[_case_id(c) for c in GPU_CASES])
def test_flash_attn_func_gpu(dtype, headdim, seqlens, heads, opts):
    (seqlen_q, seqlen_k), (nheads_q, nheads_k), batch = seqlens, heads, 2
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device="cuda")
    opts = with_alibi(opts, batch, nheads_q)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    assert out.dtype == dtype and out.shape == q.shape
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse,
                                             ref_dtype=REF)
    empty = no_key_rows_flash(ref_lse)
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


def test_gpu_cases_cover_the_grid():
    """The table above covers every head dim (with both dtypes), every shape of the issue (and more), every option."""
    assert {c[1] for c in GPU_CASES} == {32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256}
    assert all({c[0] for c in GPU_CASES if c[1] == d} == {F16, BF16} for d in {c[1] for c in GPU_CASES})
    assert {c[2] for c in GPU_CASES} >= {(113, 203), (108, 256), (256, 512), (512, 256), (1023, 1024),
                                         (1024, 1023), (2048, 2048)}
    assert {c[3] for c in GPU_CASES} == {MHA, GQA, MQA}
    for option in ("causal", "window_size", "softcap", "alibi"):
        assert {c[0] for c in GPU_CASES if option in c[4]} == {F16, BF16}, option
    assert {c[4]["alibi"] for c in GPU_CASES if "alibi" in c[4]} == {"h", "bh"}


# ----------------------------------------------------------------------------------------------------
# Varlen, dropout
# ----------------------------------------------------------------------------------------------------

# (seed, nseq, dtype, headdim, (nheads_q, nheads_k), options, dropout_p)
VARLEN_CASES = [
    (1, 7, F16, 64, GQA, {"causal": True}, 0.0),
    (2, 6, BF16, 128, MHA, {"window_size": (128, 16), "alibi": "bh"}, 0.0),
    (3, 8, F16, 59, MQA, {"softcap": 3.0, "alibi": "h"}, 0.0),
    (4, 5, BF16, 256, GQA, {"causal": True}, 0.2),
]


@pytest.mark.parametrize("seed, nseq, dtype, headdim, heads, opts, dropout_p", VARLEN_CASES,
                         ids=["causal-gqa-fp16-d64", "window-alibi-bf16-d128", "softcap-alibi-mqa-fp16-d59",
                              "dropout-causal-gqa-bf16-d256"])
def test_flash_attn_varlen_func_gpu(seed, nseq, dtype, headdim, heads, opts, dropout_p):
    """Random lengths in [1, 1100) (q and k drawn separately) plus a length-1 query and an empty sequence."""
    g = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(1, 1100, (nseq,), generator=g).tolist() + [1, 0]
    lens_k = torch.randint(1, 1100, (nseq,), generator=g).tolist() + [313, 0]
    (nheads_q, nheads_k), total_q, total_k = heads, sum(lens_q), sum(lens_k)
    q = rand(total_q, nheads_q, headdim, dtype=dtype, device="cuda")
    k = rand(total_k, nheads_k, headdim, dtype=dtype, device="cuda")
    v = rand(total_k, nheads_k, headdim, dtype=dtype, device="cuda")
    cu_q, cu_k = cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda")
    max_q, max_k = max(lens_q), max(lens_k)
    opts = with_alibi(opts, len(lens_q), nheads_q)
    torch.manual_seed(seed)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=dropout_p,
                                         return_attn_probs=True, **opts)
    assert lse.shape == (nheads_q, total_q)
    mask = None
    if dropout_p > 0:
        mask = dropout_mask_for(seed, "cuda", len(lens_q), nheads_q, max_q, max_k, dropout_p)
    ref_fn = partial(varlen_ref, cu_q=cu_q, cu_k=cu_k, dropout_p=dropout_p, dropout_mask=mask, **opts)
    grads, (_, ref_lse, _) = check_attention(ref_fn, {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)
    empty = no_key_rows_varlen(ref_lse)
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


DROPOUT_CASES = [  # (dtype, headdim, (seqlen_q, seqlen_k), heads, dropout_p, options): the Gluon kernels' widths
    (BF16, 128, (1023, 1024), GQA, 0.15, {"causal": True}),
    (F16, 64, (512, 256), MHA, 0.3, {"window_size": (64, 64), "alibi": "h"}),
    (BF16, 64, (2048, 2048), GQA, 0.1, {}),
    (F16, 64, (1024, 1023), MQA, 0.2, {"causal": True}),
    (BF16, 80, (1024, 1024), MHA, 0.1, {"causal": True}),
    (F16, 96, (113, 203), GQA, 0.25, {}),
    (BF16, 128, (2048, 2048), MHA, 0.1, {"softcap": 30.0}),
    (F16, 160, (1024, 1024), GQA, 0.1, {"causal": True}),
    (BF16, 256, (512, 1024), MHA, 0.5, {}),
]


@pytest.mark.parametrize("dtype, headdim, seqlens, heads, dropout_p, opts", DROPOUT_CASES,
                         ids=[f"d{c[1]}-{c[2][0]}x{c[2][1]}-p{c[4]}" for c in DROPOUT_CASES])
def test_flash_attn_dropout_gpu(dtype, headdim, seqlens, heads, dropout_p, opts):
    (seqlen_q, seqlen_k), (nheads_q, nheads_k), batch = seqlens, heads, 2
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device="cuda")
    opts = with_alibi(opts, batch, nheads_q)
    torch.manual_seed(77)
    out = flash_attn_func(q, k, v, dropout_p=dropout_p, **opts)
    mask = dropout_mask_for(77, "cuda", batch, nheads_q, seqlen_q, seqlen_k, dropout_p)
    check_attention(partial(flash_ref, dropout_p=dropout_p, dropout_mask=mask, **opts), {"q": q, "k": k, "v": v},
                    out, ref_dtype=REF)


def test_dropout_kept_fraction_gpu():
    """The kernel's own mask read back (q = 0: probabilities 1 / seqlen_k; v = identity, headdim = seqlen_k):
    equal to dropout_mask(...), keeping 1 - p of 4 * 8 * 2048 * 128 = 8.4M entries (6 sigma = 9e-4)."""
    batch, nheads, seqlen_q, seqlen_k, p = 4, 8, 2048, 128, 0.25
    q = torch.zeros(batch, seqlen_q, nheads, seqlen_k, device="cuda", dtype=F16)
    k = torch.randn(batch, seqlen_k, nheads, seqlen_k, device="cuda", dtype=F16)
    v = torch.eye(seqlen_k, device="cuda", dtype=F16)[None, :, None, :].expand(batch, seqlen_k, nheads, seqlen_k)
    torch.manual_seed(8)
    out = flash_attn_func(q, k, v, dropout_p=p)
    kept = out.float().transpose(1, 2) * ((1 - p) * seqlen_k)                  # 0 or 1 (+- fp16 rounding)
    assert ((kept - kept.round()).abs() < 0.01).all(), "out must be keep / ((1 - p) * seqlen_k)"
    keep = kept.round().bool()
    assert torch.equal(keep, dropout_mask_for(8, "cuda", batch, nheads, seqlen_q, seqlen_k, p))
    fraction, n = keep.float().mean().item(), keep.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(fraction - (1 - p)) < 6 * sigma, f"kept fraction {fraction:.5f}, expected {1 - p} +- {6 * sigma:.5f}"
    per_head = keep.float().mean(dim=(2, 3))                                   # (B, H), 262144 entries each
    head_sigma = (p * (1 - p) / (seqlen_q * seqlen_k)) ** 0.5
    assert ((per_head - (1 - p)).abs() < 6 * head_sigma).all()


@pytest.mark.parametrize("headdim", [64, 128])
def test_dropout_takes_gluon_gpu(monkeypatch, headdim):
    """On Hopper with the Gluon kernels' triton, dropout runs both directions there (session 50; the hd64 forward since
    session 51), every gradient checked against the reference with the same mask."""
    from flashfuse.ops.attention import flash_bwd_hopper, flash_fwd_hopper
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("the Gluon kernels need sm_90 and their triton release")
    calls = []
    for module, name in ((flash_fwd_hopper, "hopper_forward"), (flash_bwd_hopper, "gluon_backward")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    q, k, v = rand_qkv(4, 2048, 2048, 16, 8, headdim, dtype=BF16, device="cuda")
    torch.manual_seed(5)
    out = flash_attn_func(q, k, v, dropout_p=0.2, causal=True)
    mask = dropout_mask_for(5, "cuda", 4, 16, 2048, 2048, 0.2)
    check_attention(partial(flash_ref, dropout_p=0.2, dropout_mask=mask, causal=True), {"q": q, "k": k, "v": v},
                    out, ref_dtype=REF)
    assert "hopper_forward" in calls and "gluon_backward" in calls, calls


def test_flash_attn_deterministic_gpu():
    """Real size, GQA (dk/dv reduced over the group), causal, dropout: two runs bit-identical; deterministic=False
    (the Gluon backward, dQ added by reduce-adds in any order) draws the same mask (out bit-identical) and its
    gradients agree with the deterministic ones to summation order (normwise 1e-2; each path is checked against the
    float reference by test_flash_attn_dropout_gpu)."""
    q, k, v = rand_qkv(2, 2048, 2048, 8, 2, 128, dtype=BF16, device="cuda")
    dout = torch.randn_like(q)

    def run(deterministic):
        torch.manual_seed(4)
        out = flash_attn_func(q, k, v, dropout_p=0.1, causal=True, deterministic=deterministic)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    first, second, nondet = run(True), run(True), run(False)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), first, second, nondet):
        assert_finite(name, a)
        assert torch.equal(a, b), f"{name}: two runs with deterministic=True differ"
        if name == "out":
            assert torch.equal(a, c), "out: deterministic=False differs from deterministic=True"
        else:
            rel = ((a.float() - c.float()).norm() / a.float().norm()).item()
            assert rel < 1e-2, f"{name}: deterministic=False differs from deterministic=True by {rel:.2e}"


def test_strided_qkvpacked_gpu():
    """Views of one packed (B, S, 3, H, D) projection output at real size, through flash_attn_func (views)
    and flash_attn_qkvpacked_func (the packed tensor): same semantics, gradients into the buffer."""
    qkv = rand(2, 1024, 3, 8, 128, dtype=F16, device="cuda")
    out = flash_attn_func(*qkv.unbind(2), causal=True)
    check_attention(lambda qkv: flash_ref(*qkv.unbind(2), causal=True), {"qkv": qkv}, out, ref_dtype=REF)
    packed = flash_attn_qkvpacked_func(qkv, causal=True)
    check_attention(lambda qkv: flash_ref(*qkv.unbind(2), causal=True), {"qkv": qkv}, packed, ref_dtype=REF)


# ----------------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, headdim, seqlens, heads, mask_kind, is_causal", [
    (BF16, 128, (1024, 1024), (8, 8), None, True),
    (F16, 64, (512, 256), (8, 2), "float", False),
    (F16, 80, (1023, 1024), (4, 4), "bool", False),
], ids=["causal-bf16-d128", "float-mask-gqa-fp16-d64", "bool-mask-fp16-d80"])
def test_sdpa_gpu(dtype, headdim, seqlens, heads, mask_kind, is_causal):
    (seqlen_q, seqlen_k), (nheads_q, nheads_k), batch = seqlens, heads, 2
    query = rand(batch, nheads_q, seqlen_q, headdim, dtype=dtype, device="cuda")
    key = rand(batch, nheads_k, seqlen_k, headdim, dtype=dtype, device="cuda")
    value = rand(batch, nheads_k, seqlen_k, headdim, dtype=dtype, device="cuda")
    attn_mask = None
    if mask_kind == "float":                                                   # (B, 1, Sq, Sk), some -inf
        attn_mask = torch.randn(batch, 1, seqlen_q, seqlen_k, device="cuda")
        attn_mask = attn_mask.masked_fill(torch.rand_like(attn_mask) < 0.1, float("-inf")).to(dtype)
    elif mask_kind == "bool":                                                  # (Sq, Sk), row 5 fully masked
        attn_mask = torch.rand(seqlen_q, seqlen_k, device="cuda") < 0.7
        attn_mask[5] = False
    out = scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, is_causal=is_causal,
                                       enable_gqa=nheads_q != nheads_k)
    ref_fn = partial(sdpa_ref, attn_mask=attn_mask, is_causal=is_causal)
    grads, (_, ref_lse, _) = check_attention(ref_fn, {"query": query, "key": key, "value": value}, out,
                                             ref_dtype=REF)
    assert_zero_rows("out", out.detach(), torch.isposinf(ref_lse))


# ----------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): no graph break, same results as eager
# ----------------------------------------------------------------------------------------------------

def _flash_fn(q, k, v):
    out, lse, _ = flash_attn_func(q, k, v, causal=True, window_size=(128, -1), return_attn_probs=True)
    return out, lse


def _varlen_fn(q, k, v, cu_q, cu_k):
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 700, 650, causal=True), None


def _sdpa_fn(q, k, v, mask):
    return scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), None


@pytest.mark.parametrize("api", ["flash_attn_func", "flash_attn_varlen_func", "scaled_dot_product_attention"])
def test_torch_compile_fullgraph(api):
    """The compiled graph (fullgraph=True raises on any graph break) calls the same kernels on the same
    inputs as eager, so out, lse and the gradients are bit-identical to eager."""
    torch._dynamo.reset()
    if api == "flash_attn_func":
        fn = _flash_fn
        q, k, v = rand_qkv(2, 1024, 1023, 8, 2, 128, dtype=BF16, device="cuda")
        extra = ()
    elif api == "flash_attn_varlen_func":
        fn = _varlen_fn
        lens_q, lens_k = [700, 1, 300], [650, 200, 300]
        q = rand(sum(lens_q), 8, 64, dtype=F16, device="cuda")
        k = rand(sum(lens_k), 2, 64, dtype=F16, device="cuda")
        v = rand(sum(lens_k), 2, 64, dtype=F16, device="cuda")
        extra = (cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda"))
    else:
        fn = _sdpa_fn
        q = rand(2, 8, 512, 96, dtype=F16, device="cuda")
        k = rand(2, 4, 384, 96, dtype=F16, device="cuda")
        v = rand(2, 4, 384, 96, dtype=F16, device="cuda")
        extra = (torch.randn(2, 1, 512, 384, device="cuda").to(F16),)
    compiled = torch.compile(fn, fullgraph=True)
    dout = None
    results = []
    for f in (fn, compiled):
        out, lse = f(q, k, v, *extra)
        dout = torch.randn_like(out) if dout is None else dout
        grads = torch.autograd.grad(out, (q, k, v), dout)
        results.append((out, lse) + grads)
    for name, eager, comp in zip(("out", "lse", "dq", "dk", "dv"), *results):
        if eager is None:                          # no lse for varlen / SDPA here
            continue
        if name != "lse":                          # lse may hold +inf (rows with no key); equal() compares it
            assert_finite(name, comp)
        assert comp.shape == eager.shape and comp.dtype == eager.dtype, name
        assert torch.equal(comp, eager), (f"{name}: compiled differs from eager by up to "
                                          f"{(comp.float() - eager.float()).abs().max().item():.3e}")


# ----------------------------------------------------------------------------------------------------
# Backward: the atomic-dQ path (deterministic=False with flash_bwd.ATOMIC_DQ on)
# ----------------------------------------------------------------------------------------------------

from flashfuse.ops.attention import flash_bwd, flash_fwd  # noqa: E402

ATOMIC_GPU_CASES = [
    (BF16, 64, (2048, 2048), MHA, {}),
    (F16, 64, (1023, 1024), GQA, {"causal": True}),
    (BF16, 128, (2048, 2048), GQA, {"causal": True}),
    (F16, 128, (1024, 1023), MHA, {"window_size": (100, 37)}),
    (BF16, 59, (512, 256), GQA, {"causal": True}),                            # rows with no key
    (F16, 96, (113, 203), MQA, {"softcap": 3.0, "alibi": "bh"}),
    (BF16, 192, (256, 512), MHA, {"causal": True}),
    (BF16, 256, (203, 113), GQA, {}),
]


@pytest.mark.parametrize("dtype, headdim, seqlens, heads, opts", ATOMIC_GPU_CASES,
                         ids=[_case_id(c) for c in ATOMIC_GPU_CASES])
def test_atomic_dq_gpu(monkeypatch, dtype, headdim, seqlens, heads, opts):
    """The atomic path's gradients by flash-attn's criterion against the fp32 reference (the Triton grid's: the
    Gluon backward, which deterministic=False would take on Hopper, switched off)."""
    monkeypatch.setattr(flash_bwd, "ATOMIC_DQ", True)
    monkeypatch.setattr(flash_bwd, "GLUON_BACKWARD", False)
    (seqlen_q, seqlen_k), (nheads_q, nheads_k), batch = seqlens, heads, 2
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device="cuda")
    opts = with_alibi(opts, batch, nheads_q)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse,
                                             ref_dtype=REF)
    assert_zero_rows("dq", grads["q"], no_key_rows_flash(ref_lse))


def test_atomic_dq_varlen_dropout_gpu(monkeypatch):
    """Packed sequences with dropout on the atomic path (adds stay inside each sequence's rows)."""
    monkeypatch.setattr(flash_bwd, "ATOMIC_DQ", True)
    lens = [1000, 1, 0, 517, 2048]
    cu = cu_seqlens(lens, "cuda")
    q, k, v = (rand(sum(lens), h, 128, dtype=BF16, device="cuda") for h in (8, 2, 2))
    seed, dropout_p = 11, 0.15
    torch.manual_seed(seed)
    out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), dropout_p=dropout_p, causal=True)
    mask = dropout_mask_for(seed, "cuda", len(lens), 8, max(lens), max(lens), dropout_p)
    check_attention(partial(varlen_ref, cu_q=cu, cu_k=cu, causal=True, dropout_mask=mask, dropout_p=dropout_p),
                    {"q": q, "k": k, "v": v}, out, ref_dtype=REF)


# Tile configs the tune script sweeps (benchmarks/tune_flash_bwd.py), spill-free or nearly so offline.
ATOMIC_GPU_CONFIGS = [
    (64, dict(BLOCK_M1=64, BLOCK_N1=128, num_warps=8, num_stages=3, STAGGER=True)),
    (64, dict(BLOCK_M1=64, BLOCK_N1=64, num_warps=4, num_stages=3, STAGGER=False)),
    (128, dict(BLOCK_M1=32, BLOCK_N1=128, num_warps=8, num_stages=2, STAGGER=True)),
    (128, dict(BLOCK_M1=64, BLOCK_N1=128, num_warps=8, num_stages=3, STAGGER=False)),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim, config", ATOMIC_GPU_CONFIGS, ids=[f"d{d}-{i}" for i, (d, _) in
                                                                     enumerate(ATOMIC_GPU_CONFIGS)])
def test_atomic_dq_configs_match_deterministic_gpu(headdim, config, causal):
    """Launcher level, bf16, 4096 tokens, GQA: each swept atomic config against the deterministic grid
    (both bf16 outputs of fp32 sums: ~3e-3 apart), and deterministic=True twice bit-identical."""
    q = torch.randn(2, 2048, 8, headdim, device="cuda", dtype=BF16)
    k, v = (torch.randn(2, 2048, 2, headdim, device="cuda", dtype=BF16) for _ in range(2))
    dout, scale, right = torch.randn_like(q), headdim ** -0.5, 0 if causal else -1
    out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=right)[:2]

    def grads(**kw):
        return flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale, window_right=right, **kw)

    det, det2 = grads(deterministic=True), grads(deterministic=True, atomic_dq=True)
    atomic = grads(deterministic=False, atomic_dq=True, config=config)
    for name, a, b, c in zip(("dq", "dk", "dv"), det, det2, atomic):
        assert torch.equal(a, b), f"{name}: deterministic=True not bit-identical"
        assert_finite(name, c)
        err = ((c.float() - a.float()).norm() / a.float().norm()).item()
        assert err < 1e-2, f"{name}: atomic {config} rel err {err:.2e} vs deterministic"
