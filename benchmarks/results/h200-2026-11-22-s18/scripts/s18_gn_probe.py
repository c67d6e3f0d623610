"""Session 18: the Gluon GroupNorm forward (group_norm_details/_hopper_fwd.py) vs the Triton plans (HOPPER_FWD off)
and x.clone(), bf16 NCHW, graph-timed, same run; with and without the (N, C, 1, 1) time embedding; fwd+bwd too."""
import json, os, sys, time
import torch, triton
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm import group_norm
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
SHAPES = [(2, 320, 64, 64), (16, 1280, 32, 32), (16, 640, 64, 64), (8, 320, 64, 64), (2, 640, 64, 64),
          (4, 1280, 32, 32), (8, 640, 32, 32), (8, 320, 128, 128)]
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
t0 = time.time()
for shape in SHAPES:
    for temb in (False, True):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        nbytes = 2 * x.numel() * 2
        pct = lambda us: nbytes / (us * 1e-6) / 1e9 / CEIL
        res = {"shape": shape, "temb": temb}
        G.HOPPER_FWD = True
        eligible = G.hopper_fwd.eligible(x, 32, "silu", None if r is None else (C, 1, 0), x)
        y1, m1, r1 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res["hopper"] = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
        G.HOPPER_FWD = False
        y0, m0, r0 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res["default"] = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
        res["clone"] = timed(lambda: x.clone())
        res["err"] = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
        # fwd+bwd (dx, dw, db, dtemb), 3 reads + 1 write of the tensor size in the backward
        xl = x.detach().requires_grad_(); wl = w.detach().requires_grad_(); bl = b.detach().requires_grad_()
        rl = None if r is None else r.detach().requires_grad_()
        dy = torch.randn_like(x)
        def step():
            y = group_norm(xl, 32, wl, bl, 1e-5, "silu", rl)
            torch.autograd.grad(y, [t for t in (xl, wl, bl, rl) if t is not None], dy)
        for flag, key in ((True, "hopper_fb"), (False, "default_fb")):
            G.HOPPER_FWD = flag
            step()
            res[key] = timed(step)
        fb_bytes = 6 * x.numel() * 2
        pfb = lambda us: fb_bytes / (us * 1e-6) / 1e9 / CEIL
        res["eligible"] = eligible
        rows.append(res)
        print(f"{str(shape):18s} temb={temb:d} elig={eligible:d} fwd hopper {res['hopper']:6.1f} us {pct(res['hopper']):5.1%} "
              f"default {res['default']:6.1f} {pct(res['default']):5.1%} clone {res['clone']:6.1f} {pct(res['clone']):5.1%} "
              f"err {res['err']:.1e} | fwd+bwd hopper {res['hopper_fb']:6.1f} {pfb(res['hopper_fb']):5.1%} "
              f"default {res['default_fb']:6.1f} {pfb(res['default_fb']):5.1%}", flush=True)
json.dump({"rows": rows}, open(f"{out}/gn_probe.json", "w"), indent=1, default=str)
print(f"done {time.time() - t0:.0f} s")
