"""Session 32: the NCHW Gluon forward with two tiles of a chunk over half the ring held in registers (new, working
tree) vs the committed one (old); rounds alternating, bf16, graph-timed us; outputs compared bit for bit."""
import importlib, shutil, sys
import torch
import flashfuse.ops.group_norm as G
sys.path.insert(0, ".gpu/s32")
from s28_abtools import alternate, gn_inputs, same, timed
D = "src/flashfuse/ops/group_norm_details"
shutil.copy(".gpu/s32/old_fwd.py", f"{D}/_fv_old.py")
fwd = {"old": importlib.import_module("flashfuse.ops.group_norm_details._fv_old"), "new": G.hopper_fwd}
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 640, 64, 64), (4, 320, 128, 128),
          (8, 320, 64, 64), (2, 320, 64, 64)]
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(fwd, lambda m: setattr(G, "hopper_fwd", m), ff, 4)
        G.hopper_fwd = fwd["new"]
        print(f"{str(shape):18s} temb={int(temb)} fwd old {t['old']:6.1f} new {t['new']:6.1f} ({t['new'] / t['old']:.3f}) "
              f"{'same' if same(outs['old'], outs['new']) else 'DIFFER'}  clone {timed(lambda: x.clone()):5.1f}", flush=True)
