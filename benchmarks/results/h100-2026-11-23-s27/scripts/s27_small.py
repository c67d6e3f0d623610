"""Session 27: hd128 causal short calls at small batch (the MIN_WAVE fallbacks of the new 64-key entry), the table
as shipped vs the 128-key entry it replaced, CUDA-graph timed beside cuDNN."""
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H

NEW = H.HOPPER_CONFIGS[(128, True)]
OLD = ((512, dict(H._WARP_SPECIALIZED, PERSISTENT=True, Q_STAGES=1)), )
def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=150, return_mode="median")
for rnd in range(2):
    for B, Hh, S in ((1, 32, 512), (2, 16, 512), (4, 16, 512), (2, 32, 768), (32, 16, 512)):
        q, k, v = (torch.randn(B, S, Hh, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * Hh * S * S * 128 * 0.5
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
        ref = F.scaled_dot_product_attention(qt[:1].float(), kt[:1].float(), vt[:1].float(), is_causal=True).transpose(1, 2)
        line = f"round {rnd} B{B} H{Hh} hd128 causal S={S} cudnn {flops / t_c / 1e9:6.1f}"
        for name, table in (("new", NEW), ("old", OLD)):
            H.HOPPER_CONFIGS[(128, True)] = table
            cfg = H.hopper_forward_config(128, True, S, S, B * Hh, 132)
            run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=128 ** -0.5, window_right=0)
            out, _ = run()
            err = ((out[:1].float() - ref).norm() / ref.norm()).item()
            t = bench(run)
            desc = "triton" if cfg is None else f"bn{cfg['BLOCK_N']}{'-p' if cfg['PERSISTENT'] else ''}-q{cfg['Q_STAGES']}"
            line += f" | {name} ({desc}) {flops / t / 1e9:6.1f}" + (f" ERR {err:.1e}" if err > 1e-2 else "")
        H.HOPPER_CONFIGS[(128, True)] = NEW
        print(line, flush=True)
