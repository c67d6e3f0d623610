"""Session 28: the NCHW Gluon forward, new (_hopper_fwd.py) vs old (the file at the session's start, scripts/old_fwd.py),
rounds alternating, bf16, graph-timed us; outputs compared bit for bit."""
import importlib, shutil
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
shutil.copy(f"{S}/old_fwd.py", "src/flashfuse/ops/group_norm_details/_fv_old.py")
src = open("src/flashfuse/ops/group_norm_details/_hopper_fwd.py").read()
WAIT = "            if k > 0 and 2 * n_tiles > SLOTS:"
assert WAIT in src
open("src/flashfuse/ops/group_norm_details/_fv_nowait.py", "w").write(src.replace(WAIT, "            if k < 0:"))
mods = {"old": importlib.import_module("flashfuse.ops.group_norm_details._fv_old"), "new": G.hopper_fwd,
        "nowait": importlib.import_module("flashfuse.ops.group_norm_details._fv_nowait")}
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (8, 640, 64, 64),
          (4, 320, 128, 128), (12, 640, 40, 40)]
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(mods, lambda m: setattr(G, "hopper_fwd", m), f, 3)
        G.hopper_fwd = mods["new"]
        same_bits = same(outs["old"], outs["new"]) and same(outs["old"], outs["nowait"])
        eligible = mods["new"].eligible(x, 32, "silu", None if r is None else (C, 1, 0), outs["new"][0])
        print(f"{str(shape):18s} temb={int(temb)} gluon={int(eligible)} old {t['old']:6.1f}  new {t['new']:6.1f}  "
              f"({t['new'] / t['old']:.3f})  nowait {t['nowait']:6.1f}  bits {'same' if same_bits else 'DIFFER'}  clone {timed(lambda: x.clone()):5.1f}", flush=True)
