"""Session 29: causal forward configs at S = 512..4096 (HALF_LAST: the upper warpgroup multiplies only the first half
of its diagonal key block), CUDA-graph timed beside cuDNN, rounds alternating; error vs fp32 math (first two batches).
Usage: s29_fwd.py [rounds] [shape filter]"""
import os, sys, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W = dict(H._WARP_SPECIALIZED, PERSISTENT=True)
VARIANTS = {
    64: {"table": None, "bn64-st3": dict(W, BLOCK_N=64, NUM_STAGES=3), "bn128": dict(W),
         "bn128-half": dict(W, HALF_LAST=True), "bn128-half-st3": dict(W, HALF_LAST=True, NUM_STAGES=3)},
    128: {"table": None, "bn64-st3": dict(W, BLOCK_N=64, NUM_STAGES=3), "bn128-q1": dict(W, Q_STAGES=1),
          "bn128-q1-half": dict(W, Q_STAGES=1, HALF_LAST=True), "bn128-q2-half": dict(W, HALF_LAST=True)},
}
SHAPES = [(64, 512), (64, 1024), (64, 2048), (64, 4096), (128, 512), (128, 1024), (128, 2048)]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
orig = H.hopper_forward_config


def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=120, return_mode="median")


rows = []
for rnd in range(rounds):
    for hd, S in SHAPES:
        Hh, B = 2048 // hd, 16384 // S
        q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * Hh * S * S * hd * 0.5
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        ref = F.scaled_dot_product_attention(qt[:2].float(), kt[:2].float(), vt[:2].float(), is_causal=True).transpose(1, 2)
        line = f"round {rnd} hd{hd} causal S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
        names = list(VARIANTS[hd].items())
        for name, cfg in (names if rnd % 2 == 0 else names[::-1]):
            if cfg is not None:
                H.hopper_forward_config = lambda *a, cfg=cfg: dict(cfg)
            try:
                run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0)
                out, _ = run()
                err = ((out[:2].float() - ref).norm() / ref.norm()).item()
                t = bench(run)
                rows.append(dict(round=rnd, hd=hd, S=S, variant=name, tflops=flops / t / 1e9, cudnn=flops / t_c / 1e9, err=err))
                line += f" | {name} {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
            except Exception as e:
                line += f" | {name} FAILED {type(e).__name__}: {str(e)[:200]}"
            finally:
                H.hopper_forward_config = orig
        print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s29_fwd.json"), "w"), indent=1)
# summary: median over rounds per (hd, S, variant)
import statistics, collections
agg = collections.defaultdict(list)
for r in rows:
    agg[(r["hd"], r["S"], r["variant"])].append(r["tflops"])
    agg[(r["hd"], r["S"], "cudnn")].append(r["cudnn"])
for hd, S in SHAPES:
    vs = ["cudnn"] + list(VARIANTS[hd])
    print(f"hd{hd} S={S:5d} " + "  ".join(f"{v} {statistics.median(agg[(hd, S, v)]):6.1f}" for v in vs if agg[(hd, S, v)]))
