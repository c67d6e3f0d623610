"""Session 49: deterministic=True's backward on the one-pass Gluon kernel with dQ's adds ordered (DQ_ORDER;
gluon_det), on the two Gluon passes (dK / dV without the dQ product, then the dQ pass; gluon_2pass) vs the route it
replaced (flash_bwd's Triton grid: GLUON_BACKWARD off) vs the one-pass Gluon kernel
(deterministic=False, dQ by TMA reduce-adds); bf16, 16384 tokens, heads = 2048 / hd, flash_bwd.flash_attn_backward
(preprocess, kernels, dQ cast) CUDA-graph timed (do_bench_cudagraph, median), rounds alternate the order. Each
route's gradients against the Triton grid's (rel. error), the Gluon passes twice bit-identical."""
import os, torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_bwd, flash_bwd_hopper as B, flash_fwd

dims = [int(x) for x in os.environ.get("DIMS", "64,128").split(",")]
seqs = [int(x) for x in os.environ.get("SEQS", "1024,2048,4096,8192").split(",")]
rounds = int(os.environ.get("ROUNDS", "2"))
ROUTES = {"gluon_det": (True, True), "gluon_2pass": (True, True), "triton_det": (False, True),
          "gluon_1pass": (True, False)}
ORDERED = dict(B.HOPPER_BWD_ORDERED_CONFIGS)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


print(f"{'hd':>4} {'S':>5} {'mask':>6} " + " ".join(f"{n:>12}" for n in ROUTES) + "  (TFLOP/s)  det/triton  det/1pass  det/2pass")
for hd in dims:
    for S in seqs:
        for causal in (False, True):
            H, Bn = 2048 // hd, 16384 // S
            g = torch.Generator(device="cuda").manual_seed(hd + S)
            q, k, v, dout = (torch.randn(Bn, S, H, hd, device="cuda", dtype=torch.bfloat16, generator=g)
                             for _ in range(4))
            opts = dict(softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
            out, lse = flash_fwd.flash_attn_forward(q, k, v, **opts)
            flops = 2.5 * 4 * Bn * H * S * S * hd * (0.5 if causal else 1)
            res, grads = {n: [] for n in ROUTES}, {}
            for r in range(rounds):
                for name in (list(ROUTES) if r % 2 == 0 else list(ROUTES)[::-1]):
                    gluon, det = ROUTES[name]
                    flash_bwd.GLUON_BACKWARD = gluon
                    B.HOPPER_BWD_ORDERED_CONFIGS.clear()
                    if name != "gluon_2pass":
                        B.HOPPER_BWD_ORDERED_CONFIGS.update(ORDERED)
                    fn = lambda: flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, deterministic=det, **opts)
                    first = fn()
                    if name in ("gluon_det", "gluon_2pass"):
                        again = fn()
                        assert all(torch.equal(a, b) for a, b in zip(first, again)), f"{name} not bit-identical"
                    grads[name] = first
                    torch.cuda.synchronize()
                    res[name].append(do_bench_cudagraph(fn, rep=100, return_mode="median"))
            flash_bwd.GLUON_BACKWARD = True
            B.HOPPER_BWD_ORDERED_CONFIGS.update(ORDERED)
            errs = {n: max(rel(a, b) for a, b in zip(grads[n], grads["triton_det"])) for n in ROUTES}
            tf = {n: flops / (sorted(v)[len(v) // 2] * 1e-3) / 1e12 for n, v in res.items()}
            print(f"{hd:>4} {S:>5} {'causal' if causal else 'full':>6} "
                  + " ".join(f"{tf[n]:>12.1f}" for n in ROUTES)
                  + f"  {tf['gluon_det'] / tf['triton_det']:>10.2f}x {tf['gluon_det'] / tf['gluon_1pass']:>9.2f}x"
                  + f" {tf['gluon_det'] / tf['gluon_2pass']:>9.2f}x  err {errs['gluon_det']:.1e} / "
                  + f"{errs['gluon_2pass']:.1e} / {errs['gluon_1pass']:.1e}", flush=True)
