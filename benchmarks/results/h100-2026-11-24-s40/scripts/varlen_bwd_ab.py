"""Session 40: the varlen backward's kernel time (flash_bwd.flash_attn_backward on a saved forward, below the interface,
CUDA-graph timed): the Gluon backward (flash_bwd_hopper, IS_VARLEN) vs flash_bwd's Triton grid (GLUON_BACKWARD off)
in the same process; and the equal-length batch's backward (Gluon) for reference. 16K tokens, model dim 2048, bf16."""
import sys
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_bwd, flash_fwd
from flashfuse.bench.suites.attention import varlen_lengths


def tflops(fn, flops):
    fn()
    return flops / do_bench_cudagraph(fn, rep=60, return_mode="median") / 1e9


HDS = [int(x) for x in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["64", "128", "256"])]
for hd in HDS:
    H = 2048 // hd
    for causal in (False, True):
        for S in (1024, 2048, 4096):
            lens = varlen_lengths(16384, S)
            cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
            q, k, v, do = (torch.randn(16384, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            opts = dict(softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
            var = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=S, max_seqlen_k=S)
            out, lse = flash_fwd.flash_attn_forward(q, k, v, **opts, **var)
            fl = sum(10 * H * n * n * hd * (0.5 if causal else 1) for n in lens)
            f = lambda: flash_bwd.flash_attn_backward(do, q, k, v, out, lse, **opts, **var)
            r = {}
            r["gluon"] = tflops(f, fl)
            flash_bwd.GLUON_BACKWARD = False
            r["triton"] = tflops(f, fl)
            flash_bwd.GLUON_BACKWARD = True
            qb, kb, vb, dob = (t.view(16384 // S, S, H, hd) for t in (q, k, v, do))
            outb, lseb = flash_fwd.flash_attn_forward(qb, kb, vb, **opts)
            dense = tflops(lambda: flash_bwd.flash_attn_backward(dob, qb, kb, vb, outb, lseb, **opts),
                           10 * 16384 * S * H * hd * (0.5 if causal else 1))
            print(f"varlen bwd hd{hd} {'causal' if causal else 'full'} max={S} ({len(lens)} seqs): " +
                  " ".join(f"{k} {v:.0f}" for k, v in r.items()) + f" ({r['gluon'] / r['triton']:.2f}x)"
                  f" | equal-length batch {dense:.0f}", flush=True)
