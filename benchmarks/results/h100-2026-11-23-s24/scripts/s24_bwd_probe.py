"""Session 24: the NCHW Gluon backward vs the Triton plans, same run; bf16, graph-timed (us); dx vs Triton."""
import json, os, sys
import torch, triton
import flashfuse.ops.group_norm as G
out = os.environ.get("OUT", "/tmp")
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
shapes = [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)]
for shape in shapes:
    for temb in (False, True):
        torch.manual_seed(0)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        y, mean, rstd = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        dy = torch.randn_like(y)
        bwd = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        fwd = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res = {"shape": shape, "temb": temb}
        G.HOPPER_BWD = False
        g0 = bwd(); res["triton_bwd"] = timed(bwd)
        G.HOPPER_BWD = True
        g1 = bwd(); res["gluon_bwd"] = timed(bwd)
        res["fwd"] = timed(fwd)
        res["errs"] = [None if a is None else ((a.float() - b_.float()).norm() / b_.float().norm()).item() for a, b_ in zip(g1, g0)]
        res["clone"] = timed(lambda: x.clone())
        nb = x.numel() * 2
        f = lambda t: 3 * nb / t / 3e6
        ff = lambda t: 5 * nb / t / 3e6
        rows.append(res)
        print(f"{str(shape):18s} temb={temb:d} bwd gluon {res['gluon_bwd']:6.1f} ({f(res['gluon_bwd']):4.0%}) triton {res['triton_bwd']:6.1f} ({f(res['triton_bwd']):4.0%})"
              f" | fwd {res['fwd']:6.1f} fwd+bwd {ff(res['fwd'] + res['gluon_bwd']):4.0%} (was {ff(res['fwd'] + res['triton_bwd']):4.0%})"
              f" clone {res['clone']:5.1f} errs " + " ".join("-" if e is None else f"{e:.1e}" for e in res["errs"]), flush=True)
json.dump(rows, open(f"{out}/bwd_probe.json", "w"), indent=1)
