"""flash_attn_with_kvcache, CPU tier: every option against the float64 reference (flashfuse.reference.kvcache),
the appended cache contents (exact, and nothing else touched), paged == contiguous, every num_splits giving
the same answer, and the error cases (nothing written when an error is raised). Tiny shapes: the kernels
run in Triton's interpreter.

Cache positions that no query may see (past cache_seqlens + seqlen_new, before cache_leftpad, unused
pages) hold NaN, so a kernel that reads them fails every check.
"""

import pytest
import torch
from testing import rel_err

from flashfuse.ops.attention.kvcache import flash_attn_with_kvcache
from flashfuse.reference.kvcache import flash_attn_with_kvcache_ref
from flashfuse.reference.rope import rotary_tables

F32, F16 = torch.float32, torch.float16
TOL = {F32: 2e-5, F16: 2e-3}          # relative error vs float64 (fp16: ~ its rounding of the output)
SPLIT_TOL = 1e-6                       # num_splits only reorders fp32 sums


def make_inputs(device, *, batch=2, seqlen_q=1, nheads_q=4, nheads_k=2, head_dim=32, capacity=64,
                seqlens=(5, 40), seqlen_new=None, dtype=F32, leftpad=None):
    """q, contiguous caches (NaN past each sequence's last visible position and before its leftpad),
    k, v (seqlen_new tokens, default seqlen_q; 0: no append) and cache_seqlens (int32)."""
    seqlen_new = seqlen_q if seqlen_new is None else seqlen_new
    q = torch.randn(batch, seqlen_q, nheads_q, head_dim, device=device, dtype=dtype)
    k_cache = torch.randn(batch, capacity, nheads_k, head_dim, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    pos = torch.arange(capacity, device=device)
    lens = torch.tensor(seqlens, device=device, dtype=torch.int32)
    invisible = pos[None, :] >= (lens + seqlen_new)[:, None]
    if leftpad is not None:
        invisible |= pos[None, :] < torch.tensor(leftpad, device=device)[:, None]
    k_cache[invisible] = float("nan")
    v_cache[invisible] = float("nan")
    k = v = None
    if seqlen_new:
        k = torch.randn(batch, seqlen_new, nheads_k, head_dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
    return q, k_cache, v_cache, k, v, lens


def to_paged(k_cache, v_cache, page_size, extra_pages=3):
    """A contiguous (batch, capacity, H, D) cache as pages in shuffled order (plus unused NaN pages):
    (k_pages, v_pages, block_table int32)."""
    batch, capacity, nheads, head_dim = k_cache.shape
    per_seq = capacity // page_size
    num_blocks = batch * per_seq + extra_pages
    perm = torch.randperm(num_blocks, device=k_cache.device)[:batch * per_seq]
    block_table = perm.view(batch, per_seq).to(torch.int32)
    pages = []
    for cache in (k_cache, v_cache):
        paged = torch.full((num_blocks, page_size, nheads, head_dim), float("nan"), dtype=cache.dtype,
                           device=cache.device)
        paged[perm] = cache.reshape(batch * per_seq, page_size, nheads, head_dim)
        pages.append(paged)
    return pages[0], pages[1], block_table


def run_both(q, k_cache, v_cache, k, v, **kw):
    """The kernel and the reference on copies of the caches -> (out, lse, caches), (ref_out, ref_lse, caches)."""
    kc, vc = k_cache.clone(), v_cache.clone()
    out, lse = flash_attn_with_kvcache(q, kc, vc, k, v, return_softmax_lse=True, **kw)
    kr, vr = k_cache.clone(), v_cache.clone()
    kw.pop("num_splits", None)
    ref_out, ref_lse = flash_attn_with_kvcache_ref(q, kr, vr, k, v, **kw)
    return (out, lse, kc, vc), (ref_out, ref_lse, kr, vr)


def check(got, ref, dtype, exact_cache=True):
    out, lse, kc, vc = got
    ref_out, ref_lse, kr, vr = ref
    assert out.shape == ref_out.shape and out.dtype == ref_out.dtype
    assert rel_err(out, ref_out) <= TOL[dtype], f"out: rel err {rel_err(out, ref_out):.2e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)) and torch.equal(lse[~finite], ref_lse[~finite])
    assert rel_err(lse[finite], ref_lse[finite]) <= TOL[dtype], "lse"
    for name, a, b in (("k_cache", kc, kr), ("v_cache", vc, vr)):
        if exact_cache:
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), f"{name} differs from the reference"
        else:   # rotated keys: the kernel rounds fp32 math, the reference fp64 math, to the cache dtype
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, equal_nan=True, msg=name)


# ----------------------------------------------------------------------------------------------------
# Against the reference
# ----------------------------------------------------------------------------------------------------

CASES = [
    # cache length 1: an empty cache plus one new token; MQA
    dict(shape=dict(seqlens=(0, 0), capacity=1, nheads_k=1), opts=dict()),
    dict(shape=dict(seqlens=(36, 2), capacity=37, head_dim=64), opts=dict(causal=True)),
    dict(shape=dict(seqlens=(296, 130), capacity=300, seqlen_q=4), opts=dict(causal=True)),
    dict(shape=dict(seqlens=(300, 77), capacity=300, seqlen_q=4, seqlen_new=0), opts=dict(window_size=(40, 0))),
    dict(shape=dict(seqlens=(33, 90), capacity=96, seqlen_q=4, head_dim=40), opts=dict(softcap=2.5)),
    dict(shape=dict(seqlens=(60, 3), capacity=64, seqlen_q=4, nheads_q=6, nheads_k=3),
         opts=dict(alibi="h", causal=True, window_size=(9, -1))),
    dict(shape=dict(seqlens=(50, 20), capacity=64, seqlen_q=4), opts=dict(alibi="bh", window_size=(7, 2))),
    dict(shape=dict(seqlens=(45, 17), capacity=64, seqlen_q=4, seqlen_new=2, dtype=F16),
         opts=dict(causal=True, softmax_scale=0.3)),
]


def _opts(opts, batch, nheads_q, device):
    opts = dict(opts)
    alibi = opts.pop("alibi", None)
    if alibi is not None:
        shape = (nheads_q,) if alibi == "h" else (batch, nheads_q)
        opts["alibi_slopes"] = torch.rand(*shape, device=device) * 0.5 + 0.05
    return opts


def _case_id(case):
    return "-".join(f"{k}={v}" for k, v in {**case["shape"], **case["opts"]}.items())


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_matches_reference(device, case):
    q, kc, vc, k, v, lens = make_inputs(device, **case["shape"])
    opts = _opts(case["opts"], q.shape[0], q.shape[2], device)
    got, ref = run_both(q, kc, vc, k, v, cache_seqlens=lens, **opts)
    check(got, ref, q.dtype)


@pytest.mark.parametrize("case", [CASES[2], CASES[5]], ids=["causal-sq4", "gqa-alibi-window"])
def test_num_splits_agree(device, case):
    """num_splits only changes how the keys are chunked: 1, 2, 3 and automatic agree to fp32 rounding."""
    q, kc, vc, k, v, lens = make_inputs(device, **case["shape"])
    opts = _opts(case["opts"], q.shape[0], q.shape[2], device)
    results = []
    for num_splits in (1, 2, 3, 0):
        got, ref = run_both(q, kc, vc, k, v, cache_seqlens=lens, num_splits=num_splits, **opts)
        check(got, ref, q.dtype)
        results.append(got)
    for got in results[1:]:
        assert rel_err(got[0], results[0][0]) <= SPLIT_TOL
        assert rel_err(got[1], results[0][1]) <= SPLIT_TOL
        assert torch.equal(got[2].nan_to_num(7.0), results[0][2].nan_to_num(7.0))


@pytest.mark.parametrize("page_size,num_splits", [(16, 1), (32, 3), (64, 2), (1, 2)])
def test_paged_equals_contiguous(device, page_size, num_splits):
    """Shuffled pages give the contiguous cache's answer (bit for bit: same order of operations), and the
    append lands in the right pages."""
    q, kc, vc, k, v, lens = make_inputs(device, seqlens=(100, 17), capacity=128, seqlen_q=4)
    k_pages, v_pages, block_table = to_paged(kc, vc, page_size)
    opts = dict(causal=True, num_splits=num_splits)
    got, ref = run_both(q, kc, vc, k, v, cache_seqlens=lens, **opts)
    check(got, ref, q.dtype)
    paged, paged_ref = run_both(q, k_pages, v_pages, k, v, cache_seqlens=lens, block_table=block_table, **opts)
    check(paged, paged_ref, q.dtype)
    assert torch.equal(paged[0], got[0]) and torch.equal(paged[1], got[1])
    per_seq = block_table.shape[1]
    for cache, contiguous in ((paged[2], got[2]), (paged[3], got[3])):
        gathered = cache[block_table.long()].reshape(contiguous.shape)
        assert torch.equal(gathered.nan_to_num(7.0), contiguous.nan_to_num(7.0))
        unused = torch.ones(cache.shape[0], dtype=torch.bool, device=device)
        unused[block_table.long().flatten()] = False
        assert unused.sum() == cache.shape[0] - q.shape[0] * per_seq and cache[unused].isnan().all()


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_rotary(device, interleaved, causal):
    """q and the new keys rotated (q per token when causal, else all at cache_seqlens); rotary_dim < headdim."""
    q, kc, vc, k, v, lens = make_inputs(device, seqlens=(30, 7), capacity=40, seqlen_q=3, head_dim=32)
    cos, sin = rotary_tables(16, 48, device=device)
    got, ref = run_both(q, kc, vc, k, v, cache_seqlens=lens, rotary_cos=cos, rotary_sin=sin,
                        rotary_interleaved=interleaved, causal=causal)
    check(got, ref, q.dtype, exact_cache=False)
    # Untouched outside the appended rows, and the appended rows really are rotated.
    kc_out = got[2]
    for b, start in enumerate(lens.tolist()):
        rows = torch.zeros(kc.shape[1], dtype=torch.bool, device=device)
        rows[start:start + k.shape[1]] = True
        assert torch.equal(kc_out[b, ~rows].nan_to_num(7.0), kc[b, ~rows].nan_to_num(7.0))
        assert not torch.allclose(kc_out[b, rows], k[b])
        assert torch.equal(got[3][b, rows], v[b])


def test_cache_batch_idx(device):
    q, kc, vc, k, v, _ = make_inputs(device, batch=3, seqlens=(0, 0, 0), capacity=48, seqlen_q=2)
    kc, vc = (torch.randn(5, 48, *kc.shape[2:], device=device) for _ in range(2))   # 5 entries, 3 used
    lens = torch.tensor([10, 46, 0], device=device, dtype=torch.int32)
    idx = torch.tensor([4, 0, 2], device=device, dtype=torch.int32)
    got, ref = run_both(q, kc, vc, k, v, cache_seqlens=lens, cache_batch_idx=idx, causal=True, num_splits=2)
    check(got, ref, q.dtype)
    for entry in (1, 3):                                       # entries no sequence uses: untouched
        assert torch.equal(got[2][entry], kc[entry]) and torch.equal(got[3][entry], vc[entry])


@pytest.mark.parametrize("paged", [False, True])
def test_cache_leftpad(device, paged):
    """Keys before cache_leftpad are not part of the sequence: causal, window and ALiBi count from it."""
    leftpad = (12, 0)
    q, kc, vc, k, v, lens = make_inputs(device, seqlens=(50, 20), capacity=64, seqlen_q=2, leftpad=leftpad)
    pad = torch.tensor(leftpad, device=device, dtype=torch.int32)
    opts = dict(cache_seqlens=lens, cache_leftpad=pad, causal=True, window_size=(30, -1),
                alibi_slopes=torch.rand(q.shape[2], device=device) * 0.3, num_splits=2)
    if paged:
        kc, vc, opts["block_table"] = to_paged(kc, vc, 16)
    got, ref = run_both(q, kc, vc, k, v, **opts)
    check(got, ref, q.dtype)


def test_int_and_none_cache_seqlens(device):
    """cache_seqlens as a Python int; None means every cache is full (no append then)."""
    q, kc, vc, k, v, lens = make_inputs(device, seqlens=(20, 20), capacity=24, seqlen_q=4)
    got, ref = run_both(q, kc, vc, k, v, cache_seqlens=20, causal=True)
    check(got, ref, q.dtype)
    full_k, full_v = torch.randn_like(kc), torch.randn_like(vc)
    got, ref = run_both(q, full_k, full_v, None, None, cache_seqlens=None, softcap=1.5)
    check(got, ref, q.dtype)


def test_return_softmax_lse_and_empty_rows(device):
    """Default return is out only; a query row that sees no key (window_size (0, 0) left of all keys is
    impossible, so use an empty sequence without an append) gives out 0 and lse +inf."""
    q, kc, vc, _, _, _ = make_inputs(device, seqlens=(9, 0), capacity=16, seqlen_new=0)
    lens = torch.tensor([9, 0], device=device, dtype=torch.int32)
    out = flash_attn_with_kvcache(q, kc.clone(), vc.clone(), cache_seqlens=lens)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    for num_splits in (1, 3):
        out2, lse = flash_attn_with_kvcache(q, kc.clone(), vc.clone(), cache_seqlens=lens, num_splits=num_splits,
                                            return_softmax_lse=True)
        assert lse.shape == (2, q.shape[2], 1) and lse.dtype == torch.float32
        assert torch.equal(out2[1], torch.zeros_like(out2[1])) and torch.isposinf(lse[1]).all()
        assert torch.isfinite(lse[0]).all() and rel_err(out2, out) <= SPLIT_TOL


def test_torch_compile_fullgraph(device):
    """Under torch.compile(fullgraph=True) the call is two ops (append mutates the caches, then attention):
    same output and same cache as eager."""
    q, kc, vc, k, v, lens = make_inputs(device, seqlens=(20, 5), capacity=32, seqlen_q=1)

    def fn(q, kc, vc, k, v, lens):
        return flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True, num_splits=2)

    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    eager = fn(q, kc1, vc1, k, v, lens)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kc2, vc2, k, v, lens)
    assert torch.equal(compiled, eager)
    assert torch.equal(kc2.nan_to_num(7.0), kc1.nan_to_num(7.0)) and torch.equal(vc2.nan_to_num(7.0),
                                                                                  vc1.nan_to_num(7.0))


# ----------------------------------------------------------------------------------------------------
# Errors: raised before anything is written
# ----------------------------------------------------------------------------------------------------

def _bad(device, change):
    """Valid arguments with `change` applied -> (kwargs, caches to watch)."""
    q, kc, vc, k, v, lens = make_inputs(device, seqlens=(10, 20), capacity=32, seqlen_q=2)
    kw = dict(q=q, k_cache=kc, v_cache=vc, k=k, v=v, cache_seqlens=lens)
    change(kw)
    return kw


def _paged(kw, page_size=16):
    kw["k_cache"], kw["v_cache"], kw["block_table"] = to_paged(kw["k_cache"], kw["v_cache"], page_size)


def _bad_block_table(kw):
    _paged(kw)
    kw["block_table"][1, 1] = kw["k_cache"].shape[0]      # sequence 1 needs page 1 (positions 16..21)


def _non_pow2_pages(kw):
    kw["k_cache"], kw["v_cache"] = (t.reshape(-1, 24, *t.shape[2:])[:3].contiguous()
                                    for t in (kw["k_cache"].repeat(3, 1, 1, 1), kw["v_cache"].repeat(3, 1, 1, 1)))
    kw["block_table"] = torch.zeros(2, 2, dtype=torch.int32, device=kw["q"].device)


ERRORS = [
    ("block_table out of range", _bad_block_table, ValueError, r"block_table has 1 entries outside \[0, 7\)"),
    ("cache too small", lambda kw: kw.update(cache_seqlens=torch.tensor([10, 31], dtype=torch.int32,
                                                                        device=kw["q"].device)),
     ValueError, "cache is too small: cache_seqlens \\+ seqlen_new reaches 33 but each sequence holds 32"),
    ("paged cache too small", lambda kw: (_paged(kw), kw.update(cache_seqlens=31)), ValueError, "too small"),
    ("page size 24", _non_pow2_pages, ValueError, "page size 24.*power of two"),
    ("cache dtype", lambda kw: kw.update(v_cache=kw["v_cache"].half()), TypeError, "v_cache has dtype"),
    ("k dtype", lambda kw: kw.update(k=kw["k"].half()), TypeError, "k has dtype torch.float16"),
    ("k shape", lambda kw: kw.update(k=kw["k"][:, :, :1]), ValueError, r"k has shape \(2, 2, 1, 32\)"),
    ("v missing", lambda kw: kw.update(v=None), ValueError, "k and v must be given together"),
    ("seqlens dtype", lambda kw: kw.update(cache_seqlens=kw["cache_seqlens"].float()), TypeError,
     "cache_seqlens has dtype"),
    ("seqlens shape", lambda kw: kw.update(cache_seqlens=kw["cache_seqlens"][:1]), ValueError,
     r"cache_seqlens has shape \(1,\)"),
    ("negative seqlens", lambda kw: kw["cache_seqlens"].fill_(-1), ValueError, "negative"),
    ("leftpad > seqlens", lambda kw: kw.update(cache_leftpad=torch.tensor([11, 0], dtype=torch.int32,
                                                                          device=kw["q"].device)),
     ValueError, "cache_leftpad must satisfy"),
    ("batch_idx range", lambda kw: kw.update(cache_batch_idx=torch.tensor([0, 2], device=kw["q"].device)),
     ValueError, r"cache_batch_idx has entries in \[0, 2\]"),
    ("batch_idx repeated", lambda kw: kw.update(cache_batch_idx=torch.tensor([1, 1], device=kw["q"].device)),
     ValueError, "repeats an entry"),
    ("batch_idx + block_table", lambda kw: (_paged(kw), kw.update(cache_batch_idx=torch.tensor(
        [0, 1], device=kw["q"].device))), ValueError, "cache_batch_idx and block_table"),
    ("gqa heads", lambda kw: kw.update(q=kw["q"][:, :, :3]), ValueError, "multiple of the number of key/value"),
    ("rotary without k", lambda kw: kw.update(k=None, v=None, rotary_cos=torch.ones(64, 8),
                                              rotary_sin=torch.zeros(64, 8)), ValueError, "without k and v"),
    ("rotary table short", lambda kw: kw.update(rotary_cos=torch.ones(21, 8), rotary_sin=torch.zeros(21, 8)),
     ValueError, "rotary_cos/rotary_sin have 21 positions"),
    ("rotary dim", lambda kw: kw.update(rotary_cos=torch.ones(64, 17), rotary_sin=torch.zeros(64, 17)),
     ValueError, "rotary_dim 34"),
    ("num_splits", lambda kw: kw.update(num_splits=129), ValueError, "num_splits is 129"),
    ("window", lambda kw: kw.update(window_size=(-2, 0)), ValueError, "window_size"),
    ("requires grad", lambda kw: kw["q"].requires_grad_(), NotImplementedError, "inference only"),
]


@pytest.mark.parametrize("name,change,exc,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_write_nothing(device, name, change, exc, match):
    kw = _bad(device, change)
    if "rotary_cos" in kw:
        kw["rotary_cos"], kw["rotary_sin"] = kw["rotary_cos"].to(device), kw["rotary_sin"].to(device)
    before = (kw["k_cache"].clone(), kw["v_cache"].clone())
    with pytest.raises(exc, match=match):
        flash_attn_with_kvcache(**kw)
    for b, a in zip(before, (kw["k_cache"], kw["v_cache"])):
        assert torch.equal(b.nan_to_num(7.0), a.nan_to_num(7.0)), f"{name}: the cache was written"
