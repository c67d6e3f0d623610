"""Session 28: the forward with the next tile taken during this tile's exponentials (_hopper_fwd.py) vs 2b7a2b7
(git show 2b7a2b7:src/flashfuse/ops/group_norm_details/_hopper_fwd.py > scripts/head_fwd.py first); rounds alternating, bf16, graph-timed us, bits compared."""
import importlib, shutil
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
shutil.copy(f"{S}/head_fwd.py", "src/flashfuse/ops/group_norm_details/_fv_head.py")
mods = {"head": importlib.import_module("flashfuse.ops.group_norm_details._fv_head"), "new": G.hopper_fwd}
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (4, 320, 128, 128)]:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(mods, lambda m: setattr(G, "hopper_fwd", m), f, 4)
        G.hopper_fwd = mods["new"]
        same_bits = same(outs["head"], outs["new"])
        print(f"{str(shape):18s} temb={int(temb)}  head {t['head']:6.1f}  new {t['new']:6.1f}  "
              f"({t['new'] / t['head']:.3f})  {'same' if same_bits else 'DIFFER'}  clone {timed(lambda: x.clone()):5.1f}",
              flush=True)
