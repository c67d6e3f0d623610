"""Session 17: the Gluon forward's persistent causal schedule with paired row blocks (n-1-i, i) vs one tile per
program vs the Triton fast kernel; hd64 full at short S (Triton / 2 / 3 consumers). bf16, 16384 tokens, model dim
2048, CUDA-graph replays of flash_attn_forward (kernel time) beside cuDNN's; error vs fp32 math (first batch)."""
import os, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph, do_bench
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W = H._WARP_SPECIALIZED
T3 = H._THREE_CONSUMERS
orig = H.hopper_forward_config
rows = []
def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=200, return_mode="median")
for hd in (64, 128):
    for causal in (True, False):
        variants = ({"triton": None, "onetile": dict(W, PERSISTENT=False), "paired": dict(W, PERSISTENT=True)} if causal
                    else {"triton": None, "persist2": dict(W, PERSISTENT=True), "persist3": dict(T3, PERSISTENT=True)})
        if not causal and hd == 128:
            continue
        for S in ((512, 1024, 2048, 4096, 8192, 16384) if causal else (512, 1024, 2048, 4096)):
            Hh = 2048 // hd
            B = 16384 // S
            q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
                t_c_eager = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=25, rep=200)
            ref = None
            if S <= 2048:
                ref = F.scaled_dot_product_attention(qt[:2].float(), kt[:2].float(), vt[:2].float(), is_causal=causal).transpose(1, 2)
            line = f"hd{hd} {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f} (eager {flops / t_c_eager / 1e9:6.1f})"
            for name, cfg in variants.items():
                H.hopper_forward_config = (lambda *a: None) if cfg is None else (lambda *a, cfg=cfg: dict(cfg))
                run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
                out, _ = run()
                err = ((out[:2].float() - ref).norm() / ref.norm()).item() if ref is not None else float("nan")
                t = bench(run)
                te = do_bench(run, warmup=25, rep=200)
                rows.append(dict(hd=hd, causal=causal, S=S, variant=name, tflops=flops / t / 1e9, tflops_eager=flops / te / 1e9,
                                 cudnn=flops / t_c / 1e9, cudnn_eager=flops / t_c_eager / 1e9, err=err))
                line += f" | {name} {flops / t / 1e9:6.1f} ({flops / te / 1e9:5.1f})" + (f" ERR {err:.1e}" if err > 1e-2 else "")
            H.hopper_forward_config = orig
            print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s17_causal.json"), "w"), indent=1)
