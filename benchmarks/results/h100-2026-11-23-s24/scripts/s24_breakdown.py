"""Session 24: where the NCHW Gluon backward's time goes. Variants of _hopper_bwd.py, timing only (some give wrong
outputs on purpose): nospin (no wait at the meeting), nostore (dx stores masked off), copy2 (the dx pass stores s, no
arithmetic), chunks of up to 10 / 14 tiles (one partition's chunk may take most of the ring), the kernel alone (no
torch reductions of dw / db), activation None; bf16, graph-timed, us."""
import importlib
import torch, triton
import flashfuse.ops.group_norm as G
src_dir = "src/flashfuse/ops/group_norm_details"
base = open(f"{src_dir}/_hopper_bwd.py").read()
def variant(name, subs, **attrs):
    s = base
    for a, b in subs:
        assert a in s, (name, a)
        s = s.replace(a, b)
    open(f"{src_dir}/_bv_{name}.py", "w").write(s)
    m = importlib.import_module(f"flashfuse.ops.group_norm_details._bv_{name}")
    for k, v in attrs.items():
        setattr(m, k, v)
    return m
NOSPIN = ("while arrived < n_chunks:", "while arrived < 0:")
NOSTORE = ("gl.store(p_dx + offs, dx.to(dtype))\n", "gl.store(p_dx + offs, dx.to(dtype), mask=offs < 0)\n")
COPY2 = ("                x_hat, dz = _grad(s, dy, mean_rstd, rstd, w_row, b_row, ACTIVATION)\n                dx = dz",
         "                x_hat = s\n                dz = s\n                dx = s + 0.0 * dz")
V = {"base": variant("base", []), "nospin": variant("nospin", [NOSPIN]), "nostore": variant("nostore", [NOSTORE]),
     "copy2": variant("copy2", [COPY2]), "t10": variant("t10", [], MAX_CHUNK_TILES=10),
     "t14": variant("t14", [], MAX_CHUNK_TILES=14)}
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
for shape in [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)]:
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    y, mean, rstd = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
    dy = torch.randn_like(y)
    dx = torch.empty_like(x)
    row = [f"{str(shape):18s}", f"clone {timed(lambda: x.clone()):5.1f}"]
    for name, mod in V.items():
        G.hopper_bwd = mod
        row.append(f"{name} {timed(lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, 'silu', None)):6.1f}")
    m = V["base"]
    G.hopper_bwd = m
    row.append(f"kernel {timed(lambda: m.backward(dy, x, None, None, w, b, mean, rstd, 32, 'silu', dx, True, True, False, G._alloc)):6.1f}")
    row.append(f"kernel-nodwdb {timed(lambda: m.backward(dy, x, None, None, w, b, mean, rstd, 32, 'silu', dx, False, False, False, G._alloc)):6.1f}")
    row.append(f"none {timed(lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, 'none', None)):6.1f}")
    p = m.plan(shape[0], C, shape[2] * shape[3], 32, 2, 132)
    row.append(f"K={p.n_chunks} t10K={V['t10'].plan(shape[0], C, shape[2] * shape[3], 32, 2, 132).n_chunks} t14K={V['t14'].plan(shape[0], C, shape[2] * shape[3], 32, 2, 132).n_chunks}")
    print("  ".join(row), flush=True)
