"""Session 28: the forward with each group's rows split between two 4-warp partitions (_hopper_fwd.py, HALVES = 2),
the same code at HALVES = 1, and 2b7a2b7 (scripts/head_fwd.py: git show 2b7a2b7:src/flashfuse/ops/group_norm_details/
_hopper_fwd.py); rounds alternating, bf16, graph-timed us; outputs vs head: bits, or the largest difference."""
import importlib, shutil
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same, timed
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
D = "src/flashfuse/ops/group_norm_details"
shutil.copy(f"{S}/head_fwd.py", f"{D}/_fv_head.py")
src = open(f"{D}/_hopper_fwd.py").read()
assert "\nHALVES = 2\n" in src
open(f"{D}/_fv_h1.py", "w").write(src.replace("\nHALVES = 2\n", "\nHALVES = 1\n"))
mods = {"head": importlib.import_module("flashfuse.ops.group_norm_details._fv_head"), "halves": G.hopper_fwd,
        "h1": importlib.import_module("flashfuse.ops.group_norm_details._fv_h1")}
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (4, 320, 128, 128)]:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(mods, lambda m: setattr(G, "hopper_fwd", m), f, 3)
        G.hopper_fwd = mods["halves"]
        cmp = []
        for name in ("halves", "h1"):
            same_bits = same(outs["head"], outs[name])
            cmp.append(f"{name}:" + ("same" if same_bits else f"{(outs[name][0].float() - outs['head'][0].float()).abs().max().item():.1e}"))
        print(f"{str(shape):18s} temb={int(temb)}  " + "  ".join(f"{k} {v:6.1f}" for k, v in t.items()) +
              f"  ({t['halves'] / t['head']:.3f})  " + " ".join(cmp) + f"  clone {timed(lambda: x.clone()):5.1f}",
              flush=True)
