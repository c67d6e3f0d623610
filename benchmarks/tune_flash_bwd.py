"""FlashAttention backward at long sequences (issue 3): the deterministic grid vs the atomic-dQ path.

    PYTHONPATH=src python benchmarks/tune_flash_bwd.py --out DIR [--only REGEX] [--budget 110]   (H200)

Shapes: flash-attn's benchmark, 16384 tokens (batch = 16384 / S), model dim 2048 (hd64 x 32 heads,
hd128 x 16 heads), S = 2048, 4096, 8192, causal and not, bf16. TFLOP/s convention: backward FLOPs =
2.5 x forward = 2.5 x 4 B H S^2 D (x0.5 causal).

What is timed: the backward kernels only. Ours: ``flash_bwd.flash_attn_backward`` called with the saved
out / lse (preprocess + backward grid, plus the dQ zeroing and fp32->bf16 pass on the atomic path) under
triton.testing.do_bench_cudagraph. Peers: SDPA cuDNN, SDPA flash (FA2) and torch.compile'd
FlexAttention (static shapes), each as ``torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)``
under do_bench (autograd cannot be graph-captured; at S >= 2048 the kernels take >= 1 ms, so the host's
launch cost is hidden behind them).

Variants (``variants(D)``): ``det-default`` = the shipped deterministic grid; ``det-<cfg>`` = candidate
tiles for it (FlexAttention's sm_90 backward config from torch's template_heuristics, Triton's
06-fused-attention tutorial); ``atomic-<cfg>`` = the atomic dQ path (BLOCK_M1 x BLOCK_N1, warps,
stages, ``-st`` = STAGGER, ``-kv`` = key-block-major grid instead of heads first). Every variant's dq/dk/dv is checked against det-default (relative error;
above 1e-2 or non-finite -> WRONG, not timed). Order: peers, the deterministic variants, then the
atomic ones (new code last: an illegal address would poison the context for everything after it).
Every row is printed as soon as it is measured. The Triton kernels of all variants are compiled up
front in parallel worker processes (Triton's disk cache), which keeps the run inside its budget.

Last: one table (variant, shape, us, TFLOP/s, % of the bf16 matmul ceiling, vs FlexAttention, vs SDPA
flash, vs cuDNN) and DIR/results.json.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import torch

from flashfuse.ops.attention import flash_bwd, flash_fwd

TOKENS, MODEL_DIM = 16384, 2048
SEQLENS = (2048, 4096, 8192)


def det(m1, n1, m2, n2, w, s, tma=(True, True)):
    """tma: (TMA_DKDV, TMA_DQ), tensor-descriptor tiles in each kind of program."""
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2, num_warps=w, num_stages=s, TMA_DKDV=tma[0],
                TMA_DQ=tma[1])


def atomic(m1, n1, w, s, stagger=False, heads_first=True, tma=True):
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, num_warps=w, num_stages=s, STAGGER=stagger, HEADS_FIRST=heads_first,
                TMA_DKDV=tma)


def _tma_suffix(c):
    kinds = [k for k, key in (("dkdv", "TMA_DKDV"), ("dq", "TMA_DQ")) if c.get(key)]
    return "" if len(kinds) == (2 if "BLOCK_M2" in c else 1) else "-tma" + "+".join(kinds) if kinds else "-ptr"


def _name(prefix, c):
    if "BLOCK_M2" in c:
        return (f"{prefix}-{c['BLOCK_M1']}x{c['BLOCK_N1']}+{c['BLOCK_M2']}x{c['BLOCK_N2']}"
                f"w{c['num_warps']}s{c['num_stages']}" + _tma_suffix(c))
    return (f"{prefix}-{c['BLOCK_M1']}x{c['BLOCK_N1']}w{c['num_warps']}s{c['num_stages']}"
            + ("-st" if c["STAGGER"] else "") + ("" if c.get("HEADS_FIRST", True) else "-kv")
            + _tma_suffix(c))


# Candidates, screened offline for compile errors and register spills (sm_90a, triton 3.6, ptxas -v with
# the launch's divisibility-16 specialization; numbers in the session report / benchmarks/NOTES.md).
# FlexAttention sm_90 (torch template_heuristics, CUDAConfigHeuristic): 64 <= D <= 128 -> M1 64, N1 128,
# M2 128, N2 64, 3 stages, 8 warps. Triton tutorial 06: 32, 128, 128, 32, 4 warps, 5 stages.
# Session 9: TMA_DKDV / TMA_DQ = tensor-descriptor tiles in the dK/dV / dQ programs (``-ptr`` neither,
# ``-tmadkdv`` / ``-tmadq`` one of them; no suffix: all that the grid has). ptxas spill bytes (hd64 / hd128, non-causal,
# both kinds on TMA): det 32x64+64x64 w4s3 0 (ptr 52); det 64x128+128x64 w8s3 660 / 804 (ptr - / 1208), w8s2 hd128
# 440; atomic 64x128 w8s2 60 / 1040, 32x128 w8s2 - / 300, 32x128 w4s3 432 / -, 64x64 w4 s3 / s2 604 / 332.
# First sweep (tune_flash_bwd.log of session 9): TMA in both kinds 5-10% faster at hd64, 12-14% slower at hd128;
# the atomic path (then with TMA bulk reduce-adds for dQ) slower everywhere. Second sweep: one kind at a time.
DET = {
    64: [det(32, 64, 64, 64, 4, 3, tma=(False, False)), det(32, 64, 64, 64, 4, 3, tma=(True, False)),
         det(32, 64, 64, 64, 4, 3, tma=(False, True)), det(64, 128, 128, 64, 8, 3), det(32, 64, 64, 64, 4, 2),
         det(32, 128, 128, 32, 4, 3)],
    128: [det(64, 128, 128, 64, 8, 3, tma=(True, False)), det(64, 128, 128, 64, 8, 3, tma=(False, True)),
          det(64, 128, 128, 64, 8, 3), det(64, 128, 128, 64, 8, 2), det(64, 64, 64, 64, 4, 2)],
}
ATOMIC = {
    64: [atomic(32, 128, 4, 3), atomic(64, 64, 4, 3), atomic(64, 128, 8, 2, tma=False)],
    128: [atomic(32, 128, 8, 2), atomic(64, 64, 4, 2), atomic(32, 128, 8, 3),
          atomic(32, 128, 8, 2, tma=False)],
}


def variants(head_dim):
    """(name, atomic_dq, config or None) in run order: deterministic first, atomic (new code) last."""
    yield "det-default", False, None
    for c in DET[head_dim]:
        yield _name("det", c), False, c
    yield "atomic-default", True, None
    for c in ATOMIC[head_dim]:
        if c != flash_bwd.atomic_backward_config(head_dim, torch.bfloat16):
            yield _name("atomic", c), True, c


def shapes(only):
    for hd in (64, 128):
        for seqlen in SEQLENS:
            for causal in (False, True):
                name = f"hd{hd}-S{seqlen}" + ("-causal" if causal else "")
                if not only or re.search(only, name):
                    yield name, TOKENS // seqlen, MODEL_DIM // hd, seqlen, hd, causal


def bwd_flops(batch, nheads, seqlen, hd, causal):
    return 2.5 * 4 * batch * nheads * seqlen * seqlen * hd * (0.5 if causal else 1.0)


def make_inputs(batch, nheads, seqlen, hd, causal, gen):
    q, k, v, dout = (torch.randn(batch, seqlen, nheads, hd, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    scale = 1.0 / math.sqrt(hd)
    out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=0 if causal else -1)[:2]
    return q, k, v, dout, out, lse, scale


def run_ours(inputs, causal, atomic_dq, config):
    q, k, v, dout, out, lse, scale = inputs
    return flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale,
                                         window_right=0 if causal else -1, deterministic=not atomic_dq,
                                         atomic_dq=atomic_dq, config=config)


def precompile_worker(head_dim, causal, atomic_dq, config_json):
    """Compile one variant's kernels into Triton's disk cache: run it once at S = 2048 (the same
    divisibility specialization as every timed shape: all sizes and block counts are multiples of 16)."""
    config = json.loads(config_json)
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = make_inputs(1, MODEL_DIM // head_dim, 2048, head_dim, causal, gen)
    run_ours(inputs, causal, atomic_dq, config)
    torch.cuda.synchronize()


def start_precompile(jobs, workers):
    """One subprocess per job, ``workers`` at once (threads only wait on them): compilation is mostly
    single-threaded and the GPU machine has 16 cores. Returns futures of (job, returncode, stderr)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        hd, causal, atomic_dq, config = job
        cmd = [sys.executable, os.path.abspath(__file__), "--precompile", json.dumps([hd, causal, atomic_dq, config])]
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return job, r.returncode, r.stderr[-400:]

    pool = ThreadPoolExecutor(max_workers=workers)
    return pool, [pool.submit(one, job) for job in jobs]


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="directory for results.json")
    ap.add_argument("--only", default=None, help="regex over shape names, e.g. 'hd128-S8192'")
    ap.add_argument("--vonly", default=None, help="regex over variant names (det-default always runs)")
    ap.add_argument("--budget", type=float, default=105.0, help="seconds; past it remaining rows are skipped")
    ap.add_argument("--no-flex", action="store_true", help="skip the compiled FlexAttention peer")
    ap.add_argument("--flex-budget", type=float, default=45.0,
                    help="seconds since the start after which no new FlexAttention shape is compiled")
    ap.add_argument("--workers", type=int, default=12, help="parallel precompile processes")
    ap.add_argument("--precompile", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.precompile:
        precompile_worker(*(lambda a: (a[0], a[1], a[2], json.dumps(a[3])))(json.loads(args.precompile)))
        return

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench, do_bench_cudagraph

    t0 = time.time()
    todo = list(shapes(args.only))
    want = lambda name: name == "det-default" or not args.vonly or re.search(args.vonly, name)  # noqa: E731
    # Compile every (head dim, causal, variant) in the background while the peers run.
    jobs, seen = [], set()
    for _, _, _, _, hd, causal in todo:
        for name, atomic_dq, config in variants(hd):
            if want(name) and (hd, causal, name) not in seen:
                seen.add((hd, causal, name))
                jobs.append((hd, causal, atomic_dq, config))
    pool, futures = start_precompile(jobs, args.workers)

    from flashfuse.bench.harness import measure_ceilings
    ceil = measure_ceilings("cuda")
    mm_tflops = ceil["matmul_TFLOPS"]
    print(f"{torch.cuda.get_device_name()}: bf16 matmul ceiling {mm_tflops:.0f} TFLOP/s, "
          f"copy {ceil['copy_GBps']:.0f} GB/s; {len(jobs)} variant compiles in the background", flush=True)

    rows, failures, skipped = [], [], []
    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {name: make_inputs(b, h, s, d, c, gen) for name, b, h, s, d, c in todo}

    def record(shape, variant, ms, err=None, note=None):
        name, batch, nheads, seqlen, hd, causal = shape
        fl = bwd_flops(batch, nheads, seqlen, hd, causal)
        rows.append(dict(shape=name, variant=variant, B=batch, H=nheads, S=seqlen, D=hd, causal=causal,
                         us=ms * 1e3, tflops=fl / ms * 1e-9, pct_ceiling=100 * fl / ms * 1e-9 / mm_tflops,
                         err=err, note=note))
        print({k_: round(v_, 4) if isinstance(v_, float) else v_ for k_, v_ in rows[-1].items()}, flush=True)

    def over_budget(what):
        if time.time() - t0 > args.budget:
            skipped.append(what)
            return True
        return False

    # 1. Peers: SDPA cuDNN / flash, then compiled FlexAttention (autograd.grad with the graph retained).
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
        for knob in ("cache_size_limit", "recompile_limit"):      # one compile per shape, 12 shapes
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 64)
    for backend_name in ("sdpa-cudnn", "sdpa-flash", "flex"):
        # Flex compiles once per shape (static shapes, as the bench's "static Flex"): longest S first.
        for shape in (sorted(todo, key=lambda t: -t[3]) if backend_name == "flex" else todo):
            name, batch, nheads, seqlen, hd, causal = shape
            if backend_name == "flex" and (flex is None or time.time() - t0 > args.flex_budget):
                skipped.append(f"{name}/flex") if flex is not None else None
                continue
            if over_budget(f"{name}/{backend_name}"):
                continue
            q, k, v, dout, _, _, scale = state[name]
            qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))   # (B, H, S, D)
            try:
                if backend_name == "flex":
                    mask = None
                    if causal:
                        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seqlen, seqlen,
                                                 device="cuda")
                    out = flex(qt, kt, vt, block_mask=mask, scale=scale)
                else:
                    backend = SDPBackend.CUDNN_ATTENTION if backend_name == "sdpa-cudnn" else SDPBackend.FLASH_ATTENTION
                    with sdpa_kernel(backend):
                        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
                do_t = dout.transpose(1, 2)
                fn = lambda: torch.autograd.grad(out, (qt, kt, vt), do_t, retain_graph=True)  # noqa: E731
                ms = do_bench(fn, warmup=5, rep=20, return_mode="median")
                record(shape, backend_name, ms, note="autograd.grad, retained graph")
                del out
            except Exception as e:  # noqa: BLE001 (a peer that cannot run this shape is a result too)
                rows.append(dict(shape=name, variant=backend_name, error=repr(e)[:300]))
                print(rows[-1], flush=True)

    # 2. Ours: wait for the background compiles (a failed one is reported; its variant then compiles
    # in this process and fails or runs there).
    for fut in futures:
        job, rc, err = fut.result()
        if rc:
            failures.append(f"precompile {job} rc={rc}: {err}")
    pool.shutdown()
    print(f"compiles done at {time.time() - t0:.0f} s", flush=True)

    refs = {}
    # Passes: the two defaults first (never skipped for the budget), then the candidates; within each,
    # the deterministic grid before the atomic path (new code last).
    passes = [(False, True), (True, True), (False, False), (True, False)]     # (atomic, default)
    for pass_atomic, pass_default in passes:
        for shape in todo:
            name, _, _, _, hd, causal = shape
            for variant, atomic_dq, config in variants(hd):
                if atomic_dq != pass_atomic or (config is None) != pass_default or not want(variant):
                    continue
                if not pass_default and over_budget(f"{name}/{variant}"):
                    continue
                fn = lambda: run_ours(state[name], causal, atomic_dq, config)  # noqa: E731
                try:
                    grads = fn()
                    torch.cuda.synchronize()
                    if variant == "det-default":
                        refs[name] = grads
                    err = max(rel_err(g, r) for g, r in zip(grads, refs[name]))
                    if not err < 1e-2:         # bf16 rounding of the outputs: ~3e-3 between two paths
                        failures.append(f"{name} {variant}: WRONG, max rel err of dq/dk/dv {err:.2e}")
                        rows.append(dict(shape=name, variant=variant, error=f"WRONG rel err {err:.2e}"))
                        print(rows[-1], flush=True)
                        continue
                    del grads
                    record(shape, variant, do_bench_cudagraph(fn, rep=20, return_mode="median"), err=err)
                except Exception as e:  # noqa: BLE001
                    failures.append(f"{name} {variant}: {e!r}"[:300])
                    print(failures[-1], flush=True)

    # 3. One table.
    timed = [r for r in rows if "us" in r]
    peer = {(r["shape"], r["variant"]): r["us"] for r in timed}
    print(f"\n{'variant':34s} {'shape':20s} {'us':>9s} {'TFLOP/s':>8s} {'%ceil':>6s} "
          f"{'vsFlex':>7s} {'vsFA2':>7s} {'vsCuDNN':>7s}")
    for r in timed:
        ratios = []
        for p in ("flex", "sdpa-flash", "sdpa-cudnn"):
            us = peer.get((r["shape"], p))
            r[f"vs_{p}"] = us / r["us"] if us else None     # > 1: faster than the peer
            ratios.append(f"{us / r['us']:7.2f}" if us else f"{'-':>7s}")
        print(f"{r['variant']:34s} {r['shape']:20s} {r['us']:9.1f} {r['tflops']:8.1f} {r['pct_ceiling']:6.1f} "
              + " ".join(ratios))
    for f in failures:
        print("FAIL", f)
    if skipped:
        print(f"skipped past the {args.budget:.0f} s budget: {', '.join(skipped)}")
    print(f"total {time.time() - t0:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), ceilings=ceil, rows=rows, failures=failures,
                           skipped=skipped, atomic_dq_default=flash_bwd.ATOMIC_DQ), f, indent=1)


if __name__ == "__main__":
    main()
