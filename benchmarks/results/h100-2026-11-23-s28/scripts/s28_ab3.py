"""Session 28: forward variants vs the committed forward (rounds alternating, bf16, graph-timed us, bits compared):
pairs (scripts/pairs.patch applied to a copy of 2b7a2b7's _hopper_fwd.py saved as _fv_pairs.py beside it: two
tiles per pass-3 iteration)."""
import importlib
import flashfuse.ops.group_norm as G
from s28_abtools import alternate, gn_inputs, same
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
mods = {"head": G.hopper_fwd, "pairs": importlib.import_module("flashfuse.ops.group_norm_details._fv_pairs")}
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (4, 320, 128, 128)]:
    for temb in (False, True):
        x, w, b, r = gn_inputs(shape, temb)
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = alternate(mods, lambda m: setattr(G, "hopper_fwd", m), f, 4)
        G.hopper_fwd = mods["head"]
        row = [f"{str(shape):18s} temb={int(temb)}"] + [f"{k} {v:6.1f}" for k, v in t.items()]
        row.append("same" if same(outs["head"], outs["pairs"]) else "DIFFER")
        print("  ".join(row), flush=True)
