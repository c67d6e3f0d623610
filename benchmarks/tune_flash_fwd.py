"""FlashAttention forward at long sequences (issue 3): the pointer kernel against the fast kernel's knobs,
beside SDPA (cuDNN, flash = FA2) and compiled FlexAttention in the same run.

    PYTHONPATH=src python benchmarks/tune_flash_fwd.py --out DIR [--only REGEX] [--budget 110]

Shapes: flash-attn's benchmark (batch x seqlen = 16384 tokens, model dim 2048): head dim 64 x 32 heads and
128 x 16 heads, S = 2048 / 4096 / 8192, causal and not, bf16; ours in (B, S, H, D), the peers in (B, H, S, D),
each contiguous in its own layout. FLOPs 4 B H S^2 D, halved when causal (the anchors' convention).

Variants (labels match --only, e.g. --only 'hd128-causal-S8192/(old|tma)'):
- ``old``: the pointer kernel with forward_config (flash_fwd.FAST_FORWARD off);
- ``fast``: what ships (FAST_FORWARD on: FAST_CONFIGS's entry where the shape takes the fast kernel);
- ``tma-/split-/ptr-BMxBN-wW-sS``: one fast-kernel config: ``tma`` tensor-descriptor tiles, ``split`` two
  row halves per program (one warpgroup ping-pong), ``ptr`` the fast kernel with pointer loads (what TMA
  alone buys). Full list at S >= 4096, a short one at 2048.
Session 5 also swept warp specialization (tl.range(..., warp_specialize=True)): wrong results on the H200
(NaN at hd 64, 20% error causal at hd 128), dropped from the kernel.
Pass 1 times the peers and ``old`` on every shape; pass 2 the new variants (risky: an illegal address
poisons the CUDA context), candidate-major so a budget cut leaves whole candidates; every row is printed
as soon as it is measured. Each output is checked against SDPA's math backend in fp32 (relative error
< 1e-2; bf16 rounding gives ~3e-3): a WRONG row is reported, not timed. Timing: do_bench_cudagraph.
Last: one table (variant, shape, us, TFLOP/s, % of the bf16 matmul ceiling, ratio to cuDNN / FA2 / Flex)
and the bars (>= Flex, >= 1.5x FA2, >= cuDNN) for the best of ours; JSON rows in DIR/results.json.

Offline check (sm_90, triton 3.6, ptxas -v with launch-like divisibility): every config below compiles.
Registers at launch / spill bytes (full, causal) / shared memory:
  hd64 : tma-128x128-w8-s3 160-204/0,0/116K  tma-128x64-w8-s3 112/0,0/67K  split-128x128-w4-s2 254/0,28/83K
         tma-128x128-w8-s4 160-204/0,0/148K  split-256x128-w8-s2 254/0,132/99K  tma-128x64-w4-s3 189/0,0/67K
         ptr-128x128-w8-s3 216-249/0,0/115K
  hd128: tma-128x128-w8-s2 193-242/0,0/165K  tma-128x64-w8-s3 138-147/0,0/132K
         tma-128x128-w8-s3 193-242/0,0/230K  ptr-128x128-w8-s3 254/0,24/229K
Left out: hd128 split (364 bytes spill).
"""

import argparse
import json
import math
import os
import re
import sys
import time

import torch

from flashfuse.ops.attention import flash_fwd

HEAD_DIMS = (64, 128)
SEQLENS = (2048, 4096, 8192)
TOKENS, MODEL_DIM = 16384, 2048


def fast(kind, bm, bn, warps, stages):
    return kind, flash_fwd._fast(bm, bn, warps, stages, split=kind == "split", tma=kind != "ptr")


# Most promising first: a budget cut drops the tail of this list.
CANDIDATES = {
    64: [fast("tma", 128, 64, 8, 3), fast("split", 128, 128, 4, 2), fast("tma", 128, 128, 8, 3),
         fast("tma", 128, 128, 8, 4), fast("split", 256, 128, 8, 2), fast("tma", 128, 64, 4, 3),
         fast("ptr", 128, 128, 8, 3)],
    128: [fast("tma", 128, 128, 8, 3), fast("tma", 128, 128, 8, 2), fast("tma", 128, 64, 8, 3),
          fast("ptr", 128, 128, 8, 3)],
}
SHORT = 2            # candidates timed at S = 2048 (plus "fast")


def name_of(kind, c):
    return f"{kind}-{c['BLOCK_M']}x{c['BLOCK_N']}-w{c['num_warps']}-s{c['num_stages']}"


class use_fast:
    """Context manager: run flash_fwd's fast kernel with ``config`` (None: FAST_CONFIGS), or the old path."""

    def __init__(self, on, config=None):
        self.on, self.config = on, config

    def __enter__(self):
        self.saved = flash_fwd.FAST_FORWARD, flash_fwd.fast_forward_config, flash_fwd.GLUON_FORWARD
        flash_fwd.FAST_FORWARD = self.on
        if self.config is not None:      # this Triton config, not flash_fwd_hopper's Gluon kernel
            flash_fwd.GLUON_FORWARD = False
            flash_fwd.fast_forward_config = lambda *a, c=self.config: dict(c)
        elif self.on:                    # the table entry even where the launcher would fall back
            flash_fwd.fast_forward_config = lambda hd, causal, *a: dict(
                flash_fwd.FAST_CONFIGS[(64 if hd <= 64 else 128, causal)])

    def __exit__(self, *exc):
        flash_fwd.FAST_FORWARD, flash_fwd.fast_forward_config, flash_fwd.GLUON_FORWARD = self.saved


def label(hd, causal, seqlen):
    return f"hd{hd}-{'causal' if causal else 'full'}-S{seqlen}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="directory for results.json")
    ap.add_argument("--only", default=None, help="regex over 'hd128-causal-S8192/variant' labels")
    ap.add_argument("--budget", type=float, default=110.0, help="seconds; past it pass 2 stops")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (its compiles take seconds)")
    args = ap.parse_args()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench_cudagraph

    from flashfuse.bench.harness import measure_ceilings

    t_start = time.time()
    only = re.compile(args.only) if args.only else None
    ceil = measure_ceilings("cuda")
    mm = ceil["matmul_TFLOPS"]
    print(f"{ceil['device']}: bf16 matmul {mm:.0f} TFLOP/s, copy {ceil['copy_GBps']:.0f} GB/s", flush=True)
    for knob in ("recompile_limit", "cache_size_limit"):   # one static Flex compile per shape
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    flex = None
    if not args.no_flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(hd, causal, s) for hd in HEAD_DIMS for causal in (False, True) for s in SEQLENS]
    rows, skipped = [], []
    state = {}

    def wanted(lbl):
        return only is None or only.search(lbl) is not None

    def tensors(hd, causal, seqlen):
        key = (hd, seqlen)
        if key not in state:            # kept for the whole run: ~0.6 GB per (head dim, seqlen)
            batch, nheads = TOKENS // seqlen, MODEL_DIM // hd
            q, k, v = (torch.randn(batch, seqlen, nheads, hd, device="cuda", dtype=dtype, generator=gen)
                       for _ in range(3))
            state[key] = dict(q=q, k=k, v=v, t=tuple(x.transpose(1, 2).contiguous() for x in (q, k, v)))
        st = state[key]
        if causal not in st:            # SDPA math in fp32, 4 heads at a time (S x S scores per head)
            ref = torch.empty(st["q"].shape, device="cuda", dtype=torch.float32)
            with sdpa_kernel(SDPBackend.MATH):
                for h in range(0, st["q"].shape[2], 4):
                    qh, kh, vh = (x[:, h:h + 4].float() for x in st["t"])
                    ref[:, :, h:h + 4] = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal).transpose(1, 2)
            st[causal] = ref
        return st

    def record(hd, causal, seqlen, variant, fn, bshd=True, cfg=None):
        lbl = f"{label(hd, causal, seqlen)}/{variant}"
        st = tensors(hd, causal, seqlen)
        batch, _, nheads, _ = st["q"].shape
        row = dict(label=lbl, variant=variant, hd=hd, causal=causal, S=seqlen, B=batch, H=nheads, cfg=cfg)
        try:
            out = fn()
            torch.cuda.synchronize()
            out = out if bshd else out.transpose(1, 2)
            ref = st[causal]
            row["err"] = err = ((out.float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                row["error"] = f"WRONG: rel err {err:.2e}"
            else:
                ms = do_bench_cudagraph(fn, rep=30, return_mode="median")
                flops = 4 * batch * nheads * seqlen * seqlen * hd * (0.5 if causal else 1.0)
                row.update(us=ms * 1e3, tflops=flops / ms * 1e-9, pct_mm=100 * flops / ms * 1e-9 / mm)
        except Exception as e:  # noqa: BLE001 (a config that fails to compile or launch is a result too)
            row["error"] = repr(e)[:240]
        rows.append(row)
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)

    def ours(st, causal):
        scale = st["q"].shape[-1] ** -0.5
        return lambda: flash_fwd.flash_attn_forward(st["q"], st["k"], st["v"], softmax_scale=scale,
                                                     window_right=0 if causal else -1)[0]

    # Pass 1: peers and the shipped kernel on every shape.
    masks = {}
    for hd, causal, seqlen in shapes:
        lb = label(hd, causal, seqlen)
        if not any(wanted(f"{lb}/{v}") for v in ("sdpa-cudnn", "sdpa-flash", "flex", "old")):
            continue
        st = tensors(hd, causal, seqlen)
        qt, kt, vt = st["t"]
        for variant, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                                 ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
            if wanted(f"{lb}/{variant}"):
                def peer(backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                record(hd, causal, seqlen, variant, peer, bshd=False)
        if flex is not None and wanted(f"{lb}/flex"):
            bm = None
            if causal:
                if seqlen not in masks:
                    masks[seqlen] = create_block_mask(lambda b, h, i, j: i >= j, None, None, seqlen, seqlen)
                bm = masks[seqlen]
            record(hd, causal, seqlen, "flex", lambda bm=bm: flex(qt, kt, vt, block_mask=bm), bshd=False)
        if wanted(f"{lb}/old"):
            with use_fast(False):
                record(hd, causal, seqlen, "old", ours(st, causal))

    # Pass 2: the fast kernel, candidate-major (one compile per head dim / mask / config, reused across S).
    plans = [("fast", None, SEQLENS)]
    for hd in HEAD_DIMS:
        for i, (kind, c) in enumerate(CANDIDATES[hd]):
            plans.append((name_of(kind, c), (hd, c), SEQLENS if i < SHORT else SEQLENS[1:]))
    for variant, spec, seqlens in plans:
        for hd, causal, seqlen in shapes:
            if seqlen not in seqlens or (spec is not None and spec[0] != hd):
                continue
            lbl = f"{label(hd, causal, seqlen)}/{variant}"
            if not wanted(lbl):
                continue
            if time.time() - t_start > args.budget:
                skipped.append(lbl)
                continue
            cfg = None if spec is None else spec[1]
            with use_fast(True, cfg):
                st = tensors(hd, causal, seqlen)
                used = cfg or flash_fwd.FAST_CONFIGS[(hd, causal)]
                record(hd, causal, seqlen, variant, ours(st, causal), cfg=used)

    # One table: every timed row with its ratios to the peers of its shape.
    timed = [r for r in rows if "us" in r]
    peer_us = {(r["hd"], r["causal"], r["S"], r["variant"]): r["us"] for r in timed}
    print(f"\n{'shape':<20} {'variant':<22} {'us':>9} {'TFLOP/s':>8} {'%mm':>5} {'xcuDNN':>7} {'xFA2':>6} {'xFlex':>6}")
    for r in sorted(timed, key=lambda r: (r["hd"], r["causal"], r["S"], -r["tflops"])):
        key = (r["hd"], r["causal"], r["S"])
        ratios = []
        for peer in ("sdpa-cudnn", "sdpa-flash", "flex"):
            p = peer_us.get((*key, peer))
            r[f"vs_{peer}"] = p / r["us"] if p else None        # > 1: faster than the peer
            ratios.append(f"{r[f'vs_{peer}']:.2f}" if p else "-")
        print(f"{label(*key):<20} {r['variant']:<22} {r['us']:9.1f} {r['tflops']:8.1f} {r['pct_mm']:5.1f} "
              f"{ratios[0]:>7} {ratios[1]:>6} {ratios[2]:>6}")
    print("\nbest of ours per shape (bars: >= Flex, >= 1.5x FA2, goal >= cuDNN):")
    for hd, causal, seqlen in shapes:
        mine = [r for r in timed if (r["hd"], r["causal"], r["S"]) == (hd, causal, seqlen)
                and r["variant"] not in ("sdpa-cudnn", "sdpa-flash", "flex")]
        if mine:
            b = max(mine, key=lambda r: r["tflops"])
            old = next((r for r in mine if r["variant"] == "old"), None)
            print(f"  {label(hd, causal, seqlen):<20} {b['variant']:<22} {b['tflops']:6.1f} TFLOP/s "
                  f"(old {old['tflops'] if old else float('nan'):6.1f}) xFlex {b.get('vs_flex') or float('nan'):.2f} "
                  f"xFA2 {b.get('vs_sdpa-flash') or float('nan'):.2f} "
                  f"xcuDNN {b.get('vs_sdpa-cudnn') or float('nan'):.2f}")
    bad = [r for r in rows if "error" in r]
    for r in bad:
        print(f"FAILED {r['label']}: {r['error']}")
    if skipped:
        print(f"budget ({args.budget:.0f} s) skipped {len(skipped)} rows: {', '.join(skipped)}")
    print(f"total {time.time() - t_start:.0f} s", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(dict(ceilings=ceil, rows=rows, skipped=skipped), f, indent=1, default=str)
    return 1 if any(r.get("error", "").startswith("WRONG") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
