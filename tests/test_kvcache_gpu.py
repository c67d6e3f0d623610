"""flash_attn_with_kvcache, GPU tier: Llama-like decode shapes (32 query / 8 kv heads, head dim 128) at real
cache lengths (1k..32k) and batches (1..64), fp16 and bf16, contiguous and paged caches, against the
float64 reference; every num_splits agrees; torch.compile(fullgraph=True) matches eager."""

import pytest
import torch
from testing import rel_err

from flashfuse.ops.attention.kvcache import flash_attn_with_kvcache
from flashfuse.reference.kvcache import flash_attn_with_kvcache_ref
from flashfuse.reference.rope import rotary_tables

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
# Relative error vs float64: the output's own rounding (2^-11 fp16, 2^-8 bf16) plus the probabilities
# rounded to the dtype for the P @ V product, a few times over.
TOL = {F16: 2e-3, BF16: 1.2e-2}
NHEADS_Q, NHEADS_K, HEAD_DIM = 32, 8, 128


def _inputs(batch, capacity, seqlen_q, dtype, paged_size=0):
    q = torch.randn(batch, seqlen_q, NHEADS_Q, HEAD_DIM, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, capacity, NHEADS_K, HEAD_DIM, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    k, v = (torch.randn(batch, seqlen_q, NHEADS_K, HEAD_DIM, device="cuda", dtype=dtype) for _ in range(2))
    lens = torch.randint(capacity // 2, capacity - seqlen_q + 1, (batch,), device="cuda", dtype=torch.int32)
    block_table = None
    if paged_size:
        per_seq = capacity // paged_size
        perm = torch.randperm(batch * per_seq, device="cuda")
        block_table = perm.view(batch, per_seq).to(torch.int32)
        pages = []
        for cache in (k_cache, v_cache):
            paged = torch.empty(batch * per_seq, paged_size, NHEADS_K, HEAD_DIM, device="cuda", dtype=dtype)
            paged[perm] = cache.reshape(-1, paged_size, NHEADS_K, HEAD_DIM)
            pages.append(paged)
        k_cache, v_cache = pages
    return q, k_cache, v_cache, k, v, lens, block_table


CASES = [
    dict(batch=1, capacity=32768, seqlen_q=1, dtype=BF16),
    dict(batch=64, capacity=1024, seqlen_q=1, dtype=F16),
    dict(batch=4, capacity=8192, seqlen_q=1, dtype=BF16, paged_size=256),
    dict(batch=16, capacity=4096, seqlen_q=4, dtype=F16, paged_size=16, causal=True),
    dict(batch=32, capacity=2048, seqlen_q=1, dtype=BF16, window_size=(1000, 0), softcap=30.0),
    dict(batch=8, capacity=16384, seqlen_q=4, dtype=F16, causal=True, alibi=True, rotary=True),
    dict(batch=2, capacity=32768, seqlen_q=4, dtype=BF16, paged_size=64, causal=True, rotary=True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_decode_matches_reference(case):
    case = dict(case)
    shape = {k: case.pop(k) for k in ("batch", "capacity", "seqlen_q", "dtype")}
    shape["paged_size"] = case.pop("paged_size", 0)
    q, kc, vc, k, v, lens, block_table = _inputs(**shape)
    opts = dict(cache_seqlens=lens, block_table=block_table, **case)
    if opts.pop("alibi", False):
        opts["alibi_slopes"] = torch.rand(NHEADS_Q, device="cuda") * 0.05
    if opts.pop("rotary", False):
        cos, sin = rotary_tables(HEAD_DIM, shape["capacity"], device="cuda")
        opts.update(rotary_cos=cos.to(q.dtype), rotary_sin=sin.to(q.dtype), rotary_interleaved=False)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    ref_out, ref_lse = flash_attn_with_kvcache_ref(q, ref_kc, ref_vc, k, v, **opts)
    results = []
    for num_splits in (0, 1, 7):
        kc_i, vc_i = kc.clone(), vc.clone()
        out, lse = flash_attn_with_kvcache(q, kc_i, vc_i, k, v, num_splits=num_splits, return_softmax_lse=True,
                                           **opts)
        assert rel_err(out, ref_out) <= TOL[q.dtype], f"num_splits={num_splits}: {rel_err(out, ref_out):.2e}"
        assert rel_err(lse, ref_lse) <= 1e-4
        if "rotary_cos" in opts:      # rotated in fp32 vs fp64, then rounded: at most one ulp apart
            torch.testing.assert_close(kc_i, ref_kc, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(kc_i, ref_kc)
        assert torch.equal(vc_i, ref_vc)
        results.append((out, lse))
    for out, lse in results[1:]:       # split counts: fp32 reordering, then one rounding to the dtype
        assert rel_err(out, results[0][0]) <= TOL[q.dtype] / 2
        assert rel_err(lse, results[0][1]) <= 1e-5


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_torch_compile_matches_eager(dtype):
    q, kc, vc, k, v, lens, block_table = _inputs(8, 4096, 1, dtype, paged_size=256)

    def step(q, kc, vc, k, v, lens, block_table):
        return flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=block_table, causal=True,
                                       num_splits=4)

    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    eager = step(q, kc1, vc1, k, v, lens, block_table)
    compiled = torch.compile(step, fullgraph=True)(q, kc2, vc2, k, v, lens, block_table)
    assert torch.equal(kc1, kc2) and torch.equal(vc1, vc2)
    assert torch.equal(compiled, eager)


def test_decode_loop_grows_the_cache():
    """Token by token (as generate() does): cache_seqlens += 1 each step; the last step equals one
    reference call over the whole cache."""
    batch, capacity, steps = 4, 2048, 8
    q, kc, vc, _, _, lens, _ = _inputs(batch, capacity, 1, BF16)
    lens = torch.full((batch,), 1000, device="cuda", dtype=torch.int32)
    ref_kc, ref_vc = kc.clone(), vc.clone()
    for _ in range(steps):
        k, v = (torch.randn(batch, 1, NHEADS_K, HEAD_DIM, device="cuda", dtype=BF16) for _ in range(2))
        out = flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True)
        ref_out, _ = flash_attn_with_kvcache_ref(q, ref_kc, ref_vc, k, v, cache_seqlens=lens, causal=True)
        assert rel_err(out, ref_out) <= TOL[BF16]
        lens += 1
    assert torch.equal(kc, ref_kc) and torch.equal(vc, ref_vc)
