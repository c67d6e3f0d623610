"""Ring attention, CPU tier: 2 gloo processes run ring_flash_attn_func (kernels in Triton's interpreter) on
their shards; this process compares the gathered results with single-process flash_attn_func on the full
sequence (and once with the float64 reference), for out, lse, dq, dk and dv.

One spawn of 2 processes serves every case (each process re-imports torch: seconds): the module fixture
writes the full inputs to a file, the workers write their shards' results, the tests read them.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashfuse import flash_attn_func
from flashfuse.distributed import ring_flash_attn_func, zigzag_shard, zigzag_unshard
from flashfuse.distributed.ring_attention import _segments, ring_plans
from flashfuse.reference.attention import attention_ref

from testing import rel_err

WORLD = 2
TOL = 1e-5          # fp32 in the interpreter: the ring's fp32 merge vs one kernel pass (~1e-7 seen)

# name: (batch, global seqlen, nheads_q, nheads_k, headdim, options). Global lengths are odd multiples of
# the chunk count: 20 = 2 * 2 * 5 (zig-zag chunks of 5), 14 = 2 * 7 (contiguous shards of 7).
CASES = {
    "contiguous": (2, 14, 2, 2, 16, dict(layout="contiguous")),
    "zigzag_causal": (1, 20, 2, 2, 16, dict(layout="zigzag", causal=True)),
    "zigzag_causal_gqa": (1, 28, 4, 2, 16, dict(layout="zigzag", causal=True)),
    "zigzag_gqa_softcap": (1, 20, 4, 2, 16, dict(layout="zigzag", softcap=2.0, softmax_scale=0.5)),
    "zigzag_window": (1, 36, 2, 1, 16, dict(layout="zigzag", window_size=(5, 2))),
    "contiguous_causal_window": (1, 26, 2, 2, 24, dict(layout="contiguous", causal=True, window_size=(4, -1))),
}


def _shard(x, rank, layout):
    return zigzag_shard(x, rank, WORLD) if layout == "zigzag" else x.chunk(WORLD, dim=1)[rank]


def _unshard(shards, layout):
    return zigzag_unshard(shards) if layout == "zigzag" else torch.cat(shards, dim=1)


def _worker(rank, tmp):
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD)
    try:
        inputs = torch.load(f"{tmp}/inputs.pt")
        results = {}
        for name, case in inputs.items():
            opts = dict(case["opts"])
            q, k, v, dout = (_shard(case[n], rank, opts["layout"]).requires_grad_(n != "dout")
                             for n in ("q", "k", "v", "dout"))
            out, lse, _ = ring_flash_attn_func(q, k, v, return_attn_probs=True, **opts)
            out.backward(dout)
            results[name] = dict(out=out.detach(), lse=lse, dq=q.grad, dk=k.grad, dv=v.grad)
        torch.save(results, f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory):
    """{case: (inputs, gathered ring results)}, from one spawn of WORLD gloo processes."""
    tmp = tmp_path_factory.mktemp("ring")
    gen = torch.Generator().manual_seed(0)
    inputs = {}
    for name, (batch, seqlen, hq, hk, hd, opts) in CASES.items():
        shapes = dict(q=(batch, seqlen, hq, hd), k=(batch, seqlen, hk, hd), v=(batch, seqlen, hk, hd),
                      dout=(batch, seqlen, hq, hd))
        inputs[name] = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
        inputs[name]["opts"] = opts
    torch.save(inputs, tmp / "inputs.pt")
    mp.spawn(_worker, args=(str(tmp),), nprocs=WORLD, join=True)   # a worker's exception fails here
    shards = [torch.load(tmp / f"rank{r}.pt") for r in range(WORLD)]
    gathered = {}
    for name, case in inputs.items():
        layout = case["opts"]["layout"]
        gathered[name] = {key: _unshard([s[name][key] for s in shards], layout)
                          for key in ("out", "dq", "dk", "dv")}
        lse = [s[name]["lse"] for s in shards]                        # (B, H, L): sequence on dim 2
        gathered[name]["lse"] = (zigzag_unshard(lse, dim=2) if layout == "zigzag" else torch.cat(lse, dim=2))
    return inputs, gathered


def _flash_reference(case):
    """flash_attn_func on the full sequence: (out, lse, dq, dk, dv)."""
    opts = {k: v for k, v in case["opts"].items() if k != "layout"}
    q, k, v = (case[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    out.backward(case["dout"])
    return dict(out=out.detach(), lse=lse, dq=q.grad, dk=k.grad, dv=v.grad)


@pytest.mark.parametrize("name", list(CASES))
def test_ring_matches_flash_attn(ring_results, name):
    inputs, gathered = ring_results
    ref = _flash_reference(inputs[name])
    ring = gathered[name]
    for key in ("out", "lse", "dq", "dk", "dv"):
        assert ring[key].shape == ref[key].shape, (key, ring[key].shape, ref[key].shape)
        assert torch.isfinite(ring[key]).all(), f"{name}: {key} has non-finite values"
        err = rel_err(ring[key], ref[key])
        assert err <= TOL, f"{name}: {key} rel err {err:.3g} > {TOL}"


def test_ring_matches_float64_reference(ring_results):
    inputs, gathered = ring_results
    case, ring = inputs["zigzag_causal_gqa"], gathered["zigzag_causal_gqa"]
    q, k, v = (case[n].double().requires_grad_() for n in ("q", "k", "v"))
    out, lse = attention_ref(q, k, v, causal=True)
    out.backward(case["dout"].double())
    for key, ref in (("out", out.detach()), ("lse", lse), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        err = rel_err(ring[key], ref)
        assert err <= TOL, f"{key} rel err {err:.3g} vs float64"


def test_world_size_one(tmp_path):
    """A ring of one rank (this process): no exchange at all, the plain kernels on the whole sequence."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        q, k, v, dout = (torch.randn(1, 10, 2, 16) for _ in range(4))
        got = dict(zip(("q", "k", "v"), (t.clone().requires_grad_() for t in (q, k, v))))
        out, lse, _ = ring_flash_attn_func(*got.values(), causal=True, window_size=(3, -1), return_attn_probs=True)
        out.backward(dout)
        ref = _flash_reference(dict(q=q, k=k, v=v, dout=dout, opts=dict(causal=True, window_size=(3, -1))))
        for key, value in (("out", out), ("lse", lse), ("dq", got["q"].grad), ("dk", got["k"].grad),
                           ("dv", got["v"].grad)):
            assert rel_err(value, ref[key]) <= TOL, key
    finally:
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------
# Planning and sharding (no processes)
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_plans_cover_each_visible_pair_once(layout, world):
    """Every (query, key) pair the global window shows is computed by exactly one kernel launch, on
    exactly one rank, and no hidden pair by any (interpreting each launch's window as the kernels do:
    top-left aligned, -1 = unbounded)."""
    for seqlen in ((2, 6, 10) if layout == "zigzag" else (1, 5, 7)):
        total = world * seqlen
        for left in (-1, 0, 1, 3, 9):
            for right in (-1, 0, 2, 7):
                count = torch.zeros(total, total, dtype=torch.int32)
                for rank in range(world):
                    q_pos = [o + i for _, n, o in _segments(layout, rank, world, seqlen) for i in range(n)]
                    for step, launches in enumerate(ring_plans(layout, rank, world, seqlen, left, right)):
                        src = (rank - step) % world
                        k_pos = [o + j for _, n, o in _segments(layout, src, world, seqlen) for j in range(n)]
                        for q0, q1, k0, k1, wl, wr in launches:
                            assert q0 < q1 and k0 < k1 and wl >= -1 and wr >= -1
                            i = torch.arange(q1 - q0)[:, None]
                            j = torch.arange(k1 - k0)[None, :]
                            seen = ((j >= i - wl) | (wl < 0)) & ((j <= i + wr) | (wr < 0))
                            rows = torch.tensor(q_pos[q0:q1])[:, None].expand_as(seen)
                            cols = torch.tensor(k_pos[k0:k1])[None, :].expand_as(seen)
                            count.index_put_((rows[seen], cols[seen]), torch.ones(int(seen.sum()), dtype=torch.int32),
                                             accumulate=True)
                i = torch.arange(total)[:, None]
                j = torch.arange(total)[None, :]
                want = ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))
                assert torch.equal(count, want.int()), (seqlen, left, right)


def test_zigzag_causal_plan_is_balanced():
    """Zig-zag causal: every rank launches on the same number of (query, key) pairs at every step past
    the first, in one fused launch."""
    world, seqlen = 4, 8
    for rank in range(world):
        plans = ring_plans("zigzag", rank, world, seqlen, -1, 0)
        assert len(plans[0]) == 3
        for launches in plans[1:]:
            assert len(launches) == 1
            q0, q1, k0, k1, wl, wr = launches[0]
            assert (q1 - q0) * (k1 - k0) == seqlen * seqlen // 2 and (wl, wr) == (-1, -1)


def test_zigzag_shard_roundtrip():
    x = torch.arange(2 * 12 * 3).reshape(2, 12, 3)
    shards = [zigzag_shard(x, r, 3) for r in range(3)]
    assert shards[0][0, :, 0].tolist() == [0, 3, 30, 33]               # chunks 0 and 5 of 6
    assert torch.equal(zigzag_unshard(shards), x)
    with pytest.raises(ValueError, match="multiple of 2 \\* world_size = 6"):
        zigzag_shard(x[:, :10], 0, 3)


# ----------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------

def _qkv(seqlen=4, hq=2, hk=2):
    return torch.randn(1, seqlen, hq, 16), torch.randn(1, seqlen, hk, 16), torch.randn(1, seqlen, hk, 16)


def test_errors():
    q, k, v = _qkv()
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="torch.distributed is not initialised"):
        ring_flash_attn_func(q, k, v)
    with pytest.raises(NotImplementedError, match="dropout_p is 0.1"):
        ring_flash_attn_func(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        ring_flash_attn_func(q, k, v, alibi_slopes=torch.ones(2))
    with pytest.raises(ValueError, match="layout is 'striped'"):
        ring_flash_attn_func(q, k, v, layout="striped")
    with pytest.raises(ValueError, match="3 tokens per rank; layout 'zigzag' needs an even number"):
        ring_flash_attn_func(*_qkv(seqlen=3))
    with pytest.raises(ValueError, match="k has 6 tokens but q has 4"):
        ring_flash_attn_func(q, torch.randn(1, 6, 2, 16), torch.randn(1, 6, 2, 16))
    with pytest.raises(ValueError, match="window_size is"):
        ring_flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        ring_flash_attn_func(*_qkv(hq=3, hk=2))
    with pytest.raises(TypeError, match="dtype"):
        ring_flash_attn_func(q, k.double(), v)
