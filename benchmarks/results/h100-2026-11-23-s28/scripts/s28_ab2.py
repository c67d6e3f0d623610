"""Session 28: the NCHW Gluon forward and backward with the loader's chunk order (a chunk of more than half the ring
waits for the previous chunk's last tile) vs the session's start (scripts/old_fwd.py, old_bwd.py); rounds alternating,
bf16, graph-timed us; outputs compared bit for bit."""
import importlib, shutil
import torch, triton
import flashfuse.ops.group_norm as G
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
D = "src/flashfuse/ops/group_norm_details"
shutil.copy(f"{S}/old_fwd.py", f"{D}/_fv_old.py")
shutil.copy(f"{S}/old_bwd.py", f"{D}/_bv_old.py")
fwd = {"old": importlib.import_module("flashfuse.ops.group_norm_details._fv_old"), "new": G.hopper_fwd}
bwd = {"old": importlib.import_module("flashfuse.ops.group_norm_details._bv_old"), "new": G.hopper_bwd}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (8, 640, 64, 64),
          (4, 320, 128, 128), (2, 320, 64, 64)]
for shape in shapes:
    for temb in (False, True):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
        C = shape[1]; w = (1 + 0.1 * torch.randn(C, device="cuda")).bfloat16(); b = (0.1 * torch.randn(C, device="cuda")).bfloat16()
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        dy = torch.randn_like(x)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        y, mean, rstd = ff()
        fb = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        row = [f"{str(shape):18s} temb={int(temb)}"]
        for what, mods, fn in (("fwd", fwd, ff), ("bwd", bwd, fb)):
            outs, t = {}, {k: [] for k in mods}
            for rnd in range(3):
                for name, m in (list(mods.items()) if rnd % 2 == 0 else list(reversed(mods.items()))):
                    setattr(G, "hopper_" + what, m)
                    outs[name] = [v.clone() for v in fn() if v is not None]
                    t[name].append(timed(fn))
            setattr(G, "hopper_" + what, mods["new"])
            same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"]))
            row.append(f"{what} old {min(t['old']):6.1f} new {min(t['new']):6.1f} ({min(t['new']) / min(t['old']):.3f}) "
                       f"{'same' if same else 'DIFFER'}")
        row.append(f"clone {timed(lambda: x.clone()):5.1f}")
        print("  ".join(row), flush=True)
