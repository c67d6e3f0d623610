"""Session 34: GroupNorm + SiLU at SD-1.5 batch-2 levels (bf16, graph-timed, us): flashfuse under its routes vs
torch.compile, fwd and fwd+bwd, NCHW and channels_last, with / without the time embedding."""
import torch, triton, itertools
import torch.nn.functional as F
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm import group_norm
torch.manual_seed(0)
SHAPES = [(2, 320, 64, 64), (2, 640, 64, 64), (2, 640, 32, 32), (2, 960, 32, 32), (2, 1280, 16, 16), (2, 1280, 8, 8),
          (2, 2560, 8, 8)]
DEFAULT = dict(HOPPER_FWD=G.HOPPER_FWD, CL=G.CL_PER_GROUP_MAX_BYTES)
ROUTES = {"default": {}, "triton": dict(HOPPER_FWD=False), "pergroup": dict(HOPPER_FWD=False, CL=1 << 40),
          "chunked": dict(HOPPER_FWD=False, CL=0)}


def set_route(r):
    G.HOPPER_FWD = r.get("HOPPER_FWD", DEFAULT["HOPPER_FWD"])
    G.CL_PER_GROUP_MAX_BYTES = r.get("CL", DEFAULT["CL"])


def eager(x, w, b, r):
    return F.silu(F.group_norm(x if r is None else x + r, 32, w, b, 1e-5))


torch._dynamo.config.cache_size_limit = 128
compiled = torch.compile(eager, dynamic=False)
for shape, cl, temb in itertools.product(SHAPES, (False, True), (False, True)):
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=fmt).requires_grad_()
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    b = (0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    r = torch.randn(shape[0], c, 1, 1, device="cuda", dtype=torch.bfloat16).requires_grad_() if temb else None
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16).to(memory_format=fmt)
    leaves = (x, w, b) + ((r,) if temb else ())
    out = {}
    for name, route in ROUTES.items():
        set_route(route)
        fwd = lambda: group_norm(x, 32, w, b, 1e-5, activation="silu", residual=r)
        both = lambda: torch.autograd.grad(fwd(), leaves, dy)
        both()
        out[name] = (triton.testing.do_bench_cudagraph(fwd, rep=40) * 1e3,
                     triton.testing.do_bench_cudagraph(both, rep=40) * 1e3)
    set_route({})
    cf = lambda: compiled(x, w, b, r)
    cb = lambda: torch.autograd.grad(compiled(x, w, b, r), leaves, dy)
    cb()
    out["compile"] = (triton.testing.do_bench_cudagraph(cf, rep=40) * 1e3,
                      triton.testing.do_bench_cudagraph(cb, rep=40) * 1e3)
    print(f"{str(shape):20s} {'CL  ' if cl else 'NCHW'} {'temb' if temb else '    '} " +
          "  ".join(f"{k} {v[0]:6.1f}/{v[1]:6.1f}" for k, v in out.items()), flush=True)
