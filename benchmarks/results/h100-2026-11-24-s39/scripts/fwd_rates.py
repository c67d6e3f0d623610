"""Gluon forward TFLOP/s (bf16, 16384 tokens, model dim 2048, CUDA-graph timed) for plain masks, to A/B two source
trees in alternating processes (PYTHONPATH picks the tree)."""
import sys, torch, flashfuse
from triton.testing import do_bench_cudagraph
from flashfuse import flash_attn_func
tag = sys.argv[1]
for hd in (64, 128):
    for causal in (False, True):
        for S in (1024, 4096):
            B, H = 16384 // S, 2048 // hd
            q, k, v = (torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            f = lambda: flash_attn_func(q, k, v, causal=causal)
            f()
            ms = do_bench_cudagraph(f, rep=60, return_mode="median")
            fl = 4 * B * H * S * S * hd * (0.5 if causal else 1)
            print(f"{tag} hd{hd} {'causal' if causal else 'full'} S={S} fwd {fl / ms / 1e9:.0f}", flush=True)
