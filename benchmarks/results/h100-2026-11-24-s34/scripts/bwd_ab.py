"""Session 34: hd64 Gluon backward, S of the next step issued ahead (S_AHEAD, clamped / branch) vs base vs cuDNN;
bf16, 16384 tokens, model dim 2048; rounds alternate variants. Correctness vs the deterministic grid first."""
import json, os, sys, torch, importlib
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
from flashfuse.ops.attention import flash_fwd, flash_bwd_hopper as BH
from flashfuse.ops.attention.flash_bwd import flash_attn_backward
from flashfuse.ops.attention import flash_bwd as FB

seqlens = [int(s) for s in os.environ.get("SEQLENS", "1024,2048,4096,8192").split(",")]
launch0 = BH._launch_backward
base_mod = importlib.import_module("flashfuse.ops.attention._v_base")
variants = {"base": (base_mod, dict(base_mod._CONFIG_ROWS)),
            "loop": (BH, dict(BH._CONFIG_ROWS, PERSISTENT=False)),
            "pers": (BH, dict(BH._CONFIG_ROWS, PERSISTENT=True))}
hd, rounds = 64, int(os.environ.get("ROUNDS", "2"))
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
        for rnd in range(rounds):
            for name, (mod, cfg) in variants.items():
                FB.flash_bwd_hopper = mod
                mod.HOPPER_BWD_CONFIGS[hd] = cfg
                g = run(False)
                err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(g, ref))
                t = do_bench(lambda: run(False), warmup=30, rep=200)
                r.setdefault(name, []).append(flops / t / 1e9)
                r[name + "_err"] = max(err, r.get(name + "_err", 0))
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        dot = dout.transpose(1, 2)
        t_c = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True), warmup=30, rep=200)
        r["cudnn"] = flops / t_c / 1e9
        rows.append(r)
        med = {n: sorted(r[n])[len(r[n]) // 2] for n in variants}
        print(f"hd{hd} {'causal' if causal else 'full  '} S={S:6d} " + "  ".join(
            f"{n} {med[n]:6.1f} {['%.0f' % x for x in r[n]]} ({med[n] / r['cudnn']:.3f}, err {r[n + '_err']:.1e})"
            for n in variants) + f"  cudnn {r['cudnn']:6.1f}", flush=True)
        del q, k, v, out, lse, dout, g, ref, o, qt, kt, vt
FB.flash_bwd_hopper = BH; BH.HOPPER_BWD_CONFIGS[hd] = dict(BH._CONFIG_ROWS)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), os.environ.get("JSON", "s34_bwd_ab.json")), "w"), indent=1)
