"""Tune flashfuse's GroupNorm + SiLU (issue 5) on a GPU: old vs new launch plans x SD shapes x layouts.

    PYTHONPATH=src python benchmarks/tune_group_norm.py --out DIR [--only REGEX]

Variants are module knobs of ``flashfuse.ops.group_norm`` (no code edits):
    legacy          ONE_TILE / LOOP / SPLIT, one program per group (CHUNKED off in both layouts)
    legacy-fwd      the same with the second pass walking its tiles forwards (before session 10)
    legacy-evict    legacy with evict_first on the second pass's loads and stores
    chunked         CHUNKED in both layouts, the whole tensor in one wave, kernel 3 backwards (the default)
    chunked-fwd     CHUNKED with kernel 3 walking its tiles forwards (before session 10)
    chunked-evict   chunked with evict_first on kernel 3's loads and stores
    chunked-fwd-evict  chunked-fwd with evict_first
    chunked-waves24 CHUNKED in waves of 24 MB of input (the re-read meant to hit L2; measured slower)
    chunked-st2     CHUNKED, tile loops software-pipelined over 2 stages (tl.range num_stages; 3 is the default)
    chunked-pps2    CHUNKED, 2 programs per SM (fewer, longer chunks; fewer partials)
    default         the module's settings as shipped (on sm_90 with triton 3.6 the Gluon forward where
                    group_norm_details/_hopper_fwd.eligible says; CHUNKED where _use_chunked says, else ONE_TILE /
                    LOOP / SPLIT)
    default-triton  the same without the Gluon forward (HOPPER_FWD off: the Triton plans only)
    eager           PyTorch F.silu(F.group_norm(x)) (the peer)
    compile         torch.compile of the same (forward only: its backward through autograd is not graph-safe
                    in this script)
Forward rows time ``group_norm_forward``; fwd+bwd rows time ``group_norm_forward`` + ``group_norm_backward``
(the launchers, not autograd) inside one CUDA graph (``triton.testing.do_bench_cudagraph``); the eager
fwd+bwd peer runs through autograd with do_bench (no graph). Every variant is checked against fp32 eager
first (rel err of y and dx); a wrong one is printed as WRONG and not timed. Bytes: fwd reads x and writes y
(2 tensors), fwd+bwd adds x and dy read and dx written (5). % of the bench's copy ceiling
(``measure_ceilings``). Rows print as measured; the new (CHUNKED) variants run last, after every old and peer
row (an illegal address would poison the CUDA context for everything after it). The run stops adding rows
after BUDGET_S seconds.
"""

import argparse
import json
import os
import re
import sys
import time

import torch
import torch.nn.functional as F
import triton

import flashfuse.ops.group_norm as gn

BUDGET_S = float(os.environ.get("TUNE_BUDGET_S", 100))
SHAPES = [(2, 320, 64, 64), (2, 640, 32, 32), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64),
          (16, 1280, 32, 32)]
KNOBS = ("CHUNKED_CHANNELS_LAST", "CL_PER_GROUP_MAX_BYTES", "CHUNKED_NCHW", "CHUNKED_NCHW_MIN_GROUP",
         "WAVE_BYTES", "CHUNK_STAGES", "CHUNK_PROGRAMS_PER_SM", "CHUNK_FIT_WAVE", "REVERSE_SECOND_PASS", "SECOND_PASS_EVICT",
         "HOPPER_FWD")
DEFAULTS = {k: getattr(gn, k) for k in KNOBS}
ON = dict(CHUNKED_CHANNELS_LAST=True, CL_PER_GROUP_MAX_BYTES=0, CHUNKED_NCHW=True, CHUNKED_NCHW_MIN_GROUP=0)
LEGACY = dict(CHUNKED_CHANNELS_LAST=False, CHUNKED_NCHW=False)
VARIANTS = {   # in run order: peers and old first, new last
    "eager": None,
    "compile": None,
    "legacy-fwd": dict(LEGACY, REVERSE_SECOND_PASS=False),
    "legacy": dict(LEGACY),
    "legacy-evict": dict(LEGACY, SECOND_PASS_EVICT="evict_first"),
    "chunked-fwd": dict(ON, REVERSE_SECOND_PASS=False),
    "chunked": dict(ON),
    "chunked-evict": dict(ON, SECOND_PASS_EVICT="evict_first"),
    "chunked-fwd-evict": dict(ON, REVERSE_SECOND_PASS=False, SECOND_PASS_EVICT="evict_first"),
    "chunked-waves24": dict(ON, WAVE_BYTES=24 << 20),
    "chunked-st2": dict(ON, CHUNK_STAGES=2),
    "chunked-pps2": dict(ON, CHUNK_PROGRAMS_PER_SM=2),
    "default-nofit": dict(CHUNK_FIT_WAVE=False),
    "default-triton": dict(HOPPER_FWD=False),
    "default": {},
}
GROUPS, DTYPE, EPS = 32, torch.bfloat16, 1e-5


def set_variant(name):
    for k, v in {**DEFAULTS, **(VARIANTS.get(name) or {})}.items():
        setattr(gn, k, v)
    gn.chunk_plan.cache_clear()


def inputs(shape, layout):
    x = torch.randn(shape, device="cuda", dtype=DTYPE)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).to(DTYPE)
    b = (0.1 * torch.randn(c, device="cuda")).to(DTYPE)
    dy = torch.randn_like(x)
    return x, w, b, dy


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(x, w, b, dy):
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    y = F.silu(F.group_norm(xr, GROUPS, wr, br, EPS))
    dx, = torch.autograd.grad(y, (xr,), dy.float())
    return y.detach(), dx


_COMPILED = {}


def make_run(variant, mode, x, w, b, dy):
    """(callable to time, outputs to check (y, dx or None), use the CUDA graph)."""
    if variant in ("eager", "compile"):
        if variant == "compile":
            key = (tuple(x.shape), x.stride())
            if key not in _COMPILED:
                _COMPILED[key] = torch.compile(lambda x, w, b: F.silu(F.group_norm(x, GROUPS, w, b, EPS)),
                                               dynamic=False)
            f = _COMPILED[key]
        else:
            def f(x, w, b):
                return F.silu(F.group_norm(x, GROUPS, w, b, EPS))
        if mode == "fwd":
            return (lambda: f(x, w, b)), (f(x, w, b), None), True
        xg = x.detach().requires_grad_()
        y = f(xg, w, b)
        dx, = torch.autograd.grad(y, (xg,), dy)
        return (lambda: torch.autograd.grad(f(xg, w, b), (xg,), dy)), (y, dx), False

    def fwd():
        return gn.group_norm_forward(x, GROUPS, w, b, EPS, "silu")

    def fwd_bwd():
        y, mean, rstd = fwd()
        return y, gn.group_norm_backward(dy, x, GROUPS, w, b, mean, rstd, "silu")[0]

    y, dx = fwd_bwd()
    return (fwd if mode == "fwd" else fwd_bwd), (y, dx if mode != "fwd" else None), True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default=None, help="regex over 'variant mode shape layout'")
    args = ap.parse_args()
    t0 = time.time()
    from flashfuse.bench.harness import measure_ceilings
    ceiling = measure_ceilings("cuda")["copy_GBps"]
    print(f"copy ceiling {ceiling:.0f} GB/s ({torch.cuda.get_device_name()})", flush=True)
    data = {}
    for shape in SHAPES:
        for layout in ("nchw", "cl"):
            x, w, b, dy = inputs(shape, layout)
            data[(shape, layout)] = (x, w, b, dy, *reference(x, w, b, dy))
    rows, skipped = [], []
    for variant in VARIANTS:
        for (shape, layout), (x, w, b, dy, y_ref, dx_ref) in data.items():
            for mode in ("fwd", "fwd+bwd"):
                if variant == "compile" and mode != "fwd":
                    continue
                tag = f"{variant:13s} {mode:7s} {'x'.join(map(str, shape)):16s} {layout}"
                if args.only and not re.search(args.only, tag):
                    continue
                if time.time() - t0 > BUDGET_S:
                    skipped.append(tag)
                    continue
                set_variant(variant)
                try:
                    run, (y, dx), graph = make_run(variant, mode, x, w, b, dy)
                    err = rel(y, y_ref) if dx is None else max(rel(y, y_ref), rel(dx, dx_ref))
                except Exception as e:   # a compile failure of one variant: report, go on
                    print(f"{tag} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                    rows.append(dict(variant=variant, mode=mode, shape=list(shape), layout=layout, error=str(e)))
                    continue
                if not err < 2e-2:
                    print(f"{tag} WRONG rel err {err:.2e}", flush=True)
                    rows.append(dict(variant=variant, mode=mode, shape=list(shape), layout=layout, rel_err=err,
                                     wrong=True))
                    continue
                t = triton.testing.do_bench_cudagraph(run, rep=20) if graph else triton.testing.do_bench(run)
                nbytes = x.numel() * x.element_size() * (2 if mode == "fwd" else 5)
                gbps = nbytes / t / 1e6
                rows.append(dict(variant=variant, mode=mode, shape=list(shape), layout=layout, ms=t, gbps=gbps,
                                 pct_ceiling=100 * gbps / ceiling, rel_err=err, graph=graph))
                print(f"{tag} {t * 1e3:9.1f} us {gbps:7.0f} GB/s {100 * gbps / ceiling:5.1f}%", flush=True)
    set_variant(None)   # the module defaults (CHUNKED for channels_last: its rows are "chunked" ... "cl")
    eager = {(r["mode"], tuple(r["shape"]), r["layout"]): r["ms"] for r in rows
             if r["variant"] == "eager" and "ms" in r}
    print(f"\n=== group_norm + silu, bf16, 32 groups, % of copy ceiling {ceiling:.0f} GB/s, "
          f"{time.time() - t0:.0f} s ===")
    print(f"{'variant':13s} {'mode':7s} {'shape':16s} {'layout':6s} {'us':>9s} {'GB/s':>7s} {'%copy':>6s} "
          f"{'vs eager':>8s}")
    for r in rows:
        head = f"{r['variant']:13s} {r['mode']:7s} {'x'.join(map(str, r['shape'])):16s} {r['layout']:6s}"
        if "ms" not in r:
            print(f"{head} {'WRONG' if r.get('wrong') else 'ERROR':>9s}")
            continue
        peer = eager.get((r["mode"], tuple(r["shape"]), r["layout"]))
        speed = f"{peer / r['ms']:7.2f}x" if peer else "       -"
        print(f"{head} {r['ms'] * 1e3:9.1f} {r['gbps']:7.0f} {r['pct_ceiling']:6.1f} {speed}")
    for s in skipped:
        print(f"{s}  (not run: over the {BUDGET_S:.0f} s budget)")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "tune_group_norm.json"), "w") as fh:
            json.dump(dict(ceiling_gbps=ceiling, device=torch.cuda.get_device_name(), rows=rows,
                           skipped=skipped, defaults=DEFAULTS), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
