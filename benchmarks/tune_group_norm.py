"""Tune flashfuse's GroupNorm + SiLU (issue 5) on a GPU: launch-mode variants x SD shapes x layouts.

    PYTHONPATH=src python benchmarks/tune_group_norm.py --out DIR

Variants are module knobs of ``flashfuse.ops.group_norm`` (no code edits):
    resident      the defaults: RESIDENT, one launch, 16384 / 8192-element chunks, 1 program per SM
    res-pps2      half the chunk, 2 programs per SM (maxnreg 64; ptxas spills a little)
    res-2launch   RESIDENT chunks, but two launches (phase 1 partials, phase 2 reload): x read twice
    legacy        USE_RESIDENT = False: ONE_TILE / LOOP / SPLIT of the previous session
    eager         PyTorch F.silu(F.group_norm(x)) (the peer)
Each variant is checked against fp32 eager (rel err of y, and of dx for fwd+bwd; fails loudly), then
timed with triton.testing.do_bench_cudagraph. Bytes: fwd reads x and writes y (2 tensors), fwd+bwd adds
x and dy read and dx written (5). % is of the copy ceiling measured here (the bench's: 1 GiB fp32 copy_, read + write).
The whole run stops adding rows after BUDGET_S seconds (the table says which rows are missing).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton

import flashfuse.ops.group_norm as gn

BUDGET_S = 75.0
SHAPES = [(2, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32), (2, 640, 32, 32),
          (2, 1280, 16, 16)]
DEFAULTS = {k: getattr(gn, k) for k in ("USE_RESIDENT", "RESIDENT_SYNC", "RESIDENT_CHUNK_FWD",
                                        "RESIDENT_CHUNK_BWD", "RESIDENT_ELEMENTS_PER_WARP_FWD",
                                        "RESIDENT_ELEMENTS_PER_WARP_BWD", "RESIDENT_PROGRAMS_PER_SM")}
VARIANTS = {
    "resident": {},
    "res-pps2": dict(RESIDENT_CHUNK_FWD=8192, RESIDENT_CHUNK_BWD=4096, RESIDENT_ELEMENTS_PER_WARP_FWD=512,
                     RESIDENT_ELEMENTS_PER_WARP_BWD=256, RESIDENT_PROGRAMS_PER_SM=2),
    "res-2launch": dict(RESIDENT_SYNC=False),
    "legacy": dict(USE_RESIDENT=False),
}
# (the two-launch variant and res-pps2's backward only on the first shapes: every variant compiles its own
# kernels, seconds each on the GPU host, and the run must stay under 90 s)
MODES = {"fwd": ("resident", "res-pps2", "res-2launch", "legacy", "eager"),
         "fwd+bwd": ("resident", "res-pps2", "legacy", "eager")}
EXTRA_UNTIL = 2          # res-2launch (fwd) and res-pps2 (fwd+bwd) on SHAPES[:EXTRA_UNTIL] only
GROUPS, DTYPE = 32, torch.bfloat16


def set_variant(name):
    for k, v in {**DEFAULTS, **VARIANTS.get(name, {})}.items():
        setattr(gn, k, v)
    gn._resident_plan_cached.cache_clear()


def inputs(shape, layout):
    x = torch.randn(shape, device="cuda", dtype=DTYPE)
    if layout == "cl":
        x = x.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).to(DTYPE)
    b = (0.1 * torch.randn(c, device="cuda")).to(DTYPE)
    return x, w, b


def forward_fn(variant):
    if variant == "eager":
        return lambda x, w, b: F.silu(F.group_norm(x, GROUPS, w, b, 1e-5))
    return lambda x, w, b: gn.group_norm(x, GROUPS, w, b, 1e-5, "silu")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def reference(x, w, b, dy):
    xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
    y = F.silu(F.group_norm(xr, GROUPS, wr, br, 1e-5))
    dx, = torch.autograd.grad(y, (xr,), dy.float())
    return y, dx


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=20)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.time()
    from flashfuse.bench.harness import measure_ceilings
    ceiling = measure_ceilings("cuda")["copy_GBps"]    # the bench's (fp32 copy): uint8 copy_ runs at ~2.7 TB/s
    print(f"copy ceiling {ceiling:.0f} GB/s ({torch.cuda.get_device_name()})", flush=True)
    rows, skipped = [], []
    for i_shape, shape in enumerate(SHAPES):
        for layout in ("nchw", "cl"):
            x, w, b = inputs(shape, layout)
            dy = torch.randn_like(x)
            y_ref, dx_ref = reference(x, w, b, dy)
            for mode, variants in MODES.items():
                for variant in variants:
                    if i_shape >= EXTRA_UNTIL and (variant, mode) in (("res-2launch", "fwd"),
                                                                      ("res-pps2", "fwd+bwd")):
                        continue
                    tag = f"{variant:12s} {mode:7s} {'x'.join(map(str, shape)):16s} {layout}"
                    if time.time() - t0 > BUDGET_S:
                        skipped.append(tag)
                        continue
                    set_variant(variant)
                    f = forward_fn(variant)
                    if mode == "fwd":
                        y = f(x, w, b)
                        err = rel(y, y_ref)
                        run = lambda: f(x, w, b)  # noqa: E731
                    else:
                        xg, wg, bg = (t.detach().requires_grad_() for t in (x, w, b))
                        y = f(xg, wg, bg)
                        dx, = torch.autograd.grad(y, (xg,), dy)
                        err = max(rel(y, y_ref), rel(dx, dx_ref))

                        def run(f=f, xg=xg, wg=wg, bg=bg):
                            torch.autograd.grad(f(xg, wg, bg), (xg, wg, bg), dy)
                    if not err < 2e-2:
                        raise SystemExit(f"WRONG RESULT: {tag}: rel err {err:.2e}")
                    t = bench(run)
                    nbytes = x.numel() * x.element_size() * (2 if mode == "fwd" else 5)
                    gbps = nbytes / t / 1e6
                    rows.append(dict(variant=variant, mode=mode, shape=list(shape), layout=layout, ms=t,
                                     gbps=gbps, pct_ceiling=100 * gbps / ceiling, rel_err=err))
                    print(f"{tag} {t * 1e3:9.1f} us {gbps:7.0f} GB/s {100 * gbps / ceiling:5.1f}%", flush=True)
    set_variant("resident")
    print("\n=== group_norm + silu, bf16, 32 groups (% of copy ceiling "
          f"{ceiling:.0f} GB/s), {time.time() - t0:.0f} s ===")
    print(f"{'variant':12s} {'mode':7s} {'shape':16s} {'layout':6s} {'us':>9s} {'GB/s':>7s} {'%copy':>6s}")
    for r in rows:
        print(f"{r['variant']:12s} {r['mode']:7s} {'x'.join(map(str, r['shape'])):16s} {r['layout']:6s} "
              f"{r['ms'] * 1e3:9.1f} {r['gbps']:7.0f} {r['pct_ceiling']:6.1f}")
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
