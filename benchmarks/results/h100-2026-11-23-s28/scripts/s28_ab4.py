"""Session 28: the forward with the next tile taken during this tile's exponentials (_hopper_fwd.py) vs 2b7a2b7
(git show 2b7a2b7:src/flashfuse/ops/group_norm_details/_hopper_fwd.py > scripts/head_fwd.py first); rounds alternating, bf16, graph-timed us, bits compared."""
import importlib, shutil
import torch, triton
import flashfuse.ops.group_norm as G
S = "benchmarks/results/h100-2026-11-23-s28/scripts"
shutil.copy(f"{S}/head_fwd.py", "src/flashfuse/ops/group_norm_details/_fv_head.py")
mods = {"head": importlib.import_module("flashfuse.ops.group_norm_details._fv_head"), "new": G.hopper_fwd}
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
        G.hopper_fwd = mods["new"]
        same = all(torch.equal(a, b) for a, b in zip(outs["head"], outs["new"]))
        print(f"{str(shape):18s} temb={int(temb)}  head {min(t['head']):6.1f}  new {min(t['new']):6.1f}  "
              f"({min(t['new']) / min(t['head']):.3f})  {'same' if same else 'DIFFER'}  clone {timed(lambda: x.clone()):5.1f}",
              flush=True)
