"""Session 16: the Gluon forward at hd64 with three consumer warpgroups (192-row tiles) vs two, bf16, 16384 tokens,
model dim 2048, do_bench on flash_attn_forward; correctness vs SDPA's math backend in fp32 for each variant."""
import os, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W = H._WARP_SPECIALIZED
variants = {
    "2c-128x128": dict(W),
    "3c-192x128": dict(W, CONSUMERS=3, BLOCK_M=192, CONSUMER_REGS=160),
    "3c-192x64": dict(W, CONSUMERS=3, BLOCK_M=192, BLOCK_N=64, CONSUMER_REGS=160),
    "3c-192x64-s3": dict(W, CONSUMERS=3, BLOCK_M=192, BLOCK_N=64, NUM_STAGES=3, CONSUMER_REGS=160),
}
rows = []
orig = H.hopper_forward_config
for causal in (False, True):
    for S in (1024, 2048, 4096, 8192, 16384):
        B, Hh, hd = 16384 // S, 32, 64
        q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = do_bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), warmup=50, rep=300)
        ref = None
        if S <= 2048:
            ref = F.scaled_dot_product_attention(qt[:1].float(), kt[:1].float(), vt[:1].float(), is_causal=causal).transpose(1, 2)
        line = f"hd64 {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
        for name, cfg in variants.items():
            if name == "3c-192x128" and causal:
                continue
            H.hopper_forward_config = lambda *a, cfg=cfg: dict(cfg, PERSISTENT=not causal)
            run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
            out, _ = run()
            err = ((out[:1].float() - ref).norm() / ref.norm()).item() if ref is not None else float("nan")
            t = do_bench(run, warmup=50, rep=300)
            rows.append(dict(causal=causal, S=S, variant=name, tflops=flops / t / 1e9, cudnn=flops / t_c / 1e9, err=err))
            line += f" | {name} {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
        H.hopper_forward_config = orig
        print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s16_fwd3.json"), "w"), indent=1)
