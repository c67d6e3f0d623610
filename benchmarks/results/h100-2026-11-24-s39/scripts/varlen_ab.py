"""Session 39: the varlen forward, Gluon (new) vs the Triton kernel it ran on before (GLUON_FORWARD off for the call),
and flash_attn_func on an equal-length batch of the same token count (what packing costs), eager (do_bench: the varlen entry checks cu_seqlens on the host, which a graph cannot capture), bf16,
16384 tokens, model dim 2048."""
import torch
from triton.testing import do_bench
from flashfuse import flash_attn_func, flash_attn_varlen_func
from flashfuse.ops.attention import flash_fwd
from flashfuse.bench.suites.attention import varlen_lengths


def tflops(fn, flops):
    fn()
    return flops / do_bench(fn, rep=100, return_mode="median") / 1e9


for hd in (64, 128):
    H = 2048 // hd
    for causal in (False, True):
        for S in (1024, 2048, 4096):
            lens = varlen_lengths(16384, S)
            cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
            q, k, v = (torch.randn(16384, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fl = sum(4 * H * n * n * hd * (0.5 if causal else 1) for n in lens)
            f = lambda: flash_attn_varlen_func(q, k, v, cu, cu, S, S, causal=causal)
            new = tflops(f, fl)
            flash_fwd.GLUON_FORWARD = False
            old = tflops(f, fl)
            flash_fwd.GLUON_FORWARD = True
            qb, kb, vb = (t.view(16384 // S, S, H, hd) for t in (q, k, v))
            dense = tflops(lambda: flash_attn_func(qb, kb, vb, causal=causal), 4 * 16384 * S * H * hd * (0.5 if causal else 1))
            print(f"varlen hd{hd} {'causal' if causal else 'full'} max={S} ({len(lens)} seqs): gluon {new:.0f} "
                  f"triton {old:.0f} ({new / old:.2f}x) | equal-length batch {dense:.0f}", flush=True)
