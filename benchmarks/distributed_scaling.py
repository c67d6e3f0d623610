"""Tokens/s of a patched Llama-3.2-1B-shaped training step on 1 GPU and on N GPUs, under DDP and FSDP2.

    PYTHONPATH=src python benchmarks/distributed_scaling.py --out DIR/distributed_scaling.json [--batch 8] [--gpus 2]
    PYTHONPATH=src python benchmarks/distributed_scaling.py --cpu-smoke      # tiny model, gloo, 2 CPU processes

The model is the models suite's (``flashfuse.bench.suites.models._build``: Llama-3.2-1B config, seed 0, bf16
weights, ``patch_transformers``); one step is zero_grad, forward with labels (the fused linear cross entropy),
backward and a fused AdamW step, on a per-GPU batch of B sequences of 2048 random tokens (weak scaling: the global
batch is N x B). Rows:

- world 1, ``none``: the plain model on one GPU (the baseline);
- world N, ``ddp``: patched, then ``DistributedDataParallel(gradient_as_bucket_view=True)`` (the gradients are
  views of DDP's all-reduce buckets: no copy in or out);
- world N, ``fsdp2``: patched, then ``flashfuse.distributed.training.fully_shard_transformer`` (fully_shard per
  decoder layer, then the root; parameters resharded after forward unless ``--no-reshard``).

Each world size runs in processes this script spawns (``torch.multiprocessing``, NCCL on GPU); every process has
NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), set before
spawning and again in each child before the process group starts. Timing: ``--warmup`` untimed steps (Triton
compiles and autotunes in the first), then ``--steps`` steps each between two CUDA events; a rank's time is the
median step, a row's the slowest rank's (the collectives keep the ranks in step). tokens/s = N x B x S / step time;
scaling = tokens/s / the 1-GPU row's; efficiency = scaling / N. Peak memory: torch.cuda.max_memory_allocated over
the build and all steps, the largest rank's. With B8 on 2 H200s the run should take 1-2 minutes (an estimate: three
model builds, 13 steps of ~0.25 s each, two spawns; the first run also compiles the Triton kernels). ``--cpu-smoke`` runs the same code on the tiny config (fp32,
gloo, the kernels in Triton's interpreter) with wall-clock timing: a check that the script works, not a number.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashfuse.distributed.training import NVLS_OFF_ENV, disable_nvlink_multicast

GIB = 1024 ** 3


def _step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return loss


def _measure(rank: int, world: int, wrapper: str, args, device: torch.device) -> dict:
    """Build, wrap and time one configuration on this rank; returns the row (valid on rank 0)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from flashfuse.bench.suites.models import SIZES, _build
    from flashfuse.distributed.training import fully_shard_transformer

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = _build(SIZES[args.size], args.dtype, device.type, patch=True).train()
    if wrapper == "ddp":
        model = DDP(model, device_ids=[device.index] if cuda else None, gradient_as_bucket_view=True)
    elif wrapper == "fsdp2":
        fully_shard_transformer(model, reshard_after_forward=not args.no_reshard)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)  # HF Trainer's default on CUDA
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    vocab = SIZES[args.size]["vocab_size"]
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=g).to(device)

    for _ in range(args.warmup):
        loss = _step(model, opt, ids)
    times = []
    if cuda:
        torch.cuda.synchronize(device)
        if world > 1:
            dist.barrier()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.steps)]
        for start, end in events:
            start.record()
            loss = _step(model, opt, ids)
            end.record()
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            loss = _step(model, opt, ids)
            times.append((time.perf_counter() - t0) * 1e3)
    loss = loss.detach().float()
    stats = torch.tensor([statistics.median(times), torch.cuda.max_memory_allocated(device) / GIB if cuda else 0.0],
                         dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        dist.all_reduce(loss)
        loss /= world
    del model, opt
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    ms = stats[0].item()
    tokens = world * args.batch * args.seq
    return dict(world=world, wrapper=wrapper, batch_per_rank=args.batch, seq=args.seq, tokens_per_step=tokens,
                ms=ms, tokens_per_s=tokens / (ms / 1e3), peak_gib=stats[1].item() if cuda else None,
                loss=loss.item(), steps=args.steps, warmup=args.warmup)


def _worker(rank: int, world: int, wrappers: list, args, tmp: str) -> None:
    disable_nvlink_multicast()  # inherited from the parent already; set again before any communicator exists
    if args.cpu_smoke:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    if world > 1:
        dist.init_process_group("gloo" if args.cpu_smoke else "nccl", init_method=f"file://{tmp}/init{world}",
                                rank=rank, world_size=world, **({} if args.cpu_smoke else dict(device_id=device)))
    try:
        rows = [_measure(rank, world, wrapper, args, device) for wrapper in wrappers]
        if rank == 0:
            with open(os.path.join(tmp, f"rows{world}.json"), "w") as f:
                json.dump(rows, f)
    finally:
        if world > 1:
            dist.destroy_process_group()


def _table(rows: list) -> str:
    head = f"{'world':>5} {'wrapper':>7} {'B/GPU':>5} {'ms/step':>9} {'tokens/s':>10} {'scaling':>8} " \
           f"{'effic.':>7} {'peak GiB':>9} {'loss':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        scaling = "" if r.get("scaling") is None else f"{r['scaling']:.2f}x"
        eff = "" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%"
        peak = "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        lines.append(f"{r['world']:>5} {r['wrapper']:>7} {r['batch_per_rank']:>5} {r['ms']:>9.1f} "
                     f"{r['tokens_per_s']:>10.0f} {scaling:>8} {eff:>7} {peak:>9} {r['loss']:>8.4f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the rows and the set-up as JSON to this file")
    p.add_argument("--gpus", type=int, default=2, help="the multi-GPU world size (default 2)")
    p.add_argument("--batch", type=int, default=None, help="sequences per GPU (default 8; 2 with --cpu-smoke)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 2048; 16 with --cpu-smoke)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3; 1 with --cpu-smoke)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 2 with --cpu-smoke)")
    p.add_argument("--wrappers", default="ddp,fsdp2", help="comma-separated, of: ddp, fsdp2 (default both)")
    p.add_argument("--no-reshard", action="store_true",
                   help="FSDP2 keeps the parameters unsharded from forward to backward (reshard_after_forward=False)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny Llama, fp32, gloo on CPU: check the script runs")
    args = p.parse_args(argv)
    smoke = args.cpu_smoke
    for name, gpu, cpu in (("batch", 8, 2), ("seq", 2048, 16), ("warmup", 3, 1), ("steps", 10, 2)):
        if getattr(args, name) is None:
            setattr(args, name, cpu if smoke else gpu)
    args.size = "llama-tiny" if smoke else "llama-3.2-1b"
    args.dtype = torch.float32 if smoke else torch.bfloat16  # fp32->bf16 truncates in the interpreter
    wrappers = [w for w in args.wrappers.split(",") if w]
    bad = [w for w in wrappers if w not in ("ddp", "fsdp2")]
    if bad or not wrappers:
        p.error(f"--wrappers got {args.wrappers!r}; supported: ddp, fsdp2 (comma-separated)")
    if args.gpus < 2:
        p.error(f"--gpus is {args.gpus}; the multi-GPU world size must be at least 2")
    if not smoke and torch.cuda.device_count() < args.gpus:
        p.error(f"--gpus is {args.gpus} but {torch.cuda.device_count()} CUDA device(s) are visible "
                "(use --cpu-smoke on a machine without GPUs)")
    if min(args.batch, args.seq, args.steps) < 1 or args.warmup < 0:
        p.error("--batch, --seq and --steps must be >= 1 and --warmup >= 0")

    disable_nvlink_multicast()  # before anything spawns: the children inherit os.environ
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world, ws in ((1, ["none"]), (args.gpus, wrappers)):
            mp.spawn(_worker, args=(world, ws, args, tmp), nprocs=world, join=True)
            with open(os.path.join(tmp, f"rows{world}.json")) as f:
                rows += json.load(f)
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["scaling"] = r["tokens_per_s"] / base
        r["efficiency"] = r["scaling"] / r["world"]
    elapsed = time.perf_counter() - t0

    print(f"{args.size}, {'fp32 CPU (smoke)' if smoke else 'bf16'}, S={args.seq}, B={args.batch} per GPU, "
          f"{'AdamW' if smoke else 'fused AdamW'}, patch_transformers; {args.warmup} warmup + {args.steps} timed steps; total {elapsed:.0f} s")
    print(_table(rows))
    if args.out:
        import transformers
        import triton

        meta = dict(
            model=args.size, dtype=str(args.dtype).replace("torch.", ""), seq=args.seq, batch_per_rank=args.batch,
            gpus=args.gpus, warmup=args.warmup, steps=args.steps, reshard_after_forward=not args.no_reshard,
            cpu_smoke=smoke, device=torch.cuda.get_device_name(0) if not smoke else platform.processor() or "cpu",
            torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
            env={k: os.environ.get(k) for k in NVLS_OFF_ENV}, elapsed_s=elapsed, argv=sys.argv[1:],
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
        )
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
