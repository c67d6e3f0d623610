"""What each rank of the ``distributed`` bench suite runs (``distributed.py`` spawns the processes).

``worker(rank, world, tmp, tasks, cuda)`` is the spawned function: it turns NVLink multicast off, starts the
process group (NCCL with ``device_id`` on GPU, gloo on CPU; a ``file://`` rendezvous in ``tmp``), runs every task
of its world size in order and, on rank 0, appends one JSON line per task to ``tmp/results.jsonl`` (so the rows
finished before a crash survive it). A task is a dict the parent builds from a (case, provider) pair::

    dict(index=int, group="ring" | "train" | "long", provider=str, world=int, dtype="bfloat16", mode="fwd",
         params={...case params...}, check={...reduced case params...} | None, tolerance=float | None,
         layout="zigzag" | "contiguous" | None,          # ring: None = flash_attn_func on the whole sequence
         wrapper="none" | "ddp" | "fsdp2" | "cp")         # train / long

Every rank runs ``run_task``: a barrier, the group's runner, and exceptions caught into a status (OOM for
``torch.cuda.OutOfMemoryError``, ERROR with the message otherwise; memory freed after either), so one failing
case does not stop the others. The ranks' results are gathered (``all_gather_object``) and rank 0 writes the
row: the worst status (OOM > ERROR > WRONG > OK, with the failing rank's message), the slowest rank's median
time and the largest rank's peak memory. Decisions that change which collectives run (a WRONG check, non-finite
outputs, the number of timed calls) are agreed by all ranks through a collective before they act on them.
A rank that fails in the middle of a collective while the others wait cannot be rescued from inside: the
process group's timeout (``PG_TIMEOUT_S``) ends the waiting ranks and the parent's deadline the spawn; the parent
turns every task without a result into an ERROR row.
"""

from __future__ import annotations

import gc
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ..harness import _is_oom, _message, rel_error

# A collective may wait this long for the slowest rank: the first call of a case compiles and autotunes the
# Triton kernels on every rank (tens of seconds), a long-context step takes ~15 s. A rank stuck behind a failed
# peer is ended by this timeout (NCCL's watchdog tears the process down).
PG_TIMEOUT_S = 300
# Ring attention: calls timed after warmup, from a budget of this many ms per case (the second warmup call's
# time, agreed across ranks, sets the count), at least MIN_CALLS for a median, at most MAX_CALLS.
RING_WARMUP, RING_BUDGET_MS, MIN_CALLS, MAX_CALLS = 2, 1500.0, 3, 30
RESULTS = "results.jsonl"
LR = 1e-4
STATUS_RANK = {"OOM": 0, "ERROR": 1, "WRONG": 2, "OK": 3}      # which rank's status names the row


@dataclass
class Rank:
    """This process's place: rank, world size, device, and the ring checks already run (by provider, case)."""
    rank: int
    world: int
    device: torch.device
    cuda: bool
    checks: dict = field(default_factory=dict)


def _sync(ctx: Rank) -> None:
    if ctx.cuda:
        torch.cuda.synchronize(ctx.device)


def _free(ctx: Rank) -> None:
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()


def _all_true(flag: bool, ctx: Rank) -> bool:
    """Whether ``flag`` holds on every rank (one all_reduce MIN)."""
    t = torch.tensor([int(bool(flag))], device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def time_calls(fn, ctx: Rank, warmup: int, calls: int | None = None) -> list[float]:
    """ms of each timed call of ``fn`` on this rank: ``warmup`` untimed calls, then (``calls`` None) a count
    from RING_BUDGET_MS and the last warmup's time (the slowest rank's, so every rank runs the same number of
    calls: the calls hold collectives), a barrier, and each call between two CUDA events (wall clock on CPU)."""
    for i in range(warmup):
        if calls is None and i == warmup - 1:
            _sync(ctx)
            start = time.perf_counter()
            fn()
            _sync(ctx)
            est = torch.tensor([(time.perf_counter() - start) * 1e3], dtype=torch.float64, device=ctx.device)
            dist.all_reduce(est, op=dist.ReduceOp.MAX)
            calls = int(min(MAX_CALLS, max(MIN_CALLS, RING_BUDGET_MS // max(est.item(), 1e-3))))
        else:
            fn()
    calls = calls or MIN_CALLS
    _sync(ctx)
    dist.barrier()
    if not ctx.cuda:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return times
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(ctx.device)
    return [start.elapsed_time(end) for start, end in events]


# ----------------------------------------------------------------------------------------------------
# Ring attention (and flash_attn_func on the whole sequence, the 1-GPU baseline)
# ----------------------------------------------------------------------------------------------------

def _ring_inputs(p: dict, dtype: torch.dtype, ctx: Rank, layout: str | None, grad: bool):
    """q, k, v, dout: the same seeded full-sequence tensors on every rank, then this rank's shard (layout None:
    the whole sequence). Returns (shards, full tensors or None)."""
    from flashfuse.distributed import zigzag_shard

    g = torch.Generator(device=ctx.device).manual_seed(0)
    shapes = [(p["B"], p["S"], p["Hq"], p["D"]), (p["B"], p["S"], p["Hk"], p["D"]), (p["B"], p["S"], p["Hk"], p["D"]),
              (p["B"], p["S"], p["Hq"], p["D"])]
    full = [torch.randn(s, generator=g, device=ctx.device, dtype=dtype) for s in shapes]
    if layout is None:
        shards = [t.clone() for t in full]
    elif layout == "zigzag":
        shards = [zigzag_shard(t, ctx.rank, ctx.world) for t in full]
    else:
        shards = [t.chunk(ctx.world, dim=1)[ctx.rank].contiguous() for t in full]
    for t in shards[:3]:
        t.requires_grad_(grad)
    return shards, full


def _attention(layout: str | None):
    from flashfuse import flash_attn_func
    from flashfuse.distributed import ring_flash_attn_func

    if layout is None:
        return lambda q, k, v: flash_attn_func(q, k, v, causal=True)
    return lambda q, k, v: ring_flash_attn_func(q, k, v, causal=True, layout=layout)


def _attention_step(attn, q, k, v, dout, mode: str):
    """(out,) in fwd mode (no graph), (out, dq, dk, dv) in fwd+bwd."""
    if mode == "fwd":
        with torch.no_grad():
            return (attn(q, k, v),)
    out = attn(q, k, v)
    return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))


def _ring_check(task: dict, ctx: Rank) -> dict:
    """out (and dq, dk, dv) of the ring on the check case, gathered from the ranks and unsharded, against
    flash_attn_func on the whole sequence on rank 0 (the same seeded inputs). Every rank gets rank 0's verdict."""
    from flashfuse.distributed import zigzag_unshard

    dtype, layout, mode = getattr(torch, task["dtype"]), task["layout"], task["mode"]
    shards, full = _ring_inputs(task["check"], dtype, ctx, layout, grad=mode != "fwd")
    got = _attention_step(_attention(layout), *shards, mode)
    gathered = []
    for t in got:
        parts = [torch.empty_like(t) for _ in range(ctx.world)]
        dist.all_gather(parts, t.contiguous())
        gathered.append(zigzag_unshard(parts) if layout == "zigzag" else torch.cat(parts, dim=1))
    verdict = [None]
    if ctx.rank == 0:
        try:
            q, k, v = (t.clone().requires_grad_(mode != "fwd") for t in full[:3])
            ref = _attention_step(_attention(None), q, k, v, full[3], mode)
            errs = [rel_error(a, b) for a, b in zip(gathered, ref)]
            tol = task["tolerance"]
            bad = [i for i, e in enumerate(errs) if not e <= tol]            # NaN is never <= tol
            finite = [e for e in errs if math.isfinite(e)]
            verdict[0] = dict(status="OK", message="", rel_error=max(finite) if finite else None)
            if bad:
                names = ("out", "dq", "dk", "dv")
                verdict[0].update(status="WRONG", message=f"{names[bad[0]]}: rel. error {errs[bad[0]]:.3g} > "
                                  f"tolerance {tol:.3g} (vs flash_attn_func on the whole sequence)")
        except Exception as exc:          # noqa: BLE001 -- the other ranks wait for the verdict
            verdict[0] = dict(status="OOM" if _is_oom(exc) else "ERROR", rel_error=None,
                              message=("out of memory in the check" if _is_oom(exc) else _message(exc)))
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]


def run_ring(task: dict, ctx: Rank) -> dict:
    p, dtype, layout, mode = task["params"], getattr(torch, task["dtype"]), task["layout"], task["mode"]
    result = {}
    if layout is not None:                        # flash-1gpu is the reference itself: nothing to check
        key = (task["provider"], json.dumps(task["check"], sort_keys=True), mode)
        if key not in ctx.checks:
            ctx.checks[key] = _ring_check(task, ctx)
            _free(ctx)
        result.update(ctx.checks[key])
        if result["status"] != "OK":
            return result
    shards, full = _ring_inputs(p, dtype, ctx, layout, grad=mode != "fwd")
    del full
    attn, (q, k, v, dout) = _attention(layout), shards
    first = _attention_step(attn, q, k, v, dout, mode)
    finite = all(bool(torch.isfinite(t).all()) for t in first)
    del first
    if not _all_true(finite, ctx):
        return dict(result, status="WRONG", message="non-finite values (NaN/inf) in the full-size run")
    times = time_calls(lambda: _attention_step(attn, q, k, v, dout, mode), ctx, warmup=RING_WARMUP - 1)
    return dict(result, status="OK", ms=statistics.median(times))


# ----------------------------------------------------------------------------------------------------
# Training steps: data parallel (train) and context parallel (long)
# ----------------------------------------------------------------------------------------------------

def run_train(task: dict, ctx: Rank) -> dict:
    """One configuration of the patched Llama (bench.suites.models' ``_build``): build, wrap, time the steps.

    wrapper "none": the plain model (world 1); "ddp": DistributedDataParallel(gradient_as_bucket_view=True), the
    gradients are views of DDP's all-reduce buckets (no copy in or out); "fsdp2": ``fully_shard_transformer``
    (per decoder layer, then the root); "cp": ``context_parallel`` (attention -> zig-zag ring attention) then
    ``fully_shard_transformer`` on the same ranks, the ONE sequence of the case sharded over the ranks.
    group "train": each rank its own batch of B sequences (weak scaling); "long": one sequence of S tokens, the
    same on every rank. One step: zero_grad, forward with labels (fused linear cross entropy), backward, AdamW
    (fused on CUDA: HF Trainer's default).

    Check: the loss after the timed steps is finite. A wrong but finite loss cannot be caught here; that
    DDP / FSDP2 / context parallel train as one process does is tests/test_distributed_training*.py's job.
    """
    from flashfuse.bench.suites.models import SIZES, _build

    p, wrapper, dtype = task["params"], task["wrapper"], getattr(torch, task["dtype"])
    size = SIZES[p["model"]]
    model = _build(size, dtype, ctx.device.type, patch=True).train()
    long_context = task["group"] == "long"
    g = torch.Generator().manual_seed(1000 if long_context else 1000 + ctx.rank)   # train: each rank its data
    ids = torch.randint(0, size["vocab_size"], (p["B"], p["S"]), generator=g).to(ctx.device)
    batch, scale = dict(input_ids=ids, labels=ids), 1
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[ctx.device.index] if ctx.cuda else None, gradient_as_bucket_view=True)
    elif wrapper in ("fsdp2", "cp"):
        from flashfuse.distributed import fully_shard_transformer
        if wrapper == "cp":
            # Lazy: the context-parallel API is newer than this suite; without it these rows are ERROR rows.
            from flashfuse.distributed import context_parallel, context_parallel_shard
            context_parallel(model, group=None)
            batch = context_parallel_shard(ids, labels=ids, model=model)
            scale = ctx.world       # each rank's loss is its share of the global mean; FSDP2 averages gradients
        fully_shard_transformer(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=ctx.cuda)
    state = {}

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        (loss * scale).backward()
        opt.step()
        state["loss"] = loss.detach()

    times = time_calls(step, ctx, warmup=p["warmup"], calls=p["steps"])
    loss = state["loss"].float().reshape(1)
    if ctx.world > 1 and wrapper != "none":
        dist.all_reduce(loss)                     # cp: the shares add up to the mean; ddp / fsdp2: mean of ranks
        if wrapper != "cp":
            loss /= ctx.world
    loss = loss.item()
    if not math.isfinite(loss):
        return dict(status="WRONG", message=f"loss after the timed steps is {loss}", loss=None)
    return dict(status="OK", ms=statistics.median(times), loss=loss)


RUNNERS = {"ring": run_ring, "train": run_train, "long": run_train}


# ----------------------------------------------------------------------------------------------------
# One task on every rank; the spawned entry point
# ----------------------------------------------------------------------------------------------------

def run_task(task: dict, ctx: Rank) -> dict:
    """This rank's result of one task: status, message, ms (median), peak_mem_bytes, rel_error, loss, wall_s."""
    start = time.perf_counter()
    result = dict(status="OK", message="", ms=None, peak_mem_bytes=None, rel_error=None, loss=None)
    _free(ctx)
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    try:
        dist.barrier()
        result.update(RUNNERS[task["group"]](task, ctx))
    except Exception as exc:              # noqa: BLE001 -- a failing case is a row, never a crash
        oom = _is_oom(exc)
        result.update(status="OOM" if oom else "ERROR", message="out of memory" if oom else _message(exc))
    _free(ctx)                            # after the except block: the traceback's frames are gone
    if ctx.cuda:
        result["peak_mem_bytes"] = int(torch.cuda.max_memory_allocated(ctx.device))
    result["wall_s"] = time.perf_counter() - start
    return result


def combine(task: dict, results: list[dict]) -> dict:
    """The row's result from every rank's: the worst status (its rank's message), the slowest rank's time, the
    largest peak memory; rank 0's check error and loss (agreed or all-reduced already)."""
    worst = min(range(len(results)), key=lambda r: (STATUS_RANK.get(results[r]["status"], 1), r))
    row = dict(results[0], index=task["index"], status=results[worst]["status"], message=results[worst]["message"])
    if len(results) > 1 and row["status"] in ("OOM", "ERROR"):
        row["message"] = f"rank {worst}: {row['message']}"
    times = [r["ms"] for r in results if r.get("ms") is not None]
    row["ms"] = max(times) if row["status"] == "OK" and len(times) == len(results) else None
    peaks = [r["peak_mem_bytes"] for r in results if r.get("peak_mem_bytes") is not None]
    row["peak_mem_bytes"] = max(peaks) if peaks else None
    row["wall_s"] = max(r["wall_s"] for r in results)
    return row


def worker(rank: int, world: int, tmp: str, tasks: list, cuda: bool) -> None:
    """The spawned process of ``rank``: runs every task of world size ``world`` (see the module docstring)."""
    from flashfuse.distributed import disable_nvlink_multicast

    disable_nvlink_multicast()     # inherited from the parent already; again before any communicator exists
    if cuda:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/rendezvous", rank=rank,
                            world_size=world, timeout=timedelta(seconds=PG_TIMEOUT_S),
                            **(dict(device_id=device) if cuda else {}))
    ctx = Rank(rank, world, device, cuda)
    try:
        for task in tasks:
            mine = run_task(task, ctx)
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
            if rank == 0:
                with open(os.path.join(tmp, RESULTS), "a") as f:
                    f.write(json.dumps(combine(task, everyone)) + "\n")
        dist.barrier()            # no rank exits (the spawn then ends the others) before rank 0 has written
    finally:
        dist.destroy_process_group()
