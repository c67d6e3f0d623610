"""Session 16: Gluon backward variants (HOPPER_BWD_CONFIGS entries) at bf16, 16384 tokens, model dim 2048, do_bench."""
import os, torch, json
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
from flashfuse.ops.attention import flash_fwd, flash_bwd_hopper as H
from flashfuse.ops.attention.flash_bwd import flash_attn_backward

base = dict(H._CONFIG)
variants = {
    "base": {}, "rotate": dict(ROTATE=True), "defer": dict(DEFER_DQ=True), "defer+rotate": dict(DEFER_DQ=True, ROTATE=True),
    "st3": dict(NUM_STAGES=3), "st3+rotate": dict(NUM_STAGES=3, ROTATE=True),
}
skip = {128: {"defer", "defer+rotate", "st3", "st3+rotate"}}     # hd128: spills / shared memory
rows = []
for hd in (128, 64):
    for causal in (False, True):
        for S in (2048, 8192):
            B, Hh = 16384 // S, 2048 // hd
            q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            scale, wr = hd ** -0.5, (0 if causal else -1)
            out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=wr)
            dout = torch.randn_like(q)
            run = lambda det: flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale, window_right=wr, deterministic=det)
            ref = run(True)
            flops = 2.5 * 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            dot = dout.transpose(1, 2)
            t_c = do_bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True), warmup=50, rep=300)
            line = f"hd{hd} {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
            for name, over in variants.items():
                if name in skip.get(hd, ()):
                    continue
                H.HOPPER_BWD_CONFIGS[hd] = dict(base, **over)
                g = run(False)
                err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(g, ref))
                t = do_bench(lambda: run(False), warmup=50, rep=300)
                rows.append(dict(hd=hd, causal=causal, S=S, variant=name, tflops=flops / t / 1e9, cudnn=flops / t_c / 1e9, err=err))
                line += f" | {name} {flops / t / 1e9:6.1f}{'' if err < 1e-2 else ' ERR %.1e' % err}"
            H.HOPPER_BWD_CONFIGS[hd] = dict(base)
            print(line, flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s16_var.json"), "w"), indent=1)
