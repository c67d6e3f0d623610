"""Session 48: softcap (Gemma-2's 50.0), or with MOD=alibi ALiBi (the standard slopes), on the Gluon kernels vs the Triton kernels that took it before, vs the same
Gluon kernels without a softcap, vs compiled FlexAttention with the softcap score_mod; bf16, 16384 tokens, heads =
2048 / hd. Forward as flash_fwd.flash_attn_forward, backward as flash_bwd.flash_attn_backward (preprocess, kernel,
dQ cast), both CUDA-graph timed (do_bench_cudagraph, median); Flex eager (do_bench: its forward, or its autograd
backward). At hd64 the backward also as the row layout (HOPPER_BWD_SCORE_MOD_CONFIGS emptied), which spills under a
softcap. Rounds alternate the order; outputs / gradients of every route checked against the first. (gluon_nocap:
the kernels without the score mod.)"""
import os, torch
from triton.testing import do_bench, do_bench_cudagraph
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from flashfuse.ops.attention import flash_bwd, flash_bwd_hopper as B, flash_fwd

CAP = 50.0
ALIBI = os.environ.get("MOD") == "alibi"
dims = [int(x) for x in os.environ.get("DIMS", "64,128,256").split(",")]
seqs = [int(x) for x in os.environ.get("SEQS", "2048,4096").split(",")]
rounds = int(os.environ.get("ROUNDS", "3"))
flex = torch.compile(flex_attention)
TABLE = dict(B.HOPPER_BWD_SCORE_MOD_CONFIGS)


def route(name, slopes):
    """The score mod's keyword arguments for this route."""
    flash_fwd.GLUON_FORWARD = not name.startswith("triton")
    flash_bwd.GLUON_BACKWARD = not name.startswith("triton")
    B.HOPPER_BWD_SCORE_MOD_CONFIGS.clear()
    if name != "gluon_rows":
        B.HOPPER_BWD_SCORE_MOD_CONFIGS.update(TABLE)
    if name == "gluon_nocap":
        return {}
    return dict(alibi_slopes=slopes) if ALIBI else dict(softcap=CAP)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


for S in seqs:
    for hd in dims:
        H, Bn = 2048 // hd, 16384 // S
        for causal in (True, False):
            g = torch.Generator(device="cuda").manual_seed(hd + S)
            q, k, v = (torch.randn(Bn, S, H, hd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            dout = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
            scale, right = hd ** -0.5, (0 if causal else -1)
            fl = 4 * Bn * H * S * S * hd * (0.5 if causal else 1)
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S) if causal else None
            qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_() for x in (q, k, v))
            slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device="cuda", dtype=torch.float32) / H)

            if ALIBI:
                def score_mod(score, b, h, qi, ki):
                    return score - slopes[h] * (qi - ki).abs()
            else:
                def score_mod(score, b, h, qi, ki):
                    return CAP * torch.tanh(score / CAP)
            for mode in ("fwd", "bwd"):
                names = ["gluon", "gluon_nocap", "triton", "flex"] + (["gluon_rows"] if hd == 64 and mode == "bwd"
                                                                      else [])
                res = {n: [] for n in names}
                ref = None
                for r in range(rounds):
                    for name in (names if r % 2 == 0 else names[::-1]):
                        try:
                            if name == "flex":
                                o = flex(qt, kt, vt, score_mod=score_mod, block_mask=mask)
                                if mode == "fwd":
                                    def fn():
                                        with torch.no_grad():
                                            return flex(qt, kt, vt, score_mod=score_mod, block_mask=mask)
                                else:
                                    dt = dout.transpose(1, 2)
                                    fn = lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True)
                                fn(); torch.cuda.synchronize()
                                ms = do_bench(fn, rep=100, return_mode="median")
                            else:
                                mod = route(name, slopes)
                                fwd = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale,
                                                                           window_right=right, **mod)
                                if mode == "fwd":
                                    fn = fwd
                                else:
                                    out, lse = fwd()[:2]
                                    fn = lambda: flash_bwd.flash_attn_backward(dout, q, k, v, out, lse,
                                                                               softmax_scale=scale, window_right=right,
                                                                               **mod)
                                res_t = fn(); torch.cuda.synchronize()
                                if name != "gluon_nocap":
                                    res_t = res_t[:1] if mode == "fwd" else res_t
                                    if ref is None:
                                        ref = res_t
                                    for a, b in zip(res_t, ref):
                                        assert rel(a, b) < 1e-2, f"{name} rel err {rel(a, b):.2e}"
                                ms = do_bench_cudagraph(fn, rep=60, return_mode="median")
                            res[name].append(fl * (2.5 if mode == "bwd" else 1) / ms * 1e-9)
                        except Exception as e:  # noqa: BLE001
                            print(f"  {name} failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
                            res[name].append(float("nan"))
                route("gluon", slopes)
                print(f"{mode} hd{hd} S={S} {'causal' if causal else 'full  '} " +
                      " ".join(f"{n}={'/'.join(f'{x:.0f}' for x in v)}" for n, v in res.items()), flush=True)
