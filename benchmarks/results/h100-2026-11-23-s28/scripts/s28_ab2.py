"""Session 28: the NCHW Gluon forward and backward with the loader's chunk order (a chunk of more than half the ring
waits for the previous chunk's last tile) vs the session's start (scripts/old_fwd.py, old_bwd.py); rounds alternating,
bf16, graph-timed us; outputs compared bit for bit."""
import importlib, shutil
import torch
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
D = "src/flashfuse/ops/group_norm_details"
shutil.copy(f"{S}/old_fwd.py", f"{D}/_fv_old.py")
shutil.copy(f"{S}/old_bwd.py", f"{D}/_bv_old.py")
fwd = {"old": importlib.import_module("flashfuse.ops.group_norm_details._fv_old"), "new": G.hopper_fwd}
bwd = {"old": importlib.import_module("flashfuse.ops.group_norm_details._bv_old"), "new": G.hopper_bwd}
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (8, 640, 64, 64),
          (4, 320, 128, 128), (2, 320, 64, 64)]
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        dy = torch.randn_like(x)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        y, mean, rstd = ff()
        fb = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        row = [f"{str(shape):18s} temb={int(temb)}"]
        for what, mods, fn in (("fwd", fwd, ff), ("bwd", bwd, fb)):
            outs, t = alternate(mods, lambda m, what=what: setattr(G, "hopper_" + what, m), fn, 3)
            setattr(G, "hopper_" + what, mods["new"])
            row.append(f"{what} old {t['old']:6.1f} new {t['new']:6.1f} ({t['new'] / t['old']:.3f}) "
                       f"{'same' if same(outs['old'], outs['new']) else 'DIFFER'}")
        row.append(f"clone {timed(lambda: x.clone()):5.1f}")
        print("  ".join(row), flush=True)
