"""FlashAttention forward at the diffusion models' shapes, beside cuDNN SDPA: sweep the launch plan.

    PYTHONPATH=src python benchmarks/tune_attention_small.py --out DIR        (H200, < 90 s)

Shapes: DiT-XL/2 self-attention (batch 32, 16 heads, head dim 72, 256 tokens), SD-1.5's UNet at 64x64
latents with CFG (batch 2, 8 heads; head dims 40 / 80 / 160 at 4096 / 1024 / 256 tokens and 64 at the
middle block; cross-attention to 77 text tokens), and two long-sequence guards (head dim 64 / 128,
batch 4, 32 heads, 4096 tokens) whose configs are tuned (benchmarks/NOTES.md) and must not regress.

Variants of ours (flash-attn layout (B, S, H, D), the launcher timed alone, as the profiler saw it):
- ``old``: the plan before this sweep: the head dim padded to a power of two, no 16-byte alignment
  hints (loads of head dims 40 / 72 were single 2-byte elements), the old tile table;
- ``pad``: today's table and alignment hints, the head dim padded (SPLIT_HEAD_DIM = False);
- ``default``: what flash_fwd ships (split head dim, alignment hints, forward_config);
- ``BMxBNxWwxSs``: one candidate tile config with the split head dim.
Every variant is checked against torch SDPA's math backend in fp32 (relative error, fails loudly), then
timed with triton.testing.do_bench_cudagraph (CUDA-graph replays: no host overhead). The peer is SDPA
under the cuDNN backend on the same tensors, transposed to (B, H, S, D) views as diffusers passes them.
One table at the end: variant, shape, us, TFLOP/s (the real head dim), GB/s (q, k, v read + out written
once), % of the copy ceiling, and the ratio to cuDNN (goal: <= 1.3). JSON rows go to DIR/results.json.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

from flashfuse.ops.attention import flash_fwd

# (name, batch, seqlen_q, seqlen_k, nheads, headdim)
SHAPES = [
    ("dit-self", 32, 256, 256, 16, 72),
    ("sd-l1-self", 2, 4096, 4096, 8, 40),
    ("sd-l1-cross", 2, 4096, 77, 8, 40),
    ("sd-l2-self", 2, 1024, 1024, 8, 80),
    ("sd-l2-cross", 2, 1024, 77, 8, 80),
    ("sd-l3-self", 2, 256, 256, 8, 160),
    ("sd-l3-cross", 2, 256, 77, 8, 160),
    ("sd-mid-self", 2, 64, 64, 8, 160),
    ("sd-mid-cross", 2, 64, 77, 8, 160),
    ("guard-hd64", 4, 4096, 4096, 32, 64),
    ("guard-hd128", 4, 4096, 4096, 32, 128),
    # flash-attn's benchmark at short sequences (16384 tokens, model dim 2048; session 9): where the bench has
    # the forward at 0.98-1.3x FA2 (S = 512 / 1024), `--only bench-hd128-S512,...`
    ("bench-hd64-S512", 32, 512, 512, 32, 64),
    ("bench-hd64-S1024", 16, 1024, 1024, 32, 64),
    ("bench-hd128-S512", 32, 512, 512, 16, 128),
    ("bench-hd128-S1024", 16, 1024, 1024, 16, 128),
]


def cfg(bm, bn, w, s):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)


# Candidate tiles per shape (with the split head dim), screened offline for register spills: ptxas -v on
# the sm_90a build with triton 3.6 (.gpu/cc_fwd_small.py). The shipped default is timed separately.
CANDIDATES = {
    # dit-self 64 x 128 / 4 warps / 1 stage hit an illegal address on the H200 (sessions 4 and 9; not diagnosed,
    # no shipped config has 1 stage at 16 bits) and poisoned the CUDA context for every row after it: left out.
    "dit-self": [cfg(64, 64, 4, 2), cfg(128, 128, 8, 2), cfg(128, 64, 8, 2)],
    "sd-l1-self": [cfg(128, 128, 8, 3), cfg(64, 128, 4, 2), cfg(128, 64, 4, 3)],
    # 64 x 128 / 4 warps / 1 stage gave 43% error here (session 9; triton 3.6, sm_90): 1-stage wgmma tiles
    # are not trusted, see dit-self above.
    "sd-l1-cross": [cfg(128, 128, 8, 2), cfg(64, 64, 4, 2)],
    "sd-l2-self": [cfg(64, 128, 4, 3), cfg(128, 128, 8, 3), cfg(64, 64, 4, 3)],
    "sd-l2-cross": [cfg(128, 128, 8, 2), cfg(64, 64, 4, 2)],
    # 32 x 32: the default until session 9 at the hd-160 256-token level (half-wave small-grid rule)
    "sd-l3-self": [cfg(32, 32, 4, 2), cfg(16, 64, 4, 2), cfg(64, 32, 4, 2)],
    "sd-l3-cross": [cfg(32, 32, 4, 2), cfg(16, 64, 4, 2), cfg(64, 32, 4, 2)],
    "sd-mid-self": [cfg(32, 32, 4, 2), cfg(64, 64, 4, 2)],
    "sd-mid-cross": [cfg(32, 32, 4, 2)],
    "guard-hd64": [],
    "guard-hd128": [],
    "bench-hd64-S512": [cfg(128, 64, 8, 2), cfg(128, 128, 8, 2), cfg(64, 128, 4, 2), cfg(128, 64, 4, 2)],
    "bench-hd64-S1024": [cfg(128, 128, 8, 2), cfg(64, 128, 4, 2), cfg(128, 64, 8, 2), cfg(64, 64, 4, 3)],
    "bench-hd128-S512": [cfg(128, 128, 8, 2), cfg(128, 64, 8, 2), cfg(64, 128, 4, 2), cfg(64, 64, 4, 3)],
    "bench-hd128-S1024": [cfg(128, 64, 8, 3), cfg(128, 128, 8, 2), cfg(64, 128, 4, 2), cfg(64, 64, 4, 2)],
}


def old_config(head_dim_block, dtype, windowed, has_bias, *rest):
    """flash_fwd.forward_config before this sweep (16-bit rows; fp32 is not swept here)."""
    if head_dim_block <= 64:
        return cfg(128, 64, 8, 3)
    if head_dim_block <= 128:
        return cfg(128, 64 if windowed or has_bias else 128, 8, 3)
    return cfg(64, 32, 4, 2)


class plan:
    """Context manager: run flash_fwd with a given config function, head-dim split and vector width."""

    def __init__(self, config=None, split=True, vec_bytes=16):
        self.config, self.split, self.vec_bytes = config, split, vec_bytes

    def __enter__(self):
        self.saved = flash_fwd.forward_config, flash_fwd.SPLIT_HEAD_DIM, flash_fwd.VEC_BYTES
        if self.config is not None:
            flash_fwd.forward_config = self.config if callable(self.config) else (lambda *a, c=self.config: c)
        flash_fwd.SPLIT_HEAD_DIM, flash_fwd.VEC_BYTES = self.split, self.vec_bytes

    def __exit__(self, *exc):
        flash_fwd.forward_config, flash_fwd.SPLIT_HEAD_DIM, flash_fwd.VEC_BYTES = self.saved


def variants(name, dtype, first_pass):
    """First pass: what ships and what shipped before; second pass: padding and the candidates."""
    if first_pass:
        yield "default", plan()
        yield "old", plan(config=old_config, split=False, vec_bytes=torch.empty((), dtype=dtype).element_size())
        return
    yield "pad", plan(split=False)
    for c in CANDIDATES[name]:
        yield "{BLOCK_M}x{BLOCK_N}x{num_warps}wx{num_stages}s".format(**c), plan(config=c)


def copy_ceiling_gbps():
    """Bytes read + written per second of a 1 GiB device-to-device copy."""
    # The bench's own ceiling (fp32 copy of 1 GiB): a uint8 copy_ runs at ~2.7 TB/s on an H200, not 4.2.
    from flashfuse.bench.harness import measure_ceilings
    return measure_ceilings("cuda")["copy_GBps"]


# Attention calls of one SD-1.5 UNet forward at 64x64 latents (16 transformer blocks, each one self- and
# one cross-attention): 32 calls, the profile's total.
SD_CALLS = {"sd-l1-self": 5, "sd-l1-cross": 5, "sd-l2-self": 5, "sd-l2-cross": 5, "sd-l3-self": 5,
            "sd-l3-cross": 5, "sd-mid-self": 1, "sd-mid-cross": 1}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="directory for results.json")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--only", default=None, help="comma-separated shape names")
    ap.add_argument("--budget", type=float, default=80.0,
                    help="seconds; past it the second pass (padding, candidates) stops")
    args = ap.parse_args()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench_cudagraph

    t_start = time.time()
    dtype = getattr(torch, args.dtype)
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s ({torch.cuda.get_device_name()})", flush=True)
    rows, failures, skipped = [], [], []
    shapes = [sh for sh in SHAPES if not args.only or sh[0] in args.only.split(",")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {}
    for name, batch, seqlen_q, seqlen_k, nheads, hd in shapes:
        q = torch.randn(batch, seqlen_q, nheads, hd, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(batch, seqlen_k, nheads, hd, device="cuda", dtype=dtype, generator=gen)
                for _ in range(2))
        scale = 1.0 / math.sqrt(hd)
        with sdpa_kernel(SDPBackend.MATH):       # fp32 reference, (B, H, S, D) -> (B, S, H, D)
            ref = F.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)), scale=scale)
        state[name] = (q, k, v, scale, ref.transpose(1, 2).contiguous())
        torch.cuda.empty_cache()

    def record(name, variant, fn):
        q, k, v, _, ref = state[name]
        batch, seqlen_q, nheads, hd = q.shape
        out = fn()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        if not err < (2e-3 if q.dtype == torch.float16 else 6e-3):   # fp32 accumulation: fp16 ~3e-4, bf16 ~2.2e-3
            failures.append(f"{name} {variant}: rel err {err:.2e}")
        us = do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
        flops = 4 * batch * nheads * seqlen_q * k.shape[1] * hd
        nbytes = (2 * q.numel() + k.numel() + v.numel()) * q.element_size()   # q, k, v read, out written
        rows.append(dict(shape=name, variant=variant, us=us, tflops=flops / us * 1e-6, gbps=nbytes / us * 1e-3,
                         pct_copy=100 * nbytes / us * 1e-3 / ceiling, err=err, B=batch, Sq=seqlen_q,
                         Sk=k.shape[1], H=nheads, D=hd))
        print({key: round(val, 4) if isinstance(val, float) else val for key, val in rows[-1].items()}, flush=True)

    for first_pass in (True, False):
        for name, *_ in shapes:
            q, k, v, scale, _ = state[name]
            if first_pass:
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))              # diffusers' (B, H, S, D) views
                try:
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        record(name, "sdpa-cudnn",
                               lambda: F.scaled_dot_product_attention(qt, kt, vt, scale=scale).transpose(1, 2))
                except RuntimeError as e:    # no cuDNN attention for this shape: the row says so
                    rows.append(dict(shape=name, variant="sdpa-cudnn", error=repr(e)[:200]))
            for variant, ctx in variants(name, dtype, first_pass):
                if not first_pass and time.time() - t_start > args.budget:
                    skipped.append(f"{name}/{variant}")
                    continue
                with ctx:
                    try:
                        record(name, variant,
                               lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale)[0])
                    except Exception as e:  # noqa: BLE001 (a config that does not compile is a result too)
                        failures.append(f"{name} {variant}: {e!r}"[:300])

    timed = [r for r in rows if "us" in r]
    peers = {r["shape"]: r["us"] for r in timed if r["variant"] == "sdpa-cudnn"}
    for r in timed:
        if r["shape"] in peers:
            r["vs_cudnn"] = r["us"] / peers[r["shape"]]
    best = {}
    for r in timed:
        if r["variant"] != "sdpa-cudnn" and r["us"] < best.get(r["shape"], (1e30, ""))[0]:
            best[r["shape"]] = (r["us"], r["variant"])
    totals = {}
    if all(name in state for name in SD_CALLS):
        for variant in ("sdpa-cudnn", "default", "old"):
            us = {r["shape"]: r["us"] for r in timed if r["variant"] == variant}
            if all(name in us for name in SD_CALLS):
                totals[variant] = sum(n * us[name] for name, n in SD_CALLS.items())
        totals["best-of-ours"] = sum(n * best[name][0] for name, n in SD_CALLS.items() if name in best)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(ceiling_gbps=ceiling, dtype=args.dtype, rows=rows, sd_unet_totals_us=totals,
                           failures=failures, skipped=skipped), f, indent=1)
    print(f"\n{'variant':<16}{'shape':<14}{'us':>9}{'TFLOP/s':>9}{'GB/s':>8}{'%copy':>7}{'/cudnn':>8}")
    order = {sh[0]: i for i, sh in enumerate(SHAPES)}
    for r in sorted(rows, key=lambda r: order[r["shape"]]):      # stable: cuDNN, default, old, the rest
        if "us" not in r:
            print(f"{r['variant']:<16}{r['shape']:<14}  {r.get('error', '')}")
            continue
        mark = " *" if best.get(r["shape"], (0, ""))[1] == r["variant"] else ""
        print(f"{r['variant']:<16}{r['shape']:<14}{r['us']:9.1f}{r['tflops']:9.1f}{r['gbps']:8.0f}"
              f"{r['pct_copy']:7.1f}{r.get('vs_cudnn', float('nan')):8.2f}{mark}")
    print("SD-1.5 UNet step, 32 attention calls (us): "
          + ", ".join(f"{key} {val:.0f}" for key, val in totals.items()))
    print(f"({time.time() - t_start:.0f} s; * = fastest of ours per shape"
          + (f"; skipped past --budget: {' '.join(skipped)}" if skipped else "") + ")")
    if failures:
        print("FAILURES:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
