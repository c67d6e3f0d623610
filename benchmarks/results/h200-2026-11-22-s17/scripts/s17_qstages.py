"""Session 17, call 5 (s17_qstages.py): the Gluon forward with Q in two slots per consumer (the next tile's Q loads
while this one runs) vs one, every (head dim, mask) at S = 512..16K, two consumers and three at hd64 full. CUDA-graph timed beside cuDNN; error vs fp32 math (first two batches)."""
import os, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

W, T3 = H._WARP_SPECIALIZED, H._THREE_CONSUMERS
orig = H.hopper_forward_config
VARIANTS = {
    (64, True): {"q2": dict(W, PERSISTENT=True), "q1": dict(W, PERSISTENT=True, Q_STAGES=1),
                 "onetile": dict(W, PERSISTENT=False)},
    (64, False): {"q2": dict(W, PERSISTENT=True), "q1": dict(W, PERSISTENT=True, Q_STAGES=1),
                  "three-q2": dict(T3, PERSISTENT=True), "three-q1": dict(T3, PERSISTENT=True, Q_STAGES=1)},
    (128, True): {"q2": dict(W, PERSISTENT=True), "q1": dict(W, PERSISTENT=True, Q_STAGES=1)},
    (128, False): {"q2": dict(W, PERSISTENT=True), "q1": dict(W, PERSISTENT=True, Q_STAGES=1)},
}
def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=150, return_mode="median")
rows = []
for (hd, causal), variants in VARIANTS.items():
    for S in (512, 1024, 2048, 4096, 8192, 16384):
        Hh, B = 2048 // hd, 16384 // S
        q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        ref = None
        if S <= 2048:
            ref = F.scaled_dot_product_attention(qt[:2].float(), kt[:2].float(), vt[:2].float(), is_causal=causal).transpose(1, 2)
        line = f"hd{hd} {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
        for name, cfg in variants.items():
            H.hopper_forward_config = lambda *a, cfg=cfg: dict(cfg)
            run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
            out, _ = run()
            err = ((out[:2].float() - ref).norm() / ref.norm()).item() if ref is not None else float("nan")
            t = bench(run)
            rows.append(dict(hd=hd, causal=causal, S=S, variant=name, tflops=flops / t / 1e9, cudnn=flops / t_c / 1e9, err=err))
            line += f" | {name} {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
        H.hopper_forward_config = orig
        print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s17_qstages.json"), "w"), indent=1)
