"""The ``distributed`` bench suite (CPU tier): its listing on a fake 4-GPU machine, row assembly and selection
with a stubbed spawn, one real run on CPU (2 gloo ranks, Triton interpreter) through ``Runner.run`` and the
Suite.run_rows hook, and the failure paths: a case that raises in the workers (ERROR row with the message), an
OOM inside a worker (OOM row, the next task still runs), a worker process that dies, one that hangs (killed at
the deadline). Spawns cost ~10 s each (every process re-imports torch and transformers)."""

import math
import time

import pytest
import torch
import torch.distributed as dist

from flashfuse.bench import harness
from flashfuse.bench.harness import Case, Options, Runner, attention_flops
from flashfuse.bench.suites import _distributed_workers as workers
from flashfuse.bench.suites.distributed import Distributed, provider_world
from flashfuse.bench.suites.models import SIZES, _flops

CPU = Options(device="cpu", progress=False)
CEILINGS = {"device": "test", "cpu": True, "copy_bytes": 1 << 20, "copy_ms": 1.0, "copy_GBps": 100.0,
            "matmul_n": 64, "matmul_dtype": "bfloat16", "matmul_ms": 1.0, "matmul_TFLOPS": 2.0, "note": "test"}


def _gpus(monkeypatch, n):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    return Options(device="cuda", progress=False)


# ----------------------------------------------------------------------------------------------------
# Declarations (no processes)
# ----------------------------------------------------------------------------------------------------

def test_listing_on_four_gpus(monkeypatch):
    opts = _gpus(monkeypatch, 4)
    suite = Distributed()
    names = [p.name for p in suite.providers(opts)]
    assert names == ["flash-1gpu", "ring-zigzag-x2", "ring-zigzag-x4", "ring-contiguous-x2", "1gpu", "ddp-x2",
                     "fsdp2-x2", "ddp-x4", "fsdp2-x4", "cp-fsdp2-x2", "cp-fsdp2-x4"]
    assert [provider_world(n) for n in names] == [1, 2, 4, 2, 1, 2, 2, 4, 4, 2, 4]
    cases = {c.name: c for c in suite.cases(opts)}
    ring = [f"ring causal S{s} bf16 {m}" for s in (16384, 65536, 131072) for m in ("fwd", "fwd+bwd")]
    assert list(cases) == ring + ["llama-1b train B8xGPU S2048", "llama-1b long-context train S98304",
                                  "llama-1b long-context train S196608"]
    c = cases["ring causal S65536 bf16 fwd+bwd"]
    assert c.flops == attention_flops(1, 32, 65536, 65536, 128, causal=True, mode="fwd+bwd")
    assert c.params == dict(group="ring", B=1, Hq=32, Hk=8, D=128, S=65536) and c.dtype == torch.bfloat16
    assert c.providers == ("flash-1gpu", "ring-zigzag-x2", "ring-zigzag-x4", "ring-contiguous-x2")
    assert suite.check_case(c).params["S"] == 4096
    train = cases["llama-1b train B8xGPU S2048"]
    assert train.flops == _flops(SIZES["llama-3.2-1b"], 8, 2048, "train")
    assert train.providers == ("1gpu", "ddp-x2", "fsdp2-x2", "ddp-x4", "fsdp2-x4")
    long = cases["llama-1b long-context train S196608"]
    assert long.flops == _flops(SIZES["llama-3.2-1b"], 1, 196608, "train")
    assert long.providers == ("1gpu", "cp-fsdp2-x2", "cp-fsdp2-x4") and suite.check_case(long) is long
    quick = [c.name for c in suite.cases(Options(device="cuda", quick=True))]
    assert quick == ["ring causal S16384 bf16 fwd", "ring causal S16384 bf16 fwd+bwd",
                     "llama-1b train B8xGPU S2048", "llama-1b long-context train S98304"]


def test_listing_on_cpu():
    suite = Distributed()
    assert [c.name for c in suite.cases(CPU)] == [
        "ring causal S24 fp32 fwd", "ring causal S24 fp32 fwd+bwd", "llama-tiny train B2xGPU S16",
        "llama-tiny long-context train S32"]
    assert {provider_world(p.name) for p in suite.providers(CPU)} == {1, 2}


def test_one_gpu_machine_gives_na_rows_without_spawning(monkeypatch):
    opts = _gpus(monkeypatch, 1)
    opts.providers = ("ring-zigzag-x2", "ddp-x2", "cp-fsdp2-x2")
    monkeypatch.setattr(Distributed, "spawn", staticmethod(lambda *a, **k: pytest.fail("spawned")))
    rows = Runner(opts, CEILINGS).run(Distributed())
    assert len(rows) == 6 + 1 + 2
    assert all(r.status == "N/A" and r.message == "needs 2 GPUs (this machine has 1 GPU(s))" for r in rows)


def _stub_spawn(calls, ms=2.0, loss=3.5):
    """A spawn that records (world, providers) and returns an OK result of ``ms`` for every task."""
    def spawn(world, tasks, cuda, worker=None, timeout_s=None):
        calls.append((world, [t["provider"] for t in tasks]))
        return {t["index"]: dict(status="OK", message="", ms=ms, peak_mem_bytes=123, rel_error=None,
                                 loss=None if t["group"] == "ring" else loss, wall_s=0.5) for t in tasks}, ""
    return staticmethod(spawn)


def test_selection_before_spawning_and_row_assembly(monkeypatch):
    """--only / --providers choose the tasks; a world with nothing selected is not spawned. Rows: TFLOP/s per GPU
    (the harness's _rates on FLOPs / world), tokens per step and tokens/s, speedups against each group's 1-GPU
    baseline (Suite.baseline is a tuple: the first with a row in the case)."""
    calls = []
    monkeypatch.setattr(Distributed, "spawn", _stub_spawn(calls))
    opts = Options(device="cpu", progress=False, providers=("flash-1gpu",))
    rows = Runner(opts, CEILINGS).run(Distributed())
    assert calls == [(1, ["flash-1gpu", "flash-1gpu"])] and [r.status for r in rows] == ["OK", "OK"]

    calls.clear()
    opts = Options(device="cpu", progress=False, only="train B", providers=("1gpu", "ddp-x2", "fsdp2-x2"))
    rows = Runner(opts, CEILINGS).run(Distributed())
    assert calls == [(1, ["1gpu"]), (2, ["ddp-x2", "fsdp2-x2"])]
    size = SIZES["llama-tiny"]
    for r, world in zip(rows, (1, 2, 2)):
        assert r.params["world"] == world and r.params["tokens"] == world * 2 * 16
        assert r.flops == _flops(size, 2 * world, 16, "train")
        assert math.isclose(r.tflops, r.flops / world / 2e-3 / 1e12)
        assert math.isclose(r.pct_ceiling, 100 * r.tflops / CEILINGS["matmul_TFLOPS"])
        assert r.message == f"{world * 32 / 2e-3:,.0f} tokens/s, loss 3.5000"
        assert r.speedup == 1.0 and r.peak_mem_bytes == 123

    calls.clear()
    rows = Runner(Options(device="cpu", progress=False, only="fwd$"), CEILINGS).run(Distributed())
    assert calls == [(1, ["flash-1gpu"]), (2, ["ring-zigzag-x2", "ring-contiguous-x2"])]
    assert [r.speedup for r in rows] == [1.0, 1.0, 1.0] and rows[0].kind == "baseline"
    flops = attention_flops(1, 2, 24, 24, 16, causal=True)
    assert [r.tflops for r in rows] == pytest.approx([flops / w / 2e-3 / 1e12 for w in (1, 2, 2)])


# ----------------------------------------------------------------------------------------------------
# Worker pieces in this process (a gloo group of one)
# ----------------------------------------------------------------------------------------------------

def test_worker_oom_and_error_become_results(tmp_path, monkeypatch):
    """An OutOfMemoryError in a runner is an OOM result, any other exception an ERROR with its message; the
    next task runs."""
    def oom(task, ctx):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 TiB")

    def boom(task, ctx):
        raise ValueError("bad shape 37")

    monkeypatch.setitem(workers.RUNNERS, "oom", oom)
    monkeypatch.setitem(workers.RUNNERS, "boom", boom)
    monkeypatch.setitem(workers.RUNNERS, "ok", lambda task, ctx: dict(status="OK", ms=1.5))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        ctx = workers.Rank(0, 1, torch.device("cpu"), cuda=False)
        got = [workers.run_task(dict(group=g), ctx) for g in ("oom", "boom", "ok")]
    finally:
        dist.destroy_process_group()
    assert [(r["status"], r["message"]) for r in got] == [
        ("OOM", "out of memory"), ("ERROR", "ValueError: bad shape 37"), ("OK", "")]
    assert got[2]["ms"] == 1.5 and got[0]["ms"] is None


def test_combine_takes_the_worst_rank_and_the_slowest_time():
    ok = dict(status="OK", message="", ms=2.0, peak_mem_bytes=10, rel_error=1e-3, loss=None, wall_s=1.0)
    slow = dict(ok, ms=3.0, peak_mem_bytes=30, wall_s=2.0)
    row = workers.combine(dict(index=7), [ok, slow])
    assert (row["index"], row["status"], row["ms"], row["peak_mem_bytes"], row["wall_s"]) == (7, "OK", 3.0, 30, 2.0)
    row = workers.combine(dict(index=0), [ok, dict(ok, status="ERROR", message="RuntimeError: x", ms=None)])
    assert (row["status"], row["message"], row["ms"]) == ("ERROR", "rank 1: RuntimeError: x", None)
    row = workers.combine(dict(index=0), [dict(ok, status="ERROR", message="e"), dict(ok, status="OOM",
                                                                                      message="out of memory")])
    assert (row["status"], row["message"]) == ("OOM", "rank 1: out of memory")


# ----------------------------------------------------------------------------------------------------
# Spawned processes
# ----------------------------------------------------------------------------------------------------

class _WithBadCase(Distributed):
    """The CPU suite plus a ring case the workers must fail on: 26 tokens cannot be cut in 2 x 2 zig-zag chunks."""

    def _ring_cases(self, opts, multi):
        bad = Case(name="ring causal S26 fp32 fwd", params=dict(group="ring", B=1, Hq=2, Hk=1, D=16, S=26),
                   dtype=torch.float32, mode="fwd", flops=1.0, group="ring attention fwd", x=26.0,
                   providers=("ring-zigzag-x2",))
        return super()._ring_cases(opts, multi) + [bad]


@pytest.fixture(scope="module")
def cpu_rows():
    """Every CPU case on every provider: one spawn of world 1, one of world 2 (in the world-2 workers the bad case
    comes after the other ring tasks and before the training tasks, which must still run)."""
    return {(r.case, r.provider): r for r in Runner(CPU, CEILINGS).run(_WithBadCase())}


def test_cpu_run_ring_rows(cpu_rows):
    rows = cpu_rows
    for mode in ("fwd", "fwd+bwd"):
        base = rows[(f"ring causal S24 fp32 {mode}", "flash-1gpu")]
        assert base.status == "OK" and base.ms > 0 and base.speedup == 1.0 and base.rel_error is None
        for prov in ("ring-zigzag-x2", "ring-contiguous-x2"):
            r = rows[(f"ring causal S24 fp32 {mode}", prov)]
            # The check ran on the case itself: out (and dq, dk, dv) vs flash_attn_func, fp32 (~1e-7 seen).
            assert r.status == "OK", r.message
            assert r.rel_error is not None and r.rel_error <= harness.TOLERANCE[torch.float32]
            assert r.tolerance == harness.TOLERANCE[torch.float32] and r.check_params is None
            assert r.params["world"] == 2 and r.speedup is not None and r.tflops is not None


def test_cpu_run_training_rows(cpu_rows):
    rows = cpu_rows
    for case, provs in (("llama-tiny train B2xGPU S16", ("1gpu", "ddp-x2", "fsdp2-x2")),
                        ("llama-tiny long-context train S32", ("1gpu", "cp-fsdp2-x2"))):
        losses = {}
        for prov in provs:
            r = rows[(case, prov)]
            assert r.status == "OK", (prov, r.message)
            assert r.ms > 0 and r.tflops is not None and "tokens/s, loss" in r.message
            losses[prov] = float(r.message.rsplit("loss ", 1)[1])
            assert math.isfinite(losses[prov])
        # A random-init model predicts ~uniformly over the 256-token vocabulary: loss ~ ln 256 = 5.5.
        assert all(abs(v - math.log(256)) < 0.5 for v in losses.values()), losses
    # The long-context rows train the same model (seed 0) on the same sequence (seed 1000): context parallel over
    # 2 ranks must give one process's loss after the same AdamW steps (fp32; the message rounds to 4 decimals).
    assert abs(losses["cp-fsdp2-x2"] - losses["1gpu"]) < 2e-4, losses


def test_cpu_run_error_row_and_the_run_goes_on(cpu_rows):
    rows = cpu_rows
    r = rows[("ring causal S26 fp32 fwd", "ring-zigzag-x2")]
    assert r.status == "ERROR" and r.ms is None
    assert "ValueError" in r.message and "multiple of 2 * world_size = 4" in r.message
    later = [r for (case, prov), r in rows.items() if prov in ("ddp-x2", "fsdp2-x2", "cp-fsdp2-x2")]
    assert len(later) == 3 and all(r.status == "OK" for r in later)


def _raising_worker(rank, world, tmp, tasks, cuda):
    if rank == 1:
        raise RuntimeError("rank 1 fell over")
    time.sleep(600)           # rank 0 would run on: the spawn must stop it


def _sleeping_worker(rank, world, tmp, tasks, cuda):
    time.sleep(600)


@pytest.mark.parametrize("worker, timeout_s, failure", [
    (_raising_worker, 60, "rank 1: RuntimeError: rank 1 fell over"),
    (_sleeping_worker, 4, "timed out after 4 s (killed)"),
])
def test_dead_or_hung_workers_give_error_rows(worker, timeout_s, failure):
    suite = Distributed()
    opts = Options(device="cpu", progress=False, only="fwd$", providers=("ring-zigzag-x2",))
    case = suite.cases(opts)[0]
    prov = next(p for p in suite.providers(opts) if p.name == "ring-zigzag-x2")
    row, task = suite._prepare(case, prov, 2, opts, 0)
    start = time.perf_counter()
    results, got = Distributed.spawn(2, [task], False, worker=worker, timeout_s=timeout_s)
    assert time.perf_counter() - start < 300         # far from the 600 s the workers would sleep
    assert results == {} and got == failure
    suite._finish(Runner(opts, CEILINGS), row, case, 2, None, got)
    assert row.status == "ERROR" and row.message == f"no result from the world-2 worker processes: {failure}"
