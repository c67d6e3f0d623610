"""Session 16: the Gluon backward (flash_bwd_hopper) vs flash_bwd's grid vs cuDNN, bf16, 16384 tokens, model dim 2048.
First a correctness check per head dim (vs the deterministic grid), then do_bench of the backward launchers alone."""
import json, os, sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
from flashfuse.ops.attention import flash_fwd
from flashfuse.ops.attention.flash_bwd import flash_attn_backward

seqlens = [int(s) for s in os.environ.get("SEQLENS", "1024,2048,4096,8192,16384").split(",")]
hds = [int(s) for s in os.environ.get("HDS", "128,64").split(",")]
rows = []
for hd in hds:
    for causal in (False, True):
        for S in seqlens:
            B, H = 16384 // S, 2048 // hd
            q, k, v = (torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            scale = hd ** -0.5
            wr = 0 if causal else -1
            out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=wr)
            dout = torch.randn_like(q)
            run = lambda det: flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale, window_right=wr,
                                                  deterministic=det)
            g, d = run(False), run(True)
            errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(g, d)]
            flops = 2.5 * 4 * B * H * S * S * hd * (0.5 if causal else 1)
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            dot = dout.transpose(1, 2)
            t_g = do_bench(lambda: run(False), warmup=50, rep=300)
            t_d = do_bench(lambda: run(True), warmup=50, rep=300)
            t_c = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True), warmup=50, rep=300)
            r = dict(hd=hd, causal=causal, S=S, gluon_us=t_g * 1e3, triton_us=t_d * 1e3, cudnn_us=t_c * 1e3,
                     gluon=flops / t_g / 1e9, triton=flops / t_d / 1e9, cudnn=flops / t_c / 1e9, err=max(errs))
            rows.append(r)
            print(f"hd{hd} {'causal' if causal else 'full  '} S={S:6d}  gluon {r['gluon']:6.1f}  triton {r['triton']:6.1f}  "
                  f"cudnn {r['cudnn']:6.1f} TFLOP/s   gluon/cudnn {r['gluon']/r['cudnn']:.3f}  err {max(errs):.1e}", flush=True)
            del q, k, v, out, lse, dout, g, d, o, qt, kt, vt
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s16_bwd.json"), "w"), indent=1)
