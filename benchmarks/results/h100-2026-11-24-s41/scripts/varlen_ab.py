"""Session 41: varlen forward and backward kernel time (flash_fwd.flash_attn_forward / flash_bwd.flash_attn_backward,
below the interface, CUDA-graph timed), for the tree on sys.argv[1] (old / new in alternating processes).
16K tokens in sequences of [max / 8, max], model dim 2048, bf16."""
import sys
sys.path.insert(0, sys.argv[1])
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_bwd, flash_fwd
from flashfuse.bench.suites.attention import varlen_lengths
assert flash_fwd.__file__.startswith(sys.argv[1]), flash_fwd.__file__


def tflops(fn, flops):
    fn()
    return flops / do_bench_cudagraph(fn, rep=50, return_mode="median") / 1e9


for hd in (64, 128, 256):
    H = 2048 // hd
    for causal in (False, True):
        for S in (1024, 4096):
            lens = varlen_lengths(16384, S)
            cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
            q, k, v, do = (torch.randn(16384, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            opts = dict(softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
            var = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=S, max_seqlen_k=S)
            fl = sum(4 * H * n * n * hd * (0.5 if causal else 1) for n in lens)
            fwd = tflops(lambda: flash_fwd.flash_attn_forward(q, k, v, **opts, **var), fl)
            out, lse = flash_fwd.flash_attn_forward(q, k, v, **opts, **var)
            bwd = tflops(lambda: flash_bwd.flash_attn_backward(do, q, k, v, out, lse, **opts, **var), 2.5 * fl)
            print(f"hd{hd} {'causal' if causal else 'full'} max={S}: fwd {fwd:.1f} bwd {bwd:.1f}", flush=True)
