"""Session 28: forward variants vs the committed forward (rounds alternating, bf16, graph-timed us, bits compared):
pairs (scripts/pairs.patch applied to a copy of 2b7a2b7's _hopper_fwd.py saved as _fv_pairs.py beside it: two
tiles per pass-3 iteration)."""
import importlib, runpy
import torch, triton
import flashfuse.ops.group_norm as G
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
mods = {"head": G.hopper_fwd, "pairs": importlib.import_module("flashfuse.ops.group_norm_details._fv_pairs")}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (4, 320, 128, 128)]:
    for temb in (False, True):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = (1 + 0.1 * torch.randn(C, device="cuda")).bfloat16(); b = (0.1 * torch.randn(C, device="cuda")).bfloat16()
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = {}, {k: [] for k in mods}
        for rnd in range(4):
            for name, m in (list(mods.items()) if rnd % 2 == 0 else list(reversed(mods.items()))):
                G.hopper_fwd = m
                outs[name] = [v.clone() for v in f()]
                t[name].append(timed(f))
        G.hopper_fwd = mods["head"]
        row = [f"{str(shape):18s} temb={int(temb)}"] + [f"{k} {min(v):6.1f}" for k, v in t.items()]
        row.append("same" if all(torch.equal(a, b) for a, b in zip(outs["head"], outs["pairs"])) else "DIFFER")
        print("  ".join(row), flush=True)
