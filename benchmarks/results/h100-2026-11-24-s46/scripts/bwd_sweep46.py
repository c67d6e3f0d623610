"""Session 46: the Gluon backward at head dims 72 / 80 / 96 as 64 columns + a 16 / 32-column tail (TAIL_DIM in the
transposed-scores kernel) vs the same kernel padded to 128 (the route before), with two or three stages, vs cuDNN's
backward, bf16, 16384 tokens, heads = round(2048 / hd). flashfuse timed as flash_bwd.flash_attn_backward
(preprocess, kernel, dQ cast) CUDA-graph; cuDNN as SDPA's autograd backward, eager (do_bench). Rounds alternate;
gradients checked against the padded route."""
import os, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench, do_bench_cudagraph
from flashfuse.ops.attention import flash_bwd, flash_bwd_hopper as B, flash_fwd
from flashfuse.ops.attention.flash_fwd_hopper import forward_head_dim

TABLE = {d: dict(c) for d, c in B.HOPPER_BWD_CONFIGS.items()}
VARIANTS = {
    "pad128": lambda w: dict(TABLE[128]),
    "tail": lambda w: dict(TABLE[w]),
    "tail_s3": lambda w: dict(TABLE[w], NUM_STAGES=3),
}
dims = [int(x) for x in os.environ.get("DIMS", "80,96,72").split(",")]
seqs = [int(x) for x in os.environ.get("SEQS", "1024,2048,4096,8192").split(",")]
rounds = int(os.environ.get("ROUNDS", "3"))
for S in seqs:
    for hd in dims:
        Hh = round(2048 / hd); Bn = 16384 // S
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(hd)
            q, k, v = (torch.randn(Bn, S, Hh, hd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
            scale = hd ** -0.5
            right = 0 if causal else -1
            out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=right)[:2]
            fl = 2.5 * 4 * Bn * Hh * S * S * hd * (0.5 if causal else 1)
            names = list(VARIANTS) + ["cudnn"]
            res = {n: [] for n in names}
            ref = None
            for r in range(rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    try:
                        if name == "cudnn":
                            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
                            dt = dout.transpose(1, 2)
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                            fn = lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
                            fn(); torch.cuda.synchronize()
                            ms = do_bench(fn, rep=100, return_mode="median")
                        else:
                            B.HOPPER_BWD_CONFIGS[forward_head_dim(hd)] = VARIANTS[name](forward_head_dim(hd))
                            fn = lambda: flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale,
                                                                       window_right=right)
                            grads = fn(); torch.cuda.synchronize()
                            if ref is None:
                                ref = grads
                            for gname, a, b in zip("qkv", grads, ref):
                                err = ((a.float() - b.float()).norm() / b.float().norm()).item()
                                assert err < 1e-2, f"d{gname} rel err {err:.2e}"
                            ms = do_bench_cudagraph(fn, rep=60, return_mode="median")
                        res[name].append(fl / ms * 1e-9)
                    except Exception as e:  # noqa: BLE001
                        print(f"  {name} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        res[name].append(float("nan"))
            B.HOPPER_BWD_CONFIGS.update({d: dict(c) for d, c in TABLE.items()})
            print(f"hd{hd} S={S} {'causal' if causal else 'full  '} " +
                  " ".join(f"{n}={'/'.join(f'{x:.0f}' for x in v)}" for n, v in res.items()), flush=True)
