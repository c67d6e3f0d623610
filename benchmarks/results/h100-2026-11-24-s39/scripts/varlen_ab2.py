"""Session 39: the varlen forward's kernel time (flash_fwd.flash_attn_forward, below the interface's host check of
cu_seqlens, CUDA-graph timed): Gluon persistent (static round-robin over cdiv(max, BLOCK_M) row blocks per
sequence) vs Gluon one tile per program vs the Triton kernel; and the equal-length batch through flash_attn_func."""
import math, torch
from triton.testing import do_bench_cudagraph
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_fwd
from flashfuse.bench.suites.attention import varlen_lengths

plan0 = flash_fwd._fast_forward_plan
MODE = {"m": "persistent"}


def plan(*a, **kw):
    cfg = plan0(*a, **kw)
    if cfg is not None and cfg.get("GLUON") and a[11] and MODE["m"] == "tiles":     # is_varlen
        cfg = dict(cfg, PERSISTENT=False, Q_STAGES=1)
    return cfg


flash_fwd._fast_forward_plan = plan


def tflops(fn, flops):
    fn()
    return flops / do_bench_cudagraph(fn, rep=60, return_mode="median") / 1e9


for hd in (64, 128):
    H = 2048 // hd
    for causal in (False, True):
        for S in (1024, 2048, 4096):
            lens = varlen_lengths(16384, S)
            cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
            q, k, v = (torch.randn(16384, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fl = sum(4 * H * n * n * hd * (0.5 if causal else 1) for n in lens)
            f = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1,
                                                     cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=S, max_seqlen_k=S)
            r = {}
            for m in ("persistent", "tiles"):
                MODE["m"] = m
                r[m] = tflops(f, fl)
            flash_fwd.GLUON_FORWARD = False
            r["triton"] = tflops(f, fl)
            flash_fwd.GLUON_FORWARD = True
            qb, kb, vb = (t.view(16384 // S, S, H, hd) for t in (q, k, v))
            dense = tflops(lambda: flash_attn_func(qb, kb, vb, causal=causal), 4 * 16384 * S * H * hd * (0.5 if causal else 1))
            print(f"varlen hd{hd} {'causal' if causal else 'full'} max={S} ({len(lens)} seqs): " +
                  " ".join(f"{k} {v:.0f}" for k, v in r.items()) + f" | equal-length batch {dense:.0f}", flush=True)
