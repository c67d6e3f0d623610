"""Session 35 A/B: committed Gluon GroupNorm kernels vs per-warp slot releases (warp_variants.py), bf16, graph-timed
us, rounds alternating; outputs compared bit for bit, the variant's run 10 more times (a race would show)."""
import sys, torch
sys.path.insert(0, ".gpu")
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
import warp_variants as W

fwd = {"old": G.hopper_fwd, "warp": W.fwd_variant()}
bwd = {"old": G.hopper_bwd, "warp": W.bwd_variant()}
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (8, 640, 64, 64),
          (4, 320, 128, 128), (2, 320, 64, 64), (8, 1280, 32, 32)]
tot = {"fo": 0, "fw": 0, "bo": 0, "bw": 0}
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        dy = torch.randn_like(x)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        y, mean, rstd = ff()
        fb = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        row = [f"{str(shape):18s} temb={int(temb)}"]
        outs, t = alternate(fwd, lambda m: setattr(G, "hopper_fwd", m), ff, 3)
        G.hopper_fwd = fwd["warp"]
        rep = all(same(outs["old"], [v.clone() for v in ff() if v is not None]) for _ in range(10))
        G.hopper_fwd = fwd["old"]
        row.append(f"fwd old {t['old']:6.1f} warp {t['warp']:6.1f} ({t['warp'] / t['old']:.3f}) "
                   f"{'same' if same(outs['old'], outs['warp']) else 'DIFFER'} rep {'ok' if rep else 'DIFFER'}")
        tot["fo"] += t["old"]; tot["fw"] += t["warp"]
        outs, t = alternate(bwd, lambda m: setattr(G, "hopper_bwd", m), fb, 3)
        G.hopper_bwd = bwd["warp"]
        rep = all(same(outs["old"], [v.clone() for v in fb() if v is not None]) for _ in range(10))
        G.hopper_bwd = bwd["old"]
        tot["bo"] += t["old"]; tot["bw"] += t["warp"]
        row.append(f"bwd old {t['old']:6.1f} warp {t['warp']:6.1f} ({t['warp'] / t['old']:.3f}) "
                   f"{'same' if same(outs['old'], outs['warp']) else 'DIFFER'} rep {'ok' if rep else 'DIFFER'}")
        row.append(f"clone {timed(lambda: x.clone()):5.1f}")
        print("  ".join(row), flush=True)
print(f"sum fwd old {tot['fo']:.1f} warp {tot['fw']:.1f} ({tot['fw'] / tot['fo']:.3f}); "
      f"bwd old {tot['bo']:.1f} warp {tot['bw']:.1f} ({tot['bw'] / tot['bo']:.3f})", flush=True)
