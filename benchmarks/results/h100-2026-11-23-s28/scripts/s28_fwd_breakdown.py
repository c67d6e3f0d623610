"""Session 28: where the NCHW Gluon forward's time goes (_hopper_fwd.py). Timing-only variants (some give wrong
outputs on purpose): nostore (y stores masked off by a data test the compiler cannot fold), copy (pass 3 stores s:
no normalize / SiLU arithmetic), nostats (the statistics pass only waits for its tiles), nofence (pass 3 releases
slots without fence.proxy.async: may race), none (activation None),
half (the same kernel on half the SMs: per_round halved, so each program takes twice the groups); plus candidate
variants passed on the command line as module names. bf16, graph-timed, us."""
import importlib, sys
import torch, triton
import flashfuse.ops.group_norm as G
src_dir = "src/flashfuse/ops/group_norm_details"
base = open(f"{src_dir}/_hopper_fwd.py").read()


def variant(name, subs, src=base):
    s = src
    for a, b in subs:
        assert a in s, (name, a)
        s = s.replace(a, b)
    open(f"{src_dir}/_fv_{name}.py", "w").write(s)
    return importlib.import_module(f"flashfuse.ops.group_norm_details._fv_{name}")


STORE = "_store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)"
NOSTORE = (STORE, "gl.store(p_y + offs, z.to(dtype), mask=z == 1.2345e30)")
COPY = ("z = s * gl.expand_dims(a, 1) + gl.expand_dims(b, 1)\n                if ACTIVATION == 1:",
        "z = s\n                if ACTIVATION == 7:")
NOSTATS = ("            a += d\n            b += d * d\n", "")
NOFENCE = ("                fence_async_shared()      # these generic reads", "                # (no fence) these generic reads")
V = {"base": variant("base", []), "nostore": variant("nostore", [NOSTORE]), "copy": variant("copy", [COPY]),
     "nostats": variant("nostats", [NOSTATS]), "nofence": variant("nofence", [NOFENCE])}
for name in sys.argv[1:]:
    V[name] = importlib.import_module(f"flashfuse.ops.group_norm_details.{name}")
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3
for shape in [(16, 640, 64, 64), (16, 1280, 32, 32), (8, 320, 128, 128), (8, 320, 64, 64)]:
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]
    w = (1 + 0.1 * torch.randn(C, device="cuda")).bfloat16()
    b = (0.1 * torch.randn(C, device="cuda")).bfloat16()
    ref = None
    row = [f"{str(shape):18s}", f"clone {timed(lambda: x.clone()):5.1f}"]
    for name, mod in V.items():
        G.hopper_fwd = mod
        y = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)[0]
        if name == "base":
            ref = y
        ok = "" if name in ("nostore", "copy", "nostats") else ("=" if torch.equal(y, ref) else "!")
        row.append(f"{name}{ok} {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)):6.1f}")
    m = V["base"]
    G.hopper_fwd = m
    row.append(f"none {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'none', None)):6.1f}")
    p = m.plan(shape[0], C, shape[2] * shape[3], 32, 2, 132)
    orig = m.plan
    m.plan = lambda *a, **k: p._replace(per_round=p.per_round // 2)
    row.append(f"half {timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, 'silu', None)):6.1f}")
    m.plan = orig
    row.append(f"K={p.n_chunks} per_round={p.per_round} rows={p.chunk_rows}")
    print("  ".join(row), flush=True)
