"""Session 28: the forward with each group's rows split between two 4-warp partitions (_hopper_fwd.py, HALVES = 2),
the same code at HALVES = 1, and 2b7a2b7 (scripts/head_fwd.py: git show 2b7a2b7:src/flashfuse/ops/group_norm_details/
_hopper_fwd.py); rounds alternating, bf16, graph-timed us; outputs vs head: bits, or the largest difference."""
import importlib, shutil
import torch, triton
import flashfuse.ops.group_norm as G
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
D = "src/flashfuse/ops/group_norm_details"
shutil.copy(f"{S}/head_fwd.py", f"{D}/_fv_head.py")
src = open(f"{D}/_hopper_fwd.py").read()
assert "\nHALVES = 2\n" in src
open(f"{D}/_fv_h1.py", "w").write(src.replace("\nHALVES = 2\n", "\nHALVES = 1\n"))
mods = {"head": importlib.import_module("flashfuse.ops.group_norm_details._fv_head"), "halves": G.hopper_fwd,
        "h1": importlib.import_module("flashfuse.ops.group_norm_details._fv_h1")}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (4, 320, 128, 128)]:
    for temb in (False, True):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = (1 + 0.1 * torch.randn(C, device="cuda")).bfloat16(); b = (0.1 * torch.randn(C, device="cuda")).bfloat16()
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        outs, t = {}, {k: [] for k in mods}
        for rnd in range(3):
            for name, m in (list(mods.items()) if rnd % 2 == 0 else list(reversed(mods.items()))):
                G.hopper_fwd = m
                outs[name] = [v.clone() for v in f()]
                t[name].append(timed(f))
        G.hopper_fwd = mods["halves"]
        cmp = []
        for name in ("halves", "h1"):
            same = all(torch.equal(a, b) for a, b in zip(outs["head"], outs[name]))
            cmp.append(f"{name}:" + ("same" if same else f"{(outs[name][0].float() - outs['head'][0].float()).abs().max().item():.1e}"))
        print(f"{str(shape):18s} temb={int(temb)}  " + "  ".join(f"{k} {min(v):6.1f}" for k, v in t.items()) +
              f"  ({min(t['halves']) / min(t['head']):.3f})  " + " ".join(cmp) + f"  clone {timed(lambda: x.clone()):5.1f}",
              flush=True)
