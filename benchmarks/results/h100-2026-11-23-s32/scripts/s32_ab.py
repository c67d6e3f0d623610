"""Session 32: NCHW Gluon GroupNorm, A/B in one process, rounds alternating, bf16, graph-timed us.
fwd: committed (old) vs 'always' (every chunk's first tile waits for the previous chunk's last tile to land, not only
chunks over half the ring). bwd: committed (old) vs new (dz rounded and written over dy in the sums pass; the dx pass
runs no activation). Outputs: fwd bits compared; bwd relative error new vs old and both vs float64."""
import importlib, shutil, sys
import torch
import flashfuse.ops.group_norm as G
from flashfuse.reference.group_norm import group_norm_ref
sys.path.insert(0, ".gpu/s32")
from s28_abtools import alternate, gn_inputs, same, timed
D = "src/flashfuse/ops/group_norm_details"
shutil.copy(".gpu/s32/old_bwd.py", f"{D}/_bv_old.py")
src = open(f"{D}/_hopper_fwd.py").read()
WAIT = "        if k > 0 and 2 * n_tiles > SLOTS:"
assert WAIT in src
open(f"{D}/_fv_always.py", "w").write(src.replace(WAIT, "        if k > 0:"))
fwd = {"old": G.hopper_fwd, "always": importlib.import_module("flashfuse.ops.group_norm_details._fv_always")}
bwd = {"old": importlib.import_module("flashfuse.ops.group_norm_details._bv_old"), "new": G.hopper_bwd}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (8, 640, 64, 64),
          (4, 320, 128, 128), (2, 320, 64, 64), (8, 1280, 32, 32)]
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        dy = torch.randn_like(x)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        y, mean, rstd = ff()
        fb = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        row = [f"{str(shape):18s} temb={int(temb)}"]
        outs, t = alternate(fwd, lambda m: setattr(G, "hopper_fwd", m), ff, 3)
        G.hopper_fwd = fwd["old"]
        row.append(f"fwd old {t['old']:6.1f} always {t['always']:6.1f} ({t['always'] / t['old']:.3f}) "
                   f"{'same' if same(outs['old'], outs['always']) else 'DIFFER'}")
        outs, t = alternate(bwd, lambda m: setattr(G, "hopper_bwd", m), fb, 3)
        G.hopper_bwd = bwd["new"]
        # float64 reference gradients (the same dy) for dx
        xl = x.double().requires_grad_()
        rl = None if r is None else r.double().requires_grad_()
        yr = group_norm_ref(xl, 32, w.double(), b.double(), 1e-5, "silu", rl)
        yr.backward(dy.double())
        e_old, e_new = rel(outs["old"][0], xl.grad), rel(outs["new"][0], xl.grad)
        row.append(f"bwd old {t['old']:6.1f} new {t['new']:6.1f} ({t['new'] / t['old']:.3f}) "
                   f"dx err old {e_old:.1e} new {e_new:.1e} new-vs-old {rel(outs['new'][0], outs['old'][0]):.1e}")
        row.append(f"clone {timed(lambda: x.clone()):5.1f}")
        print("  ".join(row), flush=True)
