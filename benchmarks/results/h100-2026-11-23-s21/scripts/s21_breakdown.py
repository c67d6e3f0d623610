"""Session 21: where the channels_last Gluon forward's time goes. Variants of _hopper_fwd_cl.py, timing only (some give
wrong outputs on purpose): nospin (no wait for the other chunks at the meeting), nostore (y stores masked off),
both, and the activation off; x.clone() and the Triton plans beside, same run, graph-timed, bf16, no residual."""
import importlib
import torch, triton
import flashfuse.ops.group_norm as G
src_dir = "src/flashfuse/ops/group_norm_details"
base = open(f"{src_dir}/_hopper_fwd_cl.py").read()
def variant(name, subs):
    s = base
    for a, b in subs:
        assert a in s, (name, a)
        s = s.replace(a, b)
    open(f"{src_dir}/_clv_{name}.py", "w").write(s)
    return importlib.import_module(f"flashfuse.ops.group_norm_details._clv_{name}")
NOSPIN = ("while arrived < n_chunks:", "while arrived < 0:")
NOSTORE = ("gl.store(p_y + offs, z.to(ring.dtype))\n", "gl.store(p_y + offs, z.to(ring.dtype), mask=offs < 0)\n")
NOFENCE = ("                    fence_async_shared()\n                    gl.thread_barrier()", "                    gl.thread_barrier()")
V = {"base": variant("base", []), "nospin": variant("nospin", [NOSPIN]), "nostore": variant("nostore", [NOSTORE]),
     "nospin+nostore": variant("nospin_nostore", [NOSPIN, NOSTORE]), "nofence": variant("nofence", [NOFENCE])}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
for shape in [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64)]:
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=torch.channels_last)
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    row = [f"{str(shape):18s}"]
    G.HOPPER_FWD = False
    row.append(f"triton {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)):6.1f}")
    row.append(f"clone {timed(lambda: x.clone()):5.1f}")
    G.HOPPER_FWD = True
    for name, mod in V.items():
        G.hopper_fwd_cl = mod
        row.append(f"{name} {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)):6.1f}")
    G.hopper_fwd_cl = V["base"]
    row.append(f"base/none {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'none', None)):6.1f}")
    G.hopper_fwd_cl = V["nospin+nostore"]
    row.append(f"nospin+nostore/none {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'none', None)):6.1f}")
    print("  ".join(row), flush=True)
