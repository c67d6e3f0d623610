"""Session 35 A/B: the channels_last Gluon GroupNorm forward, committed vs per-warp slot releases; bf16, graph-timed."""
import sys, torch
sys.path.insert(0, ".gpu")
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
import warp_variants as W

cl = {"old": G.hopper_fwd_cl, "warp": W.cl_variant()}
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (8, 320, 64, 64), (8, 640, 64, 64), (4, 320, 128, 128),
          (2, 320, 64, 64), (16, 320, 64, 64)]
tot = {"old": 0.0, "warp": 0.0}
for shape in shapes:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        x = x.contiguous(memory_format=torch.channels_last)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(cl, lambda m: setattr(G, "hopper_fwd_cl", m), ff, 3)
        G.hopper_fwd_cl = cl["warp"]
        rep = all(same(outs["old"], [v.clone() for v in ff() if v is not None]) for _ in range(10))
        G.hopper_fwd_cl = cl["old"]
        el = "gluon" if cl["old"].eligible(x, 32, "silu", None if r is None else G._nchw_strides(G._expand_residual(r, x)), torch.empty_like(x)) else "triton"
        tot["old"] += t["old"]; tot["warp"] += t["warp"]
        print(f"{str(shape):18s} temb={int(temb)} {el:6s} cl fwd old {t['old']:6.1f} warp {t['warp']:6.1f} "
              f"({t['warp'] / t['old']:.3f}) {'same' if same(outs['old'], outs['warp']) else 'DIFFER'} "
              f"rep {'ok' if rep else 'DIFFER'}  clone {timed(lambda: x.clone()):5.1f}", flush=True)
print(f"sum old {tot['old']:.1f} warp {tot['warp']:.1f} ({tot['warp'] / tot['old']:.3f})")
