"""Session 34: NCHW channel blocks _nchw_channel_block vs the dividing block (cpg & -cpg), same
process, rounds alternating; torch.compile beside. GroupNorm + SiLU bf16, graph-timed fwd / fwd+bwd (us)."""
import torch, triton, itertools
import torch.nn.functional as F
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm import group_norm
torch.manual_seed(0)
torch._dynamo.config.cache_size_limit = 128
import os
SHAPES = [tuple(int(v) for v in s.split("x")) for s in os.environ["SHAPES"].split(",")] if os.environ.get("SHAPES") else [
          (1, 960, 32, 32), (2, 960, 32, 32), (2, 1920, 32, 32), (2, 480, 32, 32), (2, 2880, 16, 16),
          (2, 2880, 32, 32), (2, 1440, 32, 32), (2, 3840, 16, 16), (2, 640, 32, 32), (2, 1280, 32, 32)]
if os.environ.get("NO_HOPPER"):      # the Triton plans everywhere (as off sm_90): LOOP at the larger batches
    G.HOPPER_FWD = G.HOPPER_BWD = False
NEW = G._nchw_channel_block
OLD = lambda cpg: min(cpg & -cpg, G.LOOP_TILE)


def eager(x, w, b, r):
    return F.silu(F.group_norm(x if r is None else x + r, 32, w, b, 1e-5))


compiled = torch.compile(eager, dynamic=False)
for shape, temb in itertools.product(SHAPES, (False, True)):
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).requires_grad_()
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    b = (0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    r = torch.randn(shape[0], c, 1, 1, device="cuda", dtype=torch.bfloat16).requires_grad_() if temb else None
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    leaves = (x, w, b) + ((r,) if temb else ())
    ref = torch.autograd.grad(eager(*(t.double() if t is not None else None for t in (x, w, b, r))), leaves,
                              dy.double())
    res = {}
    for rnd in range(2):
        for name, rule in (("old", OLD), ("new", NEW)):
            G._nchw_channel_block = rule
            fwd = lambda: group_norm(x, 32, w, b, 1e-5, activation="silu", residual=r)
            both = lambda: torch.autograd.grad(fwd(), leaves, dy)
            g = both()
            err = max(((u.double() - v).norm() / v.norm()).item() for u, v in zip(g, ref))
            res.setdefault(name, []).append((triton.testing.do_bench_cudagraph(fwd, rep=40) * 1e3,
                                             triton.testing.do_bench_cudagraph(both, rep=40) * 1e3, err))
    G._nchw_channel_block = NEW
    cb = lambda: torch.autograd.grad(compiled(x, w, b, r), leaves, dy)
    cb()
    comp = (triton.testing.do_bench_cudagraph(lambda: compiled(x, w, b, r), rep=40) * 1e3,
            triton.testing.do_bench_cudagraph(cb, rep=40) * 1e3)
    med = {k: [sorted(v[i] for v in vals)[len(vals) // 2] for i in range(2)] + [max(v[2] for v in vals)]
           for k, vals in res.items()}
    print(f"{str(shape):20s} {'temb' if temb else '    '} " + "  ".join(
        f"{k} {m[0]:6.1f}/{m[1]:6.1f} (err {m[2]:.1e})" for k, m in med.items())
        + f"  compile {comp[0]:6.1f}/{comp[1]:6.1f}", flush=True)
