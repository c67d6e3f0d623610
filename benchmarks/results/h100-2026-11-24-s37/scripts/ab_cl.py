"""Session 37 A/B: the channels_last Gluon GroupNorm forward, committed (cl_old.py) vs the working tree; bf16, graph-timed."""
import importlib, shutil, sys, torch
sys.path.insert(0, ".gpu")
shutil.copy(".gpu/cl_old.py", "src/flashfuse/ops/group_norm_details/_hopper_fwd_cl_old.py")
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
mods = {"old": importlib.import_module("flashfuse.ops.group_norm_details._hopper_fwd_cl_old"), "new": G.hopper_fwd_cl}
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (8, 320, 64, 64), (8, 640, 64, 64), (4, 320, 128, 128),
          (2, 320, 64, 64), (2, 640, 64, 64), (16, 320, 64, 64)]
tot = {k: 0.0 for k in mods}
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        x = x.contiguous(memory_format=torch.channels_last)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(mods, lambda m: setattr(G, "hopper_fwd_cl", m), ff, 3)
        el = "gluon" if mods["old"].eligible(x, 32, "silu", None if r is None else G._nchw_strides(G._expand_residual(r, x)), torch.empty_like(x)) else "triton"
        for k in mods: tot[k] += t[k]
        print(f"{str(shape):18s} temb={int(temb)} {el:6s} cl fwd old {t['old']:6.1f} new {t['new']:6.1f} "
              f"({t['new'] / t['old']:.3f}) {'same' if same(outs['old'], outs['new']) else 'DIFFER'} "
              f"clone {timed(lambda: x.clone()):5.1f}", flush=True)
G.hopper_fwd_cl = mods["new"]
print(f"sum old {tot['old']:.1f} new {tot['new']:.1f} ({tot['new'] / tot['old']:.3f})")
