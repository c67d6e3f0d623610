"""Session 41: varlen forward kernel time for the tree on sys.argv[1] (variants in alternating processes)."""
import sys
sys.path.insert(0, sys.argv[1])
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd
from flashfuse.bench.suites.attention import varlen_lengths
assert flash_fwd.__file__.startswith(sys.argv[1]), flash_fwd.__file__
out = []
for hd, causal, S in ((64, True, 1024), (64, False, 4096), (128, False, 1024), (128, True, 1024), (128, False, 4096), (256, True, 1024)):
    H = 2048 // hd
    lens = varlen_lengths(16384, S)
    cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(16384, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = sum(4 * H * n * n * hd * (0.5 if causal else 1) for n in lens)
    f = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1,
                                             cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=S, max_seqlen_k=S)
    f()
    out.append(f"hd{hd}{'c' if causal else 'f'}{S // 1024}K {fl / do_bench_cudagraph(f, rep=60, return_mode='median') / 1e9:.1f}")
print(sys.argv[2], " ".join(out), flush=True)
