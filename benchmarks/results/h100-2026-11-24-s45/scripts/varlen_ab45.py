"""Session 45: the varlen hd64 backward (flash_bwd.flash_attn_backward on a saved forward, CUDA-graph timed), S / dP
split by queries (QUERY_SPLIT) vs by keys, same process, rounds alternating. 16K tokens in sequences of [max / 8, max],
model dim 2048, bf16; gradients compared between the two."""
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_bwd, flash_fwd, flash_bwd_hopper as B
from flashfuse.bench.suites.attention import varlen_lengths

hd, H = 64, 32
base = dict(B.HOPPER_BWD_CONFIGS[64])
for causal in (False, True):
    for S in (1024, 2048, 4096, 8192):
        lens = varlen_lengths(16384, S)
        cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
        q, k, v, do = (torch.randn(16384, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        opts = dict(softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
        var = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=S, max_seqlen_k=S)
        out, lse = flash_fwd.flash_attn_forward(q, k, v, **opts, **var)
        fl = sum(10 * H * n * n * hd * (0.5 if causal else 1) for n in lens)
        f = lambda: flash_bwd.flash_attn_backward(do, q, k, v, out, lse, **opts, **var)
        res = {"keys": [], "queries": []}
        grads = {}
        for r in range(3):
            for name in (("keys", "queries") if r % 2 == 0 else ("queries", "keys")):
                B.HOPPER_BWD_CONFIGS[64] = dict(base, QUERY_SPLIT=name == "queries")
                grads[name] = [g.float() for g in f()]
                res[name].append(fl / do_bench_cudagraph(f, rep=60, return_mode="median") / 1e9)
        B.HOPPER_BWD_CONFIGS[64] = base
        err = max(((a - b).norm() / b.norm()).item() for a, b in zip(grads["queries"], grads["keys"]))
        print(f"varlen bwd hd64 {'causal' if causal else 'full  '} max={S} ({len(lens)} seqs): " +
              " ".join(f"{n}={'/'.join(f'{x:.0f}' for x in v)}" for n, v in res.items()) + f" rel diff {err:.1e}",
              flush=True)
