"""Session 24: the NCHW Gluon forward with groups split over programs that meet (new) vs before (whole groups only)
and the Triton plans; plus the Gluon backward vs Triton at the 16x16 levels; bf16, graph-timed, us."""
import importlib, json, os, shutil
import torch, triton
import flashfuse.ops.group_norm as G
shutil.copy(".gpu/fwd_before.py", "src/flashfuse/ops/group_norm_details/_fwd_before.py")
before = importlib.import_module("flashfuse.ops.group_norm_details._fwd_before")
new = G.hopper_fwd
out = os.environ.get("OUT", "/tmp")
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
for shape in [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32), (16, 1280, 16, 16), (2, 1280, 16, 16)]:
    for temb in (False, True):
        torch.manual_seed(0)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res = {"shape": shape, "temb": temb}
        G.HOPPER_FWD = False
        y0, m0, s0 = f(); res["triton"] = timed(f)
        G.HOPPER_FWD = True
        for name, mod in (("before", before), ("new", new)):
            G.hopper_fwd = mod
            ok = mod.eligible(x, 32, "silu", None if r is None else (C, 1, 0), torch.empty_like(x))
            if name == "new" and not ok:
                mod.MIN_FILL = 0.0
                res["forced"] = True
            y1, m1, s1 = f(); res[name] = timed(f)
            mod.MIN_FILL = 0.9
            res[name + "_took"] = ok or name == "new"
            res[name + "_err"] = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
        G.hopper_fwd = new
        y, mean, rstd = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        dy = torch.randn_like(y)
        bwd = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        G.HOPPER_BWD = False
        res["bwd_triton"] = timed(bwd)
        G.HOPPER_BWD = True
        forced = not G.hopper_bwd.plan(shape[0], C, shape[2] * shape[3], 32, 2, 132)
        G.hopper_bwd.MIN_FILL = 0.0
        res["bwd_gluon"] = timed(bwd); res["bwd_forced"] = forced
        G.hopper_bwd.MIN_FILL = 0.9
        res["clone"] = timed(lambda: x.clone())
        nb = 2 * x.numel() * 2
        rows.append(res)
        print(f"{str(shape):18s} temb={temb:d} fwd new {res['new']:6.1f}{'*' if res.get('forced') else ' '} ({nb / res['new'] / 3e6:4.0%}) before {res['before']:6.1f}{' ' if res['before_took'] else 'T'}"
              f" triton {res['triton']:6.1f} | bwd gluon {res['bwd_gluon']:6.1f}{'*' if forced else ' '} triton {res['bwd_triton']:6.1f} | clone {res['clone']:5.1f} err {res['new_err']:.1e}", flush=True)
json.dump(rows, open(f"{out}/fwd_ab.json", "w"), indent=1)
