"""Session 23: attention forward on small grids (batch 1: the progression's B=1 H=16 D=64 fp16 and an inference
prefill B=1 H=32 D=128 bf16), where flash_fwd picks the pointer kernel (under two waves of 128-row blocks).
CUDA-graph timed: the plan as shipped, the Gluon kernel forced (persistent / one tile per program), the fast Triton
kernel forced, blocked_attention, cuDNN; then eager do_bench of flash_attention vs blocked vs SDPA, and host time."""
import os, json, time, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph, do_bench
import flashfuse.attention as P
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W = H._WARP_SPECIALIZED
orig_h, orig_f = H.hopper_forward_config, flash_fwd.fast_forward_config
def g(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=100, return_mode="median")
def e(fn):
    fn(); torch.cuda.synchronize()
    return do_bench(fn, warmup=50, rep=200, return_mode="median")
def host_us(fn, n=100):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return best
rows = []
for B, Hh, D, dt, causal in ((1, 16, 64, torch.float16, False), (1, 32, 128, torch.bfloat16, True), (1, 32, 128, torch.bfloat16, False),
                             (2, 16, 64, torch.bfloat16, True)):
    for S in (512, 1024, 2048, 4096):
        q, k, v = (torch.randn(B, S, Hh, D, device="cuda", dtype=dt) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 4 * B * Hh * S * S * D * (0.5 if causal else 1)
        ref = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), is_causal=causal).transpose(1, 2)
        res = {}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            res["cudnn"] = g(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=D ** -0.5, window_right=0 if causal else -1)
        plans = {"shipped": (orig_h, orig_f),
                 "gluon-pers": (lambda *a: dict(W, PERSISTENT=True, **({"Q_STAGES": 1} if causal and D == 128 else {})), orig_f),
                 "gluon-1tile": (lambda *a: dict(W, PERSISTENT=False, Q_STAGES=1), orig_f),
                 }
        if (D, causal) in flash_fwd.FAST_CONFIGS:
            plans["fast-triton"] = (lambda *a: None, lambda *a, **kw: dict(flash_fwd.FAST_CONFIGS[(D, causal)]))
        if os.environ.get("SMALL_QUICK"):
            plans = {"shipped": plans["shipped"]}
        for name, (hc, fc) in plans.items():
            H.hopper_forward_config, flash_fwd.fast_forward_config = hc, fc
            try:
                out = run()[0]
                err = ((out.float() - ref).norm() / ref.norm()).item()
                res[name] = g(run)
                if err > 1e-2:
                    name += f" ERR {err:.1e}"
            except Exception as ex:
                print(name, "failed", repr(ex)[:200])
        H.hopper_forward_config, flash_fwd.fast_forward_config = orig_h, orig_f
        if os.environ.get("SMALL_QUICK"):
            print(f"B{B} H{Hh} D{D} {'causal' if causal else 'full'} S={S}: graph TFLOP/s " + " ".join(f"{n} {flops / t / 1e9:.0f}" for n, t in res.items()), flush=True)
            continue
        res["blocked"] = g(lambda: P.blocked_attention(qt, kt, vt, is_causal=causal))
        eager = {"flash_attention": e(lambda: P.flash_attention(qt, kt, vt, is_causal=causal)),
                 "blocked": e(lambda: P.blocked_attention(qt, kt, vt, is_causal=causal)),
                 "sdpa": e(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))}
        host = {"flash_attention": host_us(lambda: P.flash_attention(qt, kt, vt, is_causal=causal)),
                "sdpa": host_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))}
        tag = f"B{B} H{Hh} D{D} {str(dt)[6:]} {'causal' if causal else 'full'} S={S}"
        print(f"{tag}: graph TFLOP/s " + " ".join(f"{n} {flops / t / 1e9:.0f}" for n, t in res.items())
              + " | eager " + " ".join(f"{n} {flops / t / 1e9:.0f}" for n, t in eager.items())
              + " | host us " + " ".join(f"{n} {t:.0f}" for n, t in host.items()), flush=True)
        rows.append(dict(case=tag, graph_ms=res, eager_ms=eager, host_us=host, flops=flops))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s23_small.json"), "w"), indent=1)
