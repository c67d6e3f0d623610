"""Sweep flashfuse's epilogue-fused matmul configs on one GPU against cuBLAS (+ a separate activation).

    PYTHONPATH=src python benchmarks/tune_matmul.py --out DIR [--budget 100] [--only gelu,swiglu,gemm]

Cases (bf16):
- gelu:   linear + GELU(tanh) + bias, x 4096 x 4096, W 16384 x 4096 (the `flashfuse bench llm` linear_gelu row);
- swiglu: SwiGLU over a fused gate_up weight, x 8192 x 4096, W 28672 x 4096 -> 8192 x 14336;
- gemm:   plain 8192^3 (no bias, no activation): how far the mainloop alone is from cuBLAS.
Every config of the kernel's autotune list for the case runs explicitly (``config=``), plus knob variants
(FAST_MATH off: libdevice tanh / exp sigmoid; GROUP_M 16), then the public autotuned call, the peers
(torch.matmul, F.linear + eager activation, cuBLASLt's fused GELU epilogue ``torch._addmm_activation`` =
what torch.compile emits for addmm + gelu) and, for gelu, forward + backward. Each result is checked
against an fp32 reference (relative error, fails loudly at the end). Timing: CUDA-graph replays
(``triton.testing.do_bench_cudagraph``). Compiles dominate the run time: a budget (seconds) stops the
config sweep early and says what it skipped. One table last; JSON to DIR/tune_matmul.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench_cudagraph

from flashfuse.ops import matmul as ops
from flashfuse.ops.matmul_details import _kernels as K

DT = torch.bfloat16
TOL = 1e-2  # bf16 output: one rounding (~2e-3) plus fp32-accumulation order; a wrong tile is O(1)


def bench(fn) -> float:
    """ms per call, CUDA-graph replays (the GPU host is slow: eager launches would time the host)."""
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=30)


def rel_err(out, ref) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def copy_ceiling_gbps() -> float:
    # The bench's own ceiling (fp32 copy of 1 GiB): a uint8 copy_ runs at ~2.7 TB/s on an H200, not 4.2.
    from flashfuse.bench.harness import measure_ceilings
    return measure_ceilings("cuda")["copy_GBps"]


def cfg_name(c: dict) -> str:
    s = f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} w{c['num_warps']} s{c['num_stages']}"
    s += " ws" if c.get("WARP_SPECIALIZE") else (" split" if c.get("EPILOGUE_SPLIT") else "")
    return s + (f" g{c['GROUP_M']}" if c["GROUP_M"] != 8 else "")


def as_dict(c: triton.Config) -> dict:
    return dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)


def make_case(name: str):
    """(inputs, our call taking config=, reference fp32 output, peers {name: fn}, flop, configs)."""
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(DT)

    if name == "gelu":
        M, Kd, N = 4096, 4096, 16384
        x, w, b = randn(M, Kd), randn(N, Kd, scale=Kd ** -0.5), randn(N, scale=0.1)
        ours = lambda config: K.linear_forward(x, w, b, activation=2, config=config)[0]  # noqa: E731
        public = lambda: ops.linear(x, w, b, "gelu_tanh")  # noqa: E731
        ref = lambda: F.gelu(F.linear(x.float(), w.float(), b.float()), approximate="tanh")  # noqa: E731
        peers = {"torch.matmul (no bias/act)": lambda: x @ w.t(),
                 "F.linear + eager gelu_tanh": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
                 "cublasLt addmm+gelu epilogue": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)}
        return ours, public, ref, peers, 2.0 * M * N * Kd, K.configs_for(DT, False, False), (x, w, b)
    if name == "swiglu":
        M, Kd, N = 8192, 4096, 14336
        x, wgu = randn(M, Kd), randn(2 * N, Kd, scale=Kd ** -0.5)
        ours = lambda config: K.linear_forward(x, wgu[:N], None, activation=3, up_weight=wgu[N:],  # noqa: E731
                                               config=config)[0]
        public = lambda: ops.linear(x, wgu, None, "swiglu")  # noqa: E731

        def ref():
            gu = x.float() @ wgu.float().t()
            return F.silu(gu[:, :N]) * gu[:, N:]

        def eager():
            gu = F.linear(x, wgu)
            return F.silu(gu[:, :N]) * gu[:, N:]
        peers = {"torch.matmul gate_up (no act)": lambda: x @ wgu.t(), "F.linear + eager silu*up": eager}
        return ours, public, ref, peers, 2.0 * M * 2 * N * Kd, K.configs_for(DT, True, False), (x, wgu)
    if name == "gemm":
        M = Kd = N = 8192
        x, w = randn(M, Kd), randn(N, Kd, scale=Kd ** -0.5)
        ours = lambda config: K.linear_forward(x, w, None, activation=0, config=config)[0]  # noqa: E731
        public = lambda: ops.linear(x, w)  # noqa: E731
        ref = lambda: x.float() @ w.float().t()  # noqa: E731
        peers = {"torch.matmul": lambda: x @ w.t()}
        return ours, public, ref, peers, 2.0 * M * N * Kd, K.configs_for(DT, False, False), (x, w)
    raise ValueError(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=70.0, help="seconds; the config sweep stops past it")
    ap.add_argument("--only", default="gelu,swiglu,gemm")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    rows, failures, skipped = [], [], []
    copy = copy_ceiling_gbps()
    print(f"copy ceiling {copy:.0f} GB/s ({torch.cuda.get_device_name()}, triton {triton.__version__}, "
          f"torch {torch.__version__})", flush=True)
    peak = None

    def record(case, variant, fn, flop, ref_out=None, extra=None, check=True):
        try:
            out = fn()
            err = rel_err(out, ref_out) if ref_out is not None else None
            ms = bench(fn)
        except Exception as e:  # a config that does not compile / launch: say so, keep sweeping
            rows.append(dict(case=case, variant=variant, error=f"{type(e).__name__}: {str(e)[:300]}"))
            failures.append(f"{case} {variant}: {type(e).__name__}")
            print(f"  {case:7s} {variant:40s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
            return None
        row = dict(case=case, variant=variant, ms=ms, tflops=flop / ms / 1e9, rel_err=err, **(extra or {}))
        if check and err is not None and not err < TOL:
            failures.append(f"{case} {variant}: rel_err {err:.3g} >= {TOL}")
        rows.append(row)
        print(f"  {case:7s} {variant:40s} {ms * 1e3:8.1f} us {row['tflops']:6.0f} TFLOP/s"
              + (f"  err {err:.1e}" if err is not None else ""), flush=True)
        return row

    for case in args.only.split(","):
        ours, public, ref, peers, flop, configs, keep = make_case(case)
        ref_out = ref()
        for pname, fn in peers.items():
            # peers without the bias / activation are timed, not checked; cuBLASLt's GELU is reported only
            r = record(case, "peer: " + pname, fn, flop, None if "(no" in pname else ref_out, check=False)
            if pname == "torch.matmul" and r is not None:
                peak = r["tflops"]
        variants = [(cfg_name(as_dict(c)), as_dict(c), True) for c in configs]
        best = variants[0][1]
        # knobs on the predicted-best config: the accurate activation forms, a wider L2 group
        variants += [(variants[0][0] + " FAST_MATH=0", best, False),
                     (variants[0][0] + " GROUP_M=16", dict(best, GROUP_M=16), True)]
        if case == "gemm":
            variants = variants[:4]  # same kernel family as gelu: the mainloop question only
        for vname, cfg, fast in variants:
            if time.time() - t0 > args.budget:
                skipped.append(f"{case} {vname}")
                continue
            K.FAST_MATH = fast
            record(case, "ours " + vname, lambda: ours(cfg), flop, ref_out, dict(config=cfg, fast_math=fast))
            K.FAST_MATH = True
        # the public call: autotuned over the same list (what `flashfuse bench llm` times)
        r = record(case, "ours linear() autotuned", public, flop, ref_out)
        if r is not None:
            chosen = [str(v) for k, v in K._linear_tuned.cache.items()]
            r["autotune_cache"] = chosen
            print(f"  {case:7s} autotuner: {chosen[-1] if chosen else '?'}", flush=True)
        if case == "gelu":  # forward + backward, as the bench's fwd+bwd row
            x, w, b = (t.detach().requires_grad_() for t in keep)
            dy = torch.randn(x.shape[0], w.shape[0], device="cuda", dtype=DT)

            def ours_fb():
                ops.linear(x, w, b, "gelu_tanh").backward(dy)

            def eager_fb():
                F.gelu(F.linear(x, w, b), approximate="tanh").backward(dy)
            for vname, fn in (("ours linear() fwd+bwd", ours_fb), ("peer: F.linear + eager gelu fwd+bwd", eager_fb)):
                try:
                    ms = do_bench_cudagraph(fn, rep=30, grad_to_none=[x, w, b])
                    rows.append(dict(case=case, variant=vname, ms=ms, tflops=3 * flop / ms / 1e9))
                    print(f"  {case:7s} {vname:40s} {ms * 1e3:8.1f} us {3 * flop / ms / 1e9:6.0f} TFLOP/s", flush=True)
                except Exception as e:
                    rows.append(dict(case=case, variant=vname, error=f"{type(e).__name__}: {str(e)[:300]}"))
                    failures.append(f"{case} {vname}: {type(e).__name__}")
        del keep, ref_out
        torch.cuda.empty_cache()

    with open(os.path.join(args.out, "tune_matmul.json"), "w") as f:
        json.dump(dict(copy_gbps=copy, matmul_peak_tflops=peak, rows=rows, skipped=skipped, failures=failures,
                       wall_s=time.time() - t0), f, indent=1)
    print(f"\n{'case':7s} {'variant':46s} {'us':>8s} {'TFLOP/s':>8s} {'%mm':>5s} {'vs eager':>8s}  rel_err")
    for case in args.only.split(","):
        eager = [r["ms"] for r in rows if r["case"] == case and "ms" in r and "eager" in r["variant"]
                 and "fwd+bwd" not in r["variant"]]
        for r in rows:
            if r["case"] != case:
                continue
            if "ms" not in r:
                print(f"{case:7s} {r['variant'][:46]:46s} ERROR")
                continue
            pct = f"{100 * r['tflops'] / peak:5.0f}" if peak else "    -"
            vs = f"{eager[0] / r['ms']:8.3f}" if eager and "fwd+bwd" not in r["variant"] else "       -"
            err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "-"
            print(f"{case:7s} {r['variant'][:46]:46s} {r['ms'] * 1e3:8.1f} {r['tflops']:8.0f} {pct} {vs}  {err}")
    print(f"copy ceiling {copy:.0f} GB/s; %mm = % of torch.matmul 8192^3; vs eager = F.linear + eager act / "
          f"this; wall {time.time() - t0:.0f} s")
    if skipped:
        print("skipped (budget):", "; ".join(skipped))
    if failures:
        print("FAILED:", "; ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
