"""Session 28: the forward with and without weight / bias (no per-row affine loads), base and nofence; graph-timed us."""
import importlib
import torch, triton
import flashfuse.ops.group_norm as G
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
src = open("src/flashfuse/ops/group_norm_details/_hopper_fwd.py").read()
a = "                fence_async_shared()      # these generic reads"
assert a in src
open("src/flashfuse/ops/group_norm_details/_fv_nofence.py", "w").write(src.replace(a, "                # (no fence)"))
mods = {"base": G.hopper_fwd, "nofence": importlib.import_module("flashfuse.ops.group_norm_details._fv_nofence")}
for shape in [(16, 640, 64, 64), (16, 1280, 32, 32)]:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda").bfloat16(); b = torch.randn(C, device="cuda").bfloat16()
    row = [str(shape)]
    for name, m in mods.items():
        G.hopper_fwd = m
        row.append(f"{name} w,b {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)):6.1f}")
        row.append(f"{name} none {timed(lambda: G.group_norm_forward(x, 32, None, None, 1e-5, 'silu', None)):6.1f}")
    print("  ".join(row), flush=True)
