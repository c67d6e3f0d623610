"""Sweep the launch knobs of flashfuse's LayerNorm backward and RoPE on one GPU, beside eager PyTorch and Liger.

    PYTHONPATH=src python benchmarks/tune_norm_rope.py --out DIR [--budget 85] [--only ln,rope,rms]

Cases (bf16, the `flashfuse bench llm` inputs):
- ln:   layer_norm(x, weight, bias) forward + backward (dx, dweight, dbias) at 16384 x 4096 (the issue's
        bar: >= 80% of copy bandwidth), 16384 x 8192 and 4096 x 2048; the forward alone once per shape.
        Bytes: forward reads x, writes y; backward reads x and dy, writes dx (5 x M x N x 2).
- rope: apply_rotary_pos_emb(q, k, cos, sin), HF layout (q (4, 32, 4096, 128) and k (4, 8, 4096, 128) as
        transposed views of (B, S, H, D), cos/sin (B, S, 128) bf16), forward and forward + backward (bar:
        >= 85%, Liger 91-92%). Bytes: q and k read and written once per direction.
- rms:  rms_norm forward + backward at 16384 x 4096 (shares the LayerNorm backward kernel: a regression check).
Knobs are module constants of flashfuse.ops.norm / flashfuse.ops.rope, set per variant and restored; the
first variant of each case is the shipped default. Each result is checked against an fp32 reference
(relative error of every output and gradient; failures are listed last and set the exit code). Timing:
CUDA-graph replays (``triton.testing.do_bench_cudagraph``, median), as `flashfuse bench --cuda-graph`.
A time budget (seconds) skips the remaining variants and says which. One table last; JSON to
DIR/tune_norm_rope.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench_cudagraph

import flashfuse.ops.norm as nm
import flashfuse.ops.rope as rp
from flashfuse.bench.suites.llm import _rope_inputs, _rope_tables, rope_eager

DT = torch.bfloat16
DEVICE = "cuda"
TOL = 2e-2      # bf16 outputs and gradients: one or two roundings (~4e-3); a wrong row or tile is O(1)
REP_MS = 40

# LayerNorm backward variants (flashfuse.ops.norm constants). "pre-s4" is the kernel as the last GPU run
# measured it (register prefetch of one row, 8 programs of 8 warps per SM at 4096 columns).
LN_VARIANTS = [
    ("default", {}),
    ("pre-s4", dict(BWD_STAGES=1, BWD_REG_PREFETCH=True, BWD_WARPS_PER_SM=64)),
    ("stages2", dict(BWD_STAGES=2)),
    ("stages4", dict(BWD_STAGES=4)),
    ("wps16", dict(BWD_WARPS_PER_SM=16)),          # one wave: 2 programs of 8 warps per SM at 4096
    ("wps64", dict(BWD_WARPS_PER_SM=64)),          # four waves
    ("wps64-stages4", dict(BWD_WARPS_PER_SM=64, BWD_STAGES=4)),
    ("bwd16warps", dict(BWD_ELEMENTS_PER_WARP=256)),   # 16 warps at 4096 (8 columns per thread)
    ("noprefetch", dict(BWD_STAGES=1)),
]
LN_SHAPES = [(16384, 4096), (16384, 8192), (4096, 2048)]
RMS_SHAPES = [(16384, 4096)]
# The variants worth timing at the other shapes (the budget is small).
LN_OTHER_SHAPE_VARIANTS = ("default", "pre-s4", "stages4", "wps16", "wps64")

ROPE_VARIANTS = [
    ("default", {}),
    ("tile1-grouped", dict(TILES_PER_PROGRAM=1, PREFETCH=False)),   # pre-s4 tiling, tiles of a token adjacent
    ("all-noprefetch", dict(PREFETCH=False)),
    ("tiles2", dict(TILES_PER_PROGRAM=2)),
    ("tile2048", dict(TILE_ELEMENTS=2048)),
    ("tile4096", dict(TILE_ELEMENTS=4096)),        # Liger's shape of work: [32 heads, 128] per tensor
    ("tile4096-w4", dict(TILE_ELEMENTS=4096, WARPS_PER_1K=1)),   # 4 warps per tile, as Liger's program
    ("w2per1k", dict(WARPS_PER_1K=2)),
    ("w8per1k", dict(WARPS_PER_1K=8)),
]
ROPE_SHAPE = dict(B=4, S=4096, Hq=32, Hk=8, D=128)


@contextlib.contextmanager
def knobs(module, values: dict):
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def bench(fn) -> float:
    """ms per call, median of CUDA-graph replays (the GPU host is slow: eager launches would time it)."""
    fn()
    torch.cuda.synchronize()
    return float(do_bench_cudagraph(fn, rep=REP_MS, return_mode="median"))


def rel_err(out, ref) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref.float()).norm() / ref.float().norm()).item()


def copy_ceiling_gbps() -> float:
    # The bench's own ceiling (fp32 copy of 1 GiB): a uint8 copy_ runs at ~2.7 TB/s on an H200, not 4.2.
    from flashfuse.bench.harness import measure_ceilings
    return measure_ceilings(DEVICE)["copy_GBps"]


def fwd_bwd(fn, leaves, douts):
    """One forward + the gradients of every leaf (what the harness times in the fwd+bwd mode)."""
    def run():
        outs = fn()
        return torch.autograd.grad(outs if isinstance(outs, tuple) else (outs,), leaves, douts)
    return run


def liger_functional():
    try:
        import liger_kernel.transformers.functional as lf
        return lf
    except ImportError as exc:
        print(f"liger-kernel not importable ({exc}): no Liger rows", flush=True)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=85.0, help="seconds; later variants are skipped past it")
    ap.add_argument("--only", default="ln,rope,rms", help="comma list of cases: ln, rope, rms")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(","))
    t_start = time.perf_counter()
    torch.manual_seed(0)
    copy = copy_ceiling_gbps()
    print(f"copy ceiling {copy:.0f} GB/s ({torch.cuda.get_device_name()}, triton {triton.__version__}, "
          f"torch {torch.__version__})", flush=True)
    lf = liger_functional()
    rows, failures, skipped = [], [], []

    def over_budget() -> bool:
        return time.perf_counter() - t_start > args.budget

    def record(case, shape, mode, variant, fn, nbytes, outs=None, refs=None):
        name = f"{case} {shape} {mode} {variant}"
        if over_budget():
            skipped.append(name)
            return
        err = None
        try:
            if refs is not None:
                got = outs()
                err = max(rel_err(o, r) for o, r in zip(got, refs))
                if not err < TOL:
                    failures.append(f"{name}: rel err {err:.2e} >= {TOL}")
            ms = bench(fn)
        except Exception as exc:  # a variant that fails to compile or run is reported, not fatal
            failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"FAIL {name}: {exc}", flush=True)
            return
        gbps = nbytes / ms / 1e6
        row = dict(case=case, shape=shape, mode=mode, variant=variant, us=ms * 1e3, gbps=gbps,
                   pct_copy=100 * gbps / copy, rel_err=err)
        rows.append(row)
        print(f"{name:60s} {ms * 1e3:8.1f} us {gbps:7.0f} GB/s {row['pct_copy']:5.1f}%"
              + ("" if err is None else f"  err {err:.1e}"), flush=True)

    # ---------------------------------------------------------------------------------------------
    def norm_cases(case, shapes, names=None):
        """names: the LN_VARIANTS to time (None: all)."""
        is_ln = case == "ln"
        for M, N in shapes:
            shape = f"{M}x{N}"
            x = torch.randn(M, N, device=DEVICE, dtype=DT, requires_grad=True)
            w = (1 + 0.1 * torch.randn(N, device=DEVICE)).to(DT).requires_grad_()
            b = (0.1 * torch.randn(N, device=DEVICE)).to(DT).requires_grad_() if is_ln else None
            leaves = (x, w, b) if is_ln else (x, w)
            dy = torch.randn(M, N, device=DEVICE, dtype=DT)
            ref_leaves = [t.detach().float().requires_grad_() for t in leaves]
            if is_ln:
                ref_y = F.layer_norm(ref_leaves[0], (N,), ref_leaves[1], ref_leaves[2], 1e-5)
            else:
                xf = ref_leaves[0]
                ref_y = ref_leaves[1] * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DT).float()
            refs = (ref_y.detach(),) + torch.autograd.grad(ref_y, ref_leaves, dy.float())
            del ref_leaves, ref_y

            def ours():
                return nm.layer_norm(x, w, b, 1e-5) if is_ln else nm.rms_norm(x, w, 1e-6)

            def checked():
                y = ours()
                return (y.detach(),) + torch.autograd.grad(y, leaves, dy)
            nbytes_fb = 5 * M * N * x.element_size()
            variants = [v for v in LN_VARIANTS if names is None or v[0] in names]
            for variant, values in variants:
                with knobs(nm, values):
                    record(case, shape, "fwd+bwd", variant, fwd_bwd(ours, leaves, (dy,)), nbytes_fb, checked, refs)
            with torch.no_grad():
                record(case, shape, "fwd", "default", ours, 2 * M * N * x.element_size())
            if is_ln:
                eager = lambda: F.layer_norm(x, (N,), w, b, 1e-5)  # noqa: E731
                record(case, shape, "fwd+bwd", "eager", fwd_bwd(eager, leaves, (dy,)), nbytes_fb)
                if lf is not None:
                    liger = lambda: lf.liger_layer_norm(x, w, b, 1e-5)  # noqa: E731
                    record(case, shape, "fwd+bwd", "liger", fwd_bwd(liger, leaves, (dy,)), nbytes_fb)
            elif lf is not None:
                liger = lambda: lf.liger_rms_norm(x, w, 1e-6, in_place=False)  # noqa: E731
                record(case, shape, "fwd+bwd", "liger", fwd_bwd(liger, leaves, (dy,)), nbytes_fb)
            del x, w, b, dy, leaves, refs
            torch.cuda.empty_cache()

    def rope_case():
        p = ROPE_SHAPE
        shape = f"{p['B']}x{p['S']}x{p['Hq']}x{p['Hk']}x{p['D']}"
        q, k, pos = _rope_inputs(p, DT, DEVICE)
        q, k, cos, sin = _rope_tables(q, k, pos)
        q.requires_grad_(True)
        k.requires_grad_(True)
        dq, dk = torch.randn_like(q), torch.randn_like(k)
        ref_in = [t.detach().float().requires_grad_() for t in (q, k)]
        ref_q, ref_k = rope_eager(*ref_in, cos.float(), sin.float())
        refs_fwd = (ref_q.detach(), ref_k.detach())
        refs_fb = refs_fwd + torch.autograd.grad((ref_q, ref_k), ref_in, (dq.float(), dk.float()))
        del ref_in, ref_q, ref_k
        numel = q.numel() + k.numel()

        def ours():
            return rp.apply_rotary_pos_emb(q, k, cos, sin)

        def checked_fwd():
            with torch.no_grad():
                return ours()

        def checked_fb():
            qo, ko = ours()
            return (qo.detach(), ko.detach()) + torch.autograd.grad((qo, ko), (q, k), (dq, dk))
        for variant, values in ROPE_VARIANTS:
            with knobs(rp, values):
                with torch.no_grad():
                    record("rope", shape, "fwd", variant, ours, 2 * numel * q.element_size(), checked_fwd, refs_fwd)
                record("rope", shape, "fwd+bwd", variant, fwd_bwd(ours, (q, k), (dq, dk)),
                       4 * numel * q.element_size(), checked_fb, refs_fb)
        eager = lambda: rope_eager(q, k, cos, sin)  # noqa: E731
        with torch.no_grad():
            record("rope", shape, "fwd", "eager", eager, 2 * numel * q.element_size())
        if lf is not None:
            # Last: Liger rotates q and k (and dq, dk in its backward) in place, in their (B, S, H, D)
            # storage, as in `flashfuse bench llm`; the values drift, the timing does not.
            liger = lambda: lf.liger_rope(q, k, cos, sin)  # noqa: E731
            with torch.no_grad():
                record("rope", shape, "fwd", "liger", liger, 2 * numel * q.element_size())
            record("rope", shape, "fwd+bwd", "liger", fwd_bwd(liger, (q, k), (dq, dk)),
                   4 * numel * q.element_size())

    if "ln" in only:
        norm_cases("ln", LN_SHAPES[:1])
    if "rope" in only:
        rope_case()
    if "rms" in only:
        norm_cases("rms", RMS_SHAPES, ("default", "pre-s4"))
    if "ln" in only:
        norm_cases("ln", LN_SHAPES[1:], LN_OTHER_SHAPE_VARIANTS)

    wall = time.perf_counter() - t_start
    with open(os.path.join(args.out, "tune_norm_rope.json"), "w") as f:
        json.dump(dict(copy_gbps=copy, device=torch.cuda.get_device_name(), triton=triton.__version__,
                       torch=torch.__version__, rows=rows, failures=failures, skipped=skipped, wall_s=wall,
                       ln_knobs={k: getattr(nm, k) for k in ("BWD_STAGES", "BWD_REG_PREFETCH",
                                                             "BWD_WARPS_PER_SM", "BWD_ELEMENTS_PER_WARP")},
                       rope_knobs={k: getattr(rp, k) for k in ("TILE_ELEMENTS", "WARPS_PER_1K",
                                                               "TILES_PER_PROGRAM", "PREFETCH")}), f, indent=1)
    print(f"\ncopy ceiling {copy:.0f} GB/s; {wall:.0f} s; % = of the copy ceiling")
    print(f"{'case':5s} {'shape':22s} {'mode':18s} {'variant':16s} {'us':>8s} {'GB/s':>6s} {'%':>5s}")
    for r in rows:
        print(f"{r['case']:5s} {r['shape']:22s} {r['mode']:18s} {r['variant']:16s} {r['us']:8.1f} "
              f"{r['gbps']:6.0f} {r['pct_copy']:5.1f}")
    if skipped:
        print(f"skipped (budget {args.budget:.0f} s): " + "; ".join(skipped))
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
