"""``distributed``: flashfuse across GPUs, each world size in its own spawned processes.

Three groups of cases (TFLOP/s are PER GPU: the case's FLOPs / world size / seconds; ms is the slowest rank's):

1. Ring attention (``flashfuse.distributed.ring_flash_attn_func``): one Llama-3-8B attention layer (batch 1, 32
   query / 8 KV heads of 128, causal, bf16) over S = 16k, 64k, 128k tokens, ``fwd`` and ``fwd+bwd`` (the
   backward of out with a random dout). Providers: ``flash-1gpu`` (the baseline: ``flash_attn_func`` on the
   whole sequence on one GPU), ``ring-zigzag-xN`` (the sequence zig-zag sharded over N GPUs: every rank does the
   same causal work) and ``ring-contiguous-x2`` (contiguous shards: the last rank does 3/4 of the work, which is
   why zig-zag is the default). Correctness: on S = 4096 every ring provider's out (and dq, dk, dv), gathered and
   unsharded, against ``flash_attn_func`` on the whole sequence (harness.TOLERANCE). FLOPs: flash-attn's count
   for the whole sequence.
2. Training scaling (what ``benchmarks/distributed_scaling.py`` measured): the patched Llama-3.2-1B-shaped model
   (``models._build``), bf16, B8 per GPU x S2048 random tokens (weak scaling: the global batch is N x B), fused
   AdamW. Providers ``1gpu`` (the baseline), ``ddp-xN`` (DistributedDataParallel, gradients as bucket views),
   ``fsdp2-xN`` (``fully_shard_transformer``). 3 warmup + 10 timed steps, each between two CUDA events; a rank's
   time is the median step. A row's ``params["tokens"]`` is N x B x S, so tokens/s = tokens / ms (also in the
   row's message); ``flops`` = ``models._flops`` of the global batch. Weak scaling: a row's ``speedup`` (1gpu ms /
   its ms) is per step, so the tokens/s scaling is N x speedup and the efficiency is the per-GPU TFLOP/s ratio.
   (Ring attention and long context are strong scaling: the same work on N GPUs, speedup is the speedup.)
3. Long context: the same model trained on ONE sequence of S = 96k or 192k tokens. ``1gpu`` (the plain patched
   model) against ``cp-fsdp2-xN`` (``flashfuse.distributed.context_parallel``: the sequence zig-zag sharded and
   attention as ring attention, plus FSDP2 on the same ranks). One GPU runs out of memory at 192k: that OOM row is
   the point. 1 warmup + 2 timed steps.

Worlds: 1 and each of 2, 4, 8 that the machine has (one GPU: the multi-GPU rows are N/A). One
``torch.multiprocessing`` spawn per world size runs every selected case of that world (``_distributed_workers``);
--only / --providers select before spawning, and a world with nothing to run is not spawned. Every process runs
with NVLink multicast off (flashfuse.distributed.disable_nvlink_multicast). A case's failure on a rank is a row
(OOM, ERROR with the message, WRONG), never a hung bench: see the workers' docstring.

On CPU (gloo, the Triton interpreter): worlds 1 and 2, a tiny ring case (fp32, 2/1 heads of 16, S 24) and
llama-tiny (fp32, B2 x S16 and one sequence of S 32, one warmup + one timed step): a correctness run.

Estimated GPU time on 4 H200s (full suite; --quick keeps S 16k and 96k): ~5 minutes. Spawns: 3 x ~20 s (imports,
NCCL, the first Triton compiles; later spawns reuse the disk cache). Ring attention ~1 min: a call of S 128k
fwd+bwd takes ~1 s on one GPU, 1/N of it on N; each case runs a check, 2 warmup and >= 3 timed calls (1.5 s of
calls when they are short). Training scaling ~1 min: 5 configurations x (build ~5 s + 13 steps of ~0.25 s).
Long context ~2 min: 96k: 1gpu ~9 s per step (if it fits), x2 ~5 s, x4 ~2.5 s; 192k: x2 ~15 s, x4 ~8 s, 1gpu OOM;
3 steps each.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import replace

import torch

from ..harness import TOLERANCE, Case, Provider, Row, Suite, attention_flops, dtype_name
from . import _distributed_workers as workers
from .models import SIZES, _flops

MULTI_GPU_WORLDS = (2, 4, 8)
# Ring attention: a Llama-3-8B layer (32 query / 8 KV heads of 128), batch 1, causal.
RING_GPU = dict(B=1, Hq=32, Hk=8, D=128)
RING_SEQLENS, RING_QUICK, RING_CHECK_S = (16384, 65536, 131072), (16384,), 4096
RING_CPU = dict(B=1, Hq=2, Hk=1, D=16, S=24)     # 24 = 2 zig-zag chunks of 6 per rank on 2 ranks
# Training scaling (benchmarks/distributed_scaling.py's defaults, session 6).
TRAIN_GPU = dict(model="llama-3.2-1b", B=8, S=2048, warmup=3, steps=10)
TRAIN_CPU = dict(model="llama-tiny", B=2, S=16, warmup=1, steps=1)
# Long context: one sequence; 192k = 2 x 96k, and both are multiples of 2 x 8 (zig-zag chunks on 8 ranks).
LONG_SEQLENS, LONG_QUICK = (98304, 196608), (98304,)
LONG_GPU = dict(model="llama-3.2-1b", B=1, warmup=1, steps=2)
LONG_CPU = dict(model="llama-tiny", B=1, S=32, warmup=1, steps=1)
SHORT = {"llama-3.2-1b": "llama-1b", "llama-tiny": "llama-tiny"}
# The parent ends a spawn that runs past this (a hang the process-group timeout did not end): a start-up
# allowance plus one per task, generous (the estimates above are ~10x smaller).
SPAWN_START_S, TASK_TIMEOUT_S = 180, {"ring": 120, "train": 300, "long": 600}


def provider_world(name: str) -> int:
    """The world size a provider runs on: 1 for the ``*1gpu`` baselines, N for ``*-xN``."""
    return 1 if name.endswith("1gpu") else int(name.rsplit("-x", 1)[1])


def _multi_worlds(opts) -> list[int]:
    """The multi-GPU world sizes with providers: those the machine has; at least 2 (N/A rows on one GPU)."""
    if not opts.gpu:
        return [2]
    return [n for n in MULTI_GPU_WORLDS if n <= torch.cuda.device_count()] or [2]


def _available(opts) -> int:
    return torch.cuda.device_count() if opts.gpu else 2


def _in_workers(case, *inputs):
    raise RuntimeError("the distributed suite runs in spawned worker processes (Suite.run_rows), not in-process")


class Distributed(Suite):
    name = "distributed"
    description = ("flashfuse across GPUs, one process per rank: ring attention (Llama-3-8B layer, 16k-128k tokens) "
                   "vs flash_attn_func on one GPU; the patched Llama-1B training step on 1 GPU vs DDP / FSDP2 on N "
                   "(B8 per GPU); one long sequence (96k / 192k) on 1 GPU vs context parallel + FSDP2 on N. "
                   "TFLOP/s are per GPU (FLOPs / world / s); tokens/s = params['tokens'] / ms")
    baseline = ("1gpu", "flash-1gpu")
    metric = "tflops"
    plots = ()

    # -- what the suite declares ------------------------------------------------------------------------
    def providers(self, opts):
        multi = _multi_worlds(opts)
        provs = [Provider("flash-1gpu", _in_workers, kind="baseline",
                          description="flash_attn_func on the whole sequence, one GPU")]
        provs += [Provider(f"ring-zigzag-x{n}", _in_workers, kind="flashfuse",
                           description=f"ring_flash_attn_func, zig-zag shards over {n} GPUs") for n in multi]
        provs.append(Provider("ring-contiguous-x2", _in_workers, kind="flashfuse",
                              description="ring_flash_attn_func, contiguous shards over 2 GPUs (unbalanced "
                                          "under the causal mask)"))
        provs.append(Provider("1gpu", _in_workers, kind="baseline", description="the patched model on one GPU"))
        for n in multi:
            provs += [Provider(f"ddp-x{n}", _in_workers, kind="flashfuse",
                               description=f"patched, DistributedDataParallel over {n} GPUs"),
                      Provider(f"fsdp2-x{n}", _in_workers, kind="flashfuse",
                               description=f"patched, FSDP2 (fully_shard_transformer) over {n} GPUs")]
        provs += [Provider(f"cp-fsdp2-x{n}", _in_workers, kind="flashfuse",
                           description=f"patched, context_parallel + FSDP2 over {n} GPUs (one sequence)")
                  for n in multi]
        return provs

    def cases(self, opts):
        multi = _multi_worlds(opts)
        return (self._ring_cases(opts, multi) + self._train_cases(opts, multi)
                + self._long_cases(opts, multi))

    def _ring_cases(self, opts, multi):
        shape, dtype = (dict(RING_GPU), torch.bfloat16) if opts.gpu else (dict(RING_CPU), torch.float32)
        seqlens = (RING_QUICK if opts.quick else RING_SEQLENS) if opts.gpu else (shape.pop("S"),)
        names = ("flash-1gpu", *(f"ring-zigzag-x{n}" for n in multi), "ring-contiguous-x2")
        cases = []
        for seqlen in seqlens:
            for mode in ("fwd", "fwd+bwd"):
                flops = attention_flops(shape["B"], shape["Hq"], seqlen, seqlen, shape["D"], causal=True, mode=mode)
                cases.append(Case(name=f"ring causal S{seqlen} {dtype_name(dtype)} {mode}",
                                  params=dict(group="ring", **shape, S=seqlen), dtype=dtype, mode=mode,
                                  flops=flops, group=f"ring attention {mode}", x=float(seqlen), ceiling="matmul",
                                  providers=names))
        return cases

    def _train_cases(self, opts, multi):
        p, dtype = (dict(TRAIN_GPU), torch.bfloat16) if opts.gpu else (dict(TRAIN_CPU), torch.float32)
        names = ("1gpu", *(f"{w}-x{n}" for n in multi for w in ("ddp", "fsdp2")))
        return [Case(name=f"{SHORT[p['model']]} train B{p['B']}xGPU S{p['S']}", params=dict(group="train", **p),
                     dtype=dtype, mode="fwd+bwd", flops=_flops(SIZES[p["model"]], p["B"], p["S"], "train"),
                     group="training scaling", x=float(p["B"] * p["S"]), ceiling="matmul", providers=names)]

    def _long_cases(self, opts, multi):
        if opts.gpu:
            p, dtype, seqlens = dict(LONG_GPU), torch.bfloat16, (LONG_QUICK if opts.quick else LONG_SEQLENS)
        else:
            p, dtype = dict(LONG_CPU), torch.float32
            seqlens = (p.pop("S"),)
        names = ("1gpu", *(f"cp-fsdp2-x{n}" for n in multi))
        return [Case(name=f"{SHORT[p['model']]} long-context train S{s}", params=dict(group="long", **p, S=s),
                     dtype=dtype, mode="fwd+bwd", flops=_flops(SIZES[p["model"]], 1, s, "train"),
                     group="long context", x=float(s), ceiling="matmul", providers=names)
                for s in seqlens]

    def check_case(self, case):
        """Ring cases are checked at S 4096 on GPU (the check gathers every output on rank 0), the tiny case
        itself on CPU; training rows check their loss in the run."""
        if case.params["group"] == "ring" and case.params["S"] > RING_CHECK_S:
            return case.replace(S=RING_CHECK_S)
        return case

    # -- running: one spawn per world size --------------------------------------------------------------
    def run_rows(self, runner, progress):
        opts = runner.opts
        cases, providers = runner.select(self)
        rows, work = [], {}            # work: world -> [(row, case, task)]
        for case in cases:
            for prov in providers:
                if case.providers is not None and prov.name not in case.providers:
                    continue
                world = provider_world(prov.name)
                row, task = self._prepare(case, prov, world, opts, len(rows))
                rows.append(row)
                if task is None:
                    progress_update(progress, f"{self.name}: {case.name} [{prov.name}]")
                else:
                    work.setdefault(world, []).append((row, case, task))
        for world in sorted(work):
            if progress is not None:
                progress.set_description(f"{self.name}: world {world}, {len(work[world])} rows")
            results, failure = self.spawn(world, [t for _, _, t in work[world]], opts.gpu)
            for row, case, task in work[world]:
                self._finish(runner, row, case, world, results.get(task["index"]), failure)
                progress_update(progress)
        return rows

    def _prepare(self, case: Case, prov: Provider, world: int, opts, index: int):
        """The row, and the worker's task for it (None when the row is decided here: N/A, SKIP)."""
        p = case.params
        row = Row(suite=self.name, case=case.name, provider=prov.name, kind=prov.kind, status="",
                  dtype=dtype_name(case.dtype), mode=case.mode, group=case.group, x=case.x,
                  params=dict(p, world=world), flops=case.flops, bytes=case.bytes)
        if p["group"] != "ring":                       # the global batch's work and tokens
            batch = p["B"] * (world if p["group"] == "train" else 1)
            row.flops = _flops(SIZES[p["model"]], batch, p["S"], "train")
            row.params["tokens"] = batch * p["S"]
        if world > _available(opts):
            have = f"{torch.cuda.device_count()} GPU(s)" if opts.gpu else "2 processes"
            row.status, row.message = "N/A", f"needs {world} GPUs (this machine has {have})"
            return row, None
        reason = prov.skip(case) if prov.skip is not None else None
        if reason:
            row.status, row.message = "SKIP", reason
            return row, None
        check = self.check_case(case)
        if check.key() != case.key():
            row.check_params = dict(check.params)
        if p["group"] == "ring":
            row.tolerance = TOLERANCE[case.dtype]
        layout = prov.name.split("-")[1] if p["group"] == "ring" and world > 1 else None   # ring-<layout>-xN
        wrapper = prov.name.split("-")[0] if p["group"] != "ring" and world > 1 else "none"  # <wrapper>-...-xN
        task = dict(index=index, group=p["group"], provider=prov.name, world=world,
                    dtype=str(case.dtype).replace("torch.", ""), mode=case.mode, params=dict(p),
                    check=dict(check.params), tolerance=row.tolerance, layout=layout, wrapper=wrapper)
        return row, task

    def _finish(self, runner, row: Row, case: Case, world: int, result: dict | None, failure: str) -> None:
        """Fill a row from its worker result (None: the workers died or timed out before it)."""
        if result is None:
            row.status = "ERROR"
            row.message = f"no result from the world-{world} worker processes: {failure or 'they stopped early'}"
            return
        row.status, row.message = result["status"], result["message"]
        row.ms, row.peak_mem_bytes, row.wall_s = result["ms"], result["peak_mem_bytes"], result["wall_s"]
        row.rel_error = result.get("rel_error")
        if row.status != "OK":
            return
        # Per-GPU rates: the harness's own arithmetic on this row's work divided by the world size.
        runner._rates(replace(case, flops=row.flops / world), row)
        if result.get("loss") is not None:
            tokens_per_s = row.params["tokens"] / (row.ms * 1e-3)
            row.message = f"{tokens_per_s:,.0f} tokens/s, loss {result['loss']:.4f}"

    @staticmethod
    def spawn(world: int, tasks: list, cuda: bool, worker=None, timeout_s: float | None = None):
        """Run ``tasks`` on ``world`` spawned ranks; returns ({task index: result}, failure message or "").

        NVLink multicast is off in the children (set here, inherited, restored afterwards). A child's exception
        or death ends the spawn (torch's ProcessContext stops the other ranks); past ``timeout_s`` the children
        are killed. Either way the results written so far are kept and the failure is returned."""
        import torch.multiprocessing as mp

        from flashfuse.distributed import nvlink_multicast_off

        worker = worker or workers.worker
        if timeout_s is None:
            timeout_s = SPAWN_START_S + sum(TASK_TIMEOUT_S[t["group"]] for t in tasks)
        failure = ""
        with tempfile.TemporaryDirectory(prefix="flashfuse-distributed-") as tmp, nvlink_multicast_off():
            try:
                ctx = mp.start_processes(worker, args=(world, tmp, tasks, cuda), nprocs=world, join=False,
                                         start_method="spawn")
                deadline = time.monotonic() + timeout_s
                while not ctx.join(timeout=1.0):
                    if time.monotonic() > deadline:
                        failure = f"timed out after {timeout_s:.0f} s (killed)"
                        for proc in ctx.processes:
                            if proc.is_alive():
                                proc.kill()
                        for proc in ctx.processes:
                            proc.join()
                        break
            except Exception as exc:         # noqa: BLE001 -- ProcessRaisedException / ProcessExitedException
                lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
                if isinstance(exc, mp.ProcessRaisedException):    # the last line of the rank's traceback
                    failure = f"rank {exc.error_index}: {lines[-1]}"[:500]
                else:                                             # "process 1 terminated with signal SIGABRT"
                    failure = f"{type(exc).__name__}: {lines[0]}"[:500]
            results = {}
            path = os.path.join(tmp, workers.RESULTS)
            if os.path.exists(path):
                with open(path) as f:
                    for line in f:
                        if line.strip():
                            result = json.loads(line)
                            results[result["index"]] = result
        return results, failure


def progress_update(progress, description: str | None = None) -> None:
    if progress is not None:
        if description:
            progress.set_description(description)
        progress.update(1)
