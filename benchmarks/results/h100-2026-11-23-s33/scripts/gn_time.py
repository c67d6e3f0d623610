"""fwd+bwd (autograd.grad, graph-timed) of group_norm + SiLU at SD shapes, NCHW bf16; prints one line per case."""
import sys, json, torch, triton
from flashfuse.ops.group_norm import group_norm
torch.manual_seed(0)
CASES = [((2, 320, 64, 64), False), ((8, 320, 128, 128), False), ((16, 640, 64, 64), False),
         ((16, 1280, 32, 32), False), ((2, 320, 64, 64), True), ((8, 320, 128, 128), True), ((16, 640, 64, 64), True)]
res = {}
for shape, temb in CASES:
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).requires_grad_()
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    b = (0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    r = torch.randn(shape[0], c, 1, 1, device="cuda", dtype=torch.bfloat16).requires_grad_() if temb else None
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    leaves = (x, w, b) + ((r,) if temb else ())
    fn = lambda: torch.autograd.grad(group_norm(x, 32, w, b, 1e-5, activation="silu", residual=r), leaves, dy)
    g = fn()
    ref = torch.autograd.grad(torch.nn.functional.silu(torch.nn.functional.group_norm(
        (x.double() + (r.double() if temb else 0)), 32, w.double(), b.double(), 1e-5)), leaves, dy.double())
    err = [((u.double() - v).norm() / v.norm()).item() for u, v in zip(g, ref)]
    t = triton.testing.do_bench_cudagraph(fn, rep=60) * 1e3
    key = f"{shape}{' temb' if temb else ''}"
    res[key] = t
    print(f"{sys.argv[1]:4s} {key:28s} {t:8.1f} us  err " + " ".join(f"{e:.1e}" for e in err), flush=True)
json.dump(res, open(sys.argv[2], "w"))
