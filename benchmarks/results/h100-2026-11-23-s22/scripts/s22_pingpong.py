"""Session 22: the Gluon forward with FA3's ping-pong (each consumer warpgroup issues its products only after the
previous one issued its own) vs without, same configs (the table's), CUDA-graph timed beside cuDNN; error vs fp32
math (first two batches, S <= 2048)."""
import os, json, torch, importlib
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H
V = importlib.import_module("flashfuse.ops.attention._v_pp")
launches = {"main": H._launch_forward, "pingpong": V._launch_forward}
def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=150, return_mode="median")
rows = []
for hd, causal in ((64, True), (64, False), (128, True), (128, False)):
    for S in (512, 1024, 2048, 4096, 16384):
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
        for name, launch in launches.items():
            H._launch_forward = launch
            run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
            out, _ = run()
            err = ((out[:2].float() - ref).norm() / ref.norm()).item() if ref is not None else float("nan")
            t = bench(run)
            rows.append(dict(hd=hd, causal=causal, S=S, variant=name, tflops=flops / t / 1e9, cudnn=flops / t_c / 1e9, err=err))
            line += f" | {name} {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
        H._launch_forward = launches["main"]
        print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s22_pingpong.json"), "w"), indent=1)
