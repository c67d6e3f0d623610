"""Session 28: the NCHW Gluon forward with groups split into chunks of at most T tiles (K programs meet per group),
T = 28 (the shipped plan: split only what overflows the ring), 14, 10, 7; base and copy (pass 3 stores s) variants.
bf16, graph-timed, us."""
import importlib
import torch, triton
import flashfuse.ops.group_norm as G
src_dir = "src/flashfuse/ops/group_norm_details"
src = open(f"{src_dir}/_hopper_fwd.py").read()
COPY = ("z = s * gl.expand_dims(a, 1) + gl.expand_dims(b, 1)\n                if ACTIVATION == 1:",
        "z = s\n                if ACTIVATION == 7:")
assert COPY[0] in src
open(f"{src_dir}/_fv_copy.py", "w").write(src.replace(*COPY))
mods = {"base": G.hopper_fwd, "copy": importlib.import_module("flashfuse.ops.group_norm_details._fv_copy")}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (2, 320, 64, 64)]:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda").bfloat16(); b = torch.randn(C, device="cuda").bfloat16()
    row = [f"{str(shape):18s} clone {timed(lambda: x.clone()):5.1f}"]
    ref = G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)[0].clone()
    for name, m in mods.items():
        G.hopper_fwd = m
        orig = m.plan
        for T in (28, 14, 10, 7):
            p = m._chunking(shape[0], C, shape[2] * shape[3], 32, 2, 132, T, 0.0, False)
            if p is None:
                continue
            m.plan = lambda *a, _p=p, **k: _p
            y = G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)[0]
            ok = "" if name == "copy" else ("=" if torch.equal(y, ref) else f"~{(y.float() - ref.float()).abs().max().item():.0e}")
            row.append(f"{name} T{T} K{p.n_chunks}{ok} {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)):6.1f}")
        m.plan = orig
    G.hopper_fwd = mods["base"]
    print("  ".join(row), flush=True)
