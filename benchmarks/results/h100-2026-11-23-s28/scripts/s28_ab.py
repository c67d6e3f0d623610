"""Session 28: the NCHW Gluon forward, new (_hopper_fwd.py) vs old (the file at the session's start, scripts/old_fwd.py),
rounds alternating, bf16, graph-timed us; outputs compared bit for bit."""
import importlib, shutil, sys
import torch, triton
import flashfuse.ops.group_norm as G
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
shutil.copy(f"{S}/old_fwd.py", "src/flashfuse/ops/group_norm_details/_fv_old.py")
src = open("src/flashfuse/ops/group_norm_details/_hopper_fwd.py").read()
WAIT = "            if k > 0 and 2 * n_tiles > SLOTS:"
assert WAIT in src
open("src/flashfuse/ops/group_norm_details/_fv_nowait.py", "w").write(src.replace(WAIT, "            if k < 0:"))
mods = {"old": importlib.import_module("flashfuse.ops.group_norm_details._fv_old"), "new": G.hopper_fwd,
        "nowait": importlib.import_module("flashfuse.ops.group_norm_details._fv_nowait")}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (8, 640, 64, 64),
          (4, 320, 128, 128), (12, 640, 40, 40)]
for shape in shapes:
    for temb in (False, True):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = (1 + 0.1 * torch.randn(C, device="cuda")).bfloat16(); b = (0.1 * torch.randn(C, device="cuda")).bfloat16()
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = {}, {k: [] for k in mods}
        for rnd in range(3):
            for name, m in (list(mods.items()) if rnd % 2 == 0 else list(reversed(mods.items()))):
                G.hopper_fwd = m
                outs[name] = [v.clone() for v in f()]
                t[name].append(timed(f))
        G.hopper_fwd = mods["new"]
        same = all(torch.equal(a, b) for o in ("new", "nowait") for a, b in zip(outs["old"], outs[o]))
        eligible = mods["new"].eligible(x, 32, "silu", None if r is None else (C, 1, 0), outs["new"][0])
        print(f"{str(shape):18s} temb={int(temb)} gluon={int(eligible)} old {min(t['old']):6.1f}  new {min(t['new']):6.1f}  "
              f"({min(t['new']) / min(t['old']):.3f})  nowait {min(t['nowait']):6.1f}  bits {'same' if same else 'DIFFER'}  clone {timed(lambda: x.clone()):5.1f}", flush=True)
