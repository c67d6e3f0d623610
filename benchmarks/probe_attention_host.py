"""Host time of one attention call: the Python and launches before the GPU runs it (GPU machine only).

    PYTHONPATH=src python benchmarks/probe_attention_host.py [--json OUT.json] [--profile]

Short calls are bound by it: in `flashfuse bench attention` any host time past do_bench's L2 flush lands in the
timed window (benchmarks/NOTES.md, session 23). Times the wall clock of each call after a synchronize (the GPU idle),
median over repetitions, in rounds that alternate the variants below, since this host's speed drifts by up to 2x:
  flashfuse           flash_attn_func: forward with grad, and torch.autograd.grad of it;
  flashfuse-wrapper   the same through triton's descriptor wrapper (EncodedLaunch off: every descriptor encoded
                      on every launch);
  flashfuse-launchers flash_attn_forward / flash_attn_backward called directly (no autograd, no argument checks);
  cudnn               torch SDPA's cuDNN backend, the same shapes (B, H, S, D).
--profile adds cProfile's top functions by own time for flashfuse's forward and backward.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashfuse import flash_attn_func
from flashfuse.ops import _triton
from flashfuse.ops.attention import flash_bwd, flash_bwd_hopper, flash_bwd_preprocess, flash_fwd, flash_fwd_hopper

CASES = [(128, 16, True), (128, 16, False), (64, 32, True)]      # head dim, heads, causal; 16384 tokens at S = 512


def host_us(fn, reps):
    """Median and minimum wall time of fn() in us, each call started on an idle GPU."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6, min(times) * 1e6


def fresh_plans():
    for module, name in ((flash_fwd_hopper, "_PLANS"), (flash_bwd_hopper, "_PLANS"),
                         (flash_bwd_preprocess, "_PREPROCESS_PLANS")):
        setattr(module, name, _triton.PlanCache())


def calls(variant, headdim, heads, causal, seqlen=512):
    q, k, v = (torch.randn(16384 // seqlen, seqlen, heads, headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn_like(q)
    if variant == "cudnn":
        qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        gt = grad.transpose(1, 2).contiguous()
        return (lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                lambda: torch.autograd.grad(out, (qt, kt, vt), gt, retain_graph=True))
    if variant == "flashfuse-launchers":
        scale, right = headdim ** -0.5, 0 if causal else -1
        out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=right)
        return (lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=right),
                lambda: flash_bwd.flash_attn_backward(grad, q, k, v, out, lse, softmax_scale=scale, window_right=right))
    out = flash_attn_func(q, k, v, causal=causal)
    return (lambda: flash_attn_func(q, k, v, causal=causal),
            lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))


def measure(variant, headdim, heads, causal, reps):
    encoded_of = _triton.EncodedLaunch.of
    if variant == "flashfuse-wrapper":
        _triton.EncodedLaunch.of = classmethod(lambda cls, *args: None)
    try:
        fresh_plans()
        fwd, bwd = calls(variant, headdim, heads, causal)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for fn in (fwd, bwd):
                for _ in range(10):
                    fn()
            return host_us(fwd, reps), host_us(bwd, reps)
    finally:
        _triton.EncodedLaunch.of = encoded_of


def profile(fn, reps=300, top=30):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    variants = ["flashfuse", "flashfuse-wrapper", "flashfuse-launchers", "cudnn"]
    results = {}
    for round_ in range(args.rounds):
        for case in CASES:
            for variant in variants:
                (fwd, fwd_min), (bwd, bwd_min) = measure(variant, *case, args.reps)
                results.setdefault(f"hd{case[0]} {'causal' if case[2] else 'full'} {variant}", []).append(
                    dict(fwd=fwd, fwd_min=fwd_min, bwd=bwd, bwd_min=bwd_min))
                print(f"round {round_} hd{case[0]} causal={case[2]} {variant:20s} fwd {fwd:6.1f} us "
                      f"(min {fwd_min:6.1f})  bwd {bwd:6.1f} us (min {bwd_min:6.1f})", flush=True)
    print("\nhost time per call, us: median over rounds of each round's median (S = 512, 16384 tokens, bf16)")
    print(f"{'case':40s} {'fwd':>7s} {'bwd':>7s}")
    for name, rows in results.items():
        print(f"{name:40s} {statistics.median(r['fwd'] for r in rows):7.1f} "
              f"{statistics.median(r['bwd'] for r in rows):7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)
    if args.profile:
        fresh_plans()
        fwd, bwd = calls("flashfuse", 128, 16, True)
        for fn in (fwd, bwd):
            for _ in range(10):
                fn()
        print("\n== cProfile, flash_attn_func forward with grad (hd128 causal S=512), by own time ==")
        print(profile(fwd))
        print("\n== cProfile, its backward (torch.autograd.grad) ==")
        print(profile(bwd))


if __name__ == "__main__":
    main()
