"""Session 22: hd64 Gluon backward, row layout with 128-row query steps (FA3's hd64 scheme) vs the transposed
64-row steps vs cuDNN; bf16, 16384 tokens, model dim 2048. Correctness vs the deterministic grid first."""
import json, os, sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
from flashfuse.ops.attention import flash_fwd, flash_bwd_hopper as BH
from flashfuse.ops.attention.flash_bwd import flash_attn_backward

seqlens = [int(s) for s in os.environ.get("SEQLENS", "512,1024,2048,4096,8192,16384").split(",")]
import importlib
variants = {"rows128": (dict(BH._CONFIG_ROWS), BH._launch_backward)}
if os.environ.get("T64"):
    variants["t64"] = (dict(BH._CONFIG), BH._launch_backward)
for v in os.environ.get("VARIANTS", "").split(","):
    if v:
        variants[v] = (dict(BH._CONFIG_ROWS), importlib.import_module(f"flashfuse.ops.attention._v_{v}")._launch_backward)
hd = int(os.environ.get("HD", "64"))
rows = []
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
        ref = run(True)
        flops = 2.5 * 4 * B * H * S * S * hd * (0.5 if causal else 1)
        r = dict(hd=hd, causal=causal, S=S)
        for name, (cfg, launch) in variants.items():
            BH.HOPPER_BWD_CONFIGS[hd] = cfg
            BH._launch_backward = launch
            try:
                g = run(False)
            except Exception as e:
                print(name, "failed:", str(e)[:200], flush=True)
                r[name], r[name + "_err"] = float("nan"), float("nan")
                continue
            err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(g, ref))
            t = do_bench(lambda: run(False), warmup=50, rep=300)
            r[name] = flops / t / 1e9
            r[name + "_err"] = err
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = dout.transpose(1, 2)
        t_c = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True), warmup=50, rep=300)
        r["cudnn"] = flops / t_c / 1e9
        rows.append(r)
        print(f"hd{hd} {'causal' if causal else 'full  '} S={S:6d} " + "  ".join(
            f"{n} {r[n]:6.1f} ({r[n] / r['cudnn']:.3f}, err {r[n + '_err']:.1e})" for n in variants)
            + f"  cudnn {r['cudnn']:6.1f}", flush=True)
        del q, k, v, out, lse, dout, g, ref, o, qt, kt, vt
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"s22_bwd_hd{hd}.json"), "w"), indent=1)
