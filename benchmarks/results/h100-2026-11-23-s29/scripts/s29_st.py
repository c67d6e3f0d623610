"""Session 29, call 4: stages at 128-key tiles for the hd64 causal forward, with and without KV_JOINT (one release per K / V slot, after its P V: one mbarrier arrive per key block instead of two,
so one CTA-partition barrier fewer) beside the table's configs, CUDA-graph timed beside cuDNN, rounds alternating;
error vs fp32 math."""
import os, sys, json, statistics, collections, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W = dict(H._WARP_SPECIALIZED, PERSISTENT=True)
B3 = dict(BLOCK_N=128, NUM_STAGES=3)
B4 = dict(BLOCK_N=128, NUM_STAGES=4)
J = dict(KV_JOINT=True)
CASES = {  # (hd, causal, S): variants (dicts are applied over the table's config)
    (64, True, 512): {"table": None, "bn128-st3": B3, "bn128-st3-joint": dict(B3, **J), "bn128-st4": B4,
                      "bn128-st4-joint": dict(B4, **J)},
    (64, True, 1024): {"table": None, "bn128-st3": B3, "bn128-st3-joint": dict(B3, **J), "bn128-st4": B4,
                       "bn128-st4-joint": dict(B4, **J)},
    (64, True, 2048): {"table": None, "bn128-st3": B3, "bn128-st3-joint": dict(B3, **J), "bn128-st4": B4},
    (64, True, 8192): {"table": None, "bn128-st3": B3, "bn128-st3-joint": dict(B3, **J)},
}
orig = H.hopper_forward_config


def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=120, return_mode="median")


rows = []
for rnd in range(2):
    for (hd, causal, S), variants in CASES.items():
        Hh, B = 2048 // hd, 16384 // S
        q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        ref = F.scaled_dot_product_attention(qt[:2].float(), kt[:2].float(), vt[:2].float(), is_causal=causal).transpose(1, 2)
        line = f"round {rnd} hd{hd} {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
        names = list(variants.items())
        for name, cfg in (names if rnd % 2 == 0 else names[::-1]):
            if cfg is not None:
                H.hopper_forward_config = lambda *a, cfg=cfg: dict(orig(*a), **cfg)
            try:
                run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
                out, _ = run()
                err = ((out[:2].float() - ref).norm() / ref.norm()).item()
                t = bench(run)
                rows.append(dict(round=rnd, hd=hd, causal=causal, S=S, variant=name, tflops=flops / t / 1e9,
                                 cudnn=flops / t_c / 1e9, err=err))
                line += f" | {name} {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
            except Exception as e:
                line += f" | {name} FAILED {type(e).__name__}: {str(e)[:300]}"
            finally:
                H.hopper_forward_config = orig
        print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s29_st.json"), "w"), indent=1)
agg = collections.defaultdict(list)
for r in rows:
    agg[(r["hd"], r["causal"], r["S"], r["variant"])].append(r["tflops"])
    agg[(r["hd"], r["causal"], r["S"], "cudnn")].append(r["cudnn"])
for (hd, causal, S), variants in CASES.items():
    print(f"hd{hd} {'causal' if causal else 'full  '} S={S:5d} " + "  ".join(
        f"{v} {statistics.median(agg[(hd, causal, S, v)]):6.1f}" for v in ["cudnn", *variants] if agg[(hd, causal, S, v)]))
