"""Session 43: forward time through flash_attn_func, eager (host included) and CUDA-graph timed, to A/B two source trees
in alternating processes (PYTHONPATH picks the tree): the launch now passes seven descriptors."""
import sys, torch, triton
from triton.testing import do_bench, do_bench_cudagraph
from flashfuse import flash_attn_func
tag = sys.argv[1]
for hd, causal, B, S, H in ((64, True, 32, 512, 32), (128, True, 32, 512, 16), (64, False, 16, 1024, 32),
                            (128, False, 4, 4096, 16), (128, True, 1, 16384, 16), (160, False, 4, 4096, 13)):
    q, k, v = (torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f = lambda: flash_attn_func(q, k, v, causal=causal)
    f()
    eager = do_bench(f, rep=200, return_mode="median")
    graph = do_bench_cudagraph(f, rep=60, return_mode="median")
    print(f"{tag} hd{hd} {'causal' if causal else 'full'} B{B} S{S} H{H}: eager {eager * 1e3:.1f} us graph "
          f"{graph * 1e3:.1f} us", flush=True)
