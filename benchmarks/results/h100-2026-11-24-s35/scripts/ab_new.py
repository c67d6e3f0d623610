"""Session 35 A/B: the Gluon GroupNorm kernels at HEAD (.gpu/old: the committed files) vs the working tree; first run (c3):
slot) vs the working tree (per-warp slot releases), one process, rounds alternating, bf16, graph-timed us."""
import shutil, importlib, sys, torch
sys.path.insert(0, ".gpu")
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
D = "src/flashfuse/ops/group_norm_details"
old = {}
for f, attr in (("_hopper_fwd", "hopper_fwd"), ("_hopper_bwd", "hopper_bwd"), ("_hopper_fwd_cl", "hopper_fwd_cl")):
    shutil.copy(f".gpu/old/{f}.py", f"{D}/_old{f}.py")
    old[attr] = importlib.import_module(f"flashfuse.ops.group_norm_details._old{f}")
new = {attr: getattr(G, attr) for attr in old}


def ab(attr, fn):
    mods = {"old": old[attr], "new": new[attr]}
    outs, t = alternate(mods, lambda m: setattr(G, attr, m), fn, 3)
    setattr(G, attr, new[attr])
    return t, same(outs["old"], outs["new"])


tot = {}
for layout in ("nchw", "cl"):
    shapes = ([(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (2, 320, 64, 64)]
              if layout == "nchw" else [(16, 640, 64, 64), (8, 320, 128, 128), (8, 320, 64, 64), (2, 320, 64, 64)])
    for shape in shapes:
        for temb in (False, True):
            x, w, b, r = gn_inputs(shape, temb)
            if layout == "cl":
                x = x.contiguous(memory_format=torch.channels_last)
            dy = torch.randn_like(x)
            ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
            y, mean, rstd = ff()
            fb = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
            row = [f"{layout:4s} {str(shape):18s} temb={int(temb)}"]
            runs = [("fwd", "hopper_fwd" if layout == "nchw" else "hopper_fwd_cl", ff)]
            if layout == "nchw":
                runs.append(("bwd", "hopper_bwd", fb))
            for name, attr, fn in runs:
                t, eq = ab(attr, fn)
                k = f"{layout} {name}"
                tot.setdefault(k, [0.0, 0.0])
                tot[k][0] += t["old"]; tot[k][1] += t["new"]
                row.append(f"{name} old {t['old']:6.1f} new {t['new']:6.1f} ({t['new'] / t['old']:.3f}) "
                           f"{'same' if eq else 'DIFFER'}")
            print("  ".join(row), flush=True)
for k, (o, n) in tot.items():
    print(f"sum {k}: old {o:.1f} new {n:.1f} ({n / o:.3f})")
