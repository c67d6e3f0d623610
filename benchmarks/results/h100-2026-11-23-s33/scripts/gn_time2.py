"""fwd and fwd+bwd (autograd.grad) of group_norm + SiLU, graph-timed, bf16; one line per case; JSON of us."""
import sys, json, torch, triton
from flashfuse.ops.group_norm import group_norm
torch.manual_seed(0)
CASES = [((2, 320, 64, 64), "nchw", False), ((8, 320, 128, 128), "nchw", False), ((16, 640, 64, 64), "nchw", False),
         ((16, 1280, 32, 32), "nchw", False), ((16, 640, 64, 64), "nchw", True), ((8, 320, 128, 128), "cl", False),
         ((16, 640, 64, 64), "cl", False), ((16, 1280, 32, 32), "cl", False)]
res = {}
for shape, layout, temb in CASES:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    if layout == "cl":
        x = x.to(memory_format=torch.channels_last)
    x.requires_grad_()
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    b = (0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    r = torch.randn(shape[0], c, 1, 1, device="cuda", dtype=torch.bfloat16).requires_grad_() if temb else None
    dy = torch.randn_like(x)
    leaves = (x, w, b) + ((r,) if temb else ())
    f = lambda: group_norm(x, 32, w, b, 1e-5, activation="silu", residual=r)
    fb = lambda: torch.autograd.grad(f(), leaves, dy)
    with torch.no_grad():
        t_f = triton.testing.do_bench_cudagraph(f, rep=60) * 1e3
    t_fb = triton.testing.do_bench_cudagraph(fb, rep=60) * 1e3
    key = f"{shape} {layout}{' temb' if temb else ''}"
    res[key] = (t_f, t_fb)
    print(f"{sys.argv[1]:4s} {key:32s} fwd {t_f:7.1f} us  fwd+bwd {t_fb:7.1f} us", flush=True)
json.dump(res, open(sys.argv[2], "w"))
