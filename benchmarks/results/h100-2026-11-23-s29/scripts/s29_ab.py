"""Session 29's A/B harness: forward configs beside the table's, CUDA-graph timed beside cuDNN's SDPA, rounds in
alternating order; each variant checked against fp32 math on the first two batches (ERR above 1e-2). flash-attn's
benchmark shapes (model dim 2048, 16384 tokens, bf16). run(cases, name): cases maps (head dim, causal, S) to
{variant: config}; a config None is the table's own, otherwise a dict that replaces it (over_table=False) or is
applied over it (over_table=True). Prints per-round lines, then medians; writes $OUT/<name>.json."""
import os, json, statistics, collections, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W = dict(H._WARP_SPECIALIZED, PERSISTENT=True)       # the persistent two-consumer config, 128-key tiles, 2 stages


def _bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=120, return_mode="median")


def run(cases, name, over_table=False, rounds=2):
    orig = H.hopper_forward_config
    rows = []
    for rnd in range(rounds):
        for (hd, causal, S), variants in cases.items():
            Hh, B = 2048 // hd, 16384 // S
            q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                t_c = _bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            ref = F.scaled_dot_product_attention(qt[:2].float(), kt[:2].float(), vt[:2].float(),
                                                 is_causal=causal).transpose(1, 2)
            line = f"round {rnd} hd{hd} {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
            names = list(variants.items())
            for vname, cfg in (names if rnd % 2 == 0 else names[::-1]):
                if cfg is not None:
                    H.hopper_forward_config = ((lambda *a, cfg=cfg: dict(orig(*a), **cfg)) if over_table
                                               else (lambda *a, cfg=cfg: dict(cfg)))
                try:
                    call = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5,
                                                                window_right=0 if causal else -1)
                    out, _ = call()
                    err = ((out[:2].float() - ref).norm() / ref.norm()).item()
                    t = _bench(call)
                    rows.append(dict(round=rnd, hd=hd, causal=causal, S=S, variant=vname, tflops=flops / t / 1e9,
                                     cudnn=flops / t_c / 1e9, err=err))
                    line += f" | {vname} {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
                except Exception as e:
                    line += f" | {vname} FAILED {type(e).__name__}: {str(e)[:300]}"
                finally:
                    H.hopper_forward_config = orig
            print(line, flush=True)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"{name}.json"), "w"), indent=1)
    agg = collections.defaultdict(list)
    for r in rows:
        agg[(r["hd"], r["causal"], r["S"], r["variant"])].append(r["tflops"])
        agg[(r["hd"], r["causal"], r["S"], "cudnn")].append(r["cudnn"])
    for (hd, causal, S), variants in cases.items():
        print(f"hd{hd} {'causal' if causal else 'full  '} S={S:5d} " + "  ".join(
            f"{v} {statistics.median(agg[(hd, causal, S, v)]):6.1f}" for v in ["cudnn", *variants]
            if agg[(hd, causal, S, v)]))
