import time, statistics, cProfile, pstats, io, sys
import torch
from flashfuse.ops.attention import interface
from flashfuse import flash_attn_func
q, k, v = (torch.randn(2, 64, 4, 64, requires_grad=True) for _ in range(3))
out0 = torch.empty(2, 64, 4, 64); lse0 = torch.empty(2, 4, 64)
interface.flash_attn_forward = lambda *a, **kw: (torch.empty_like(q), torch.empty(2, 4, 64))
interface.flash_attn_backward = lambda *a, **kw: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
g = torch.randn(2, 64, 4, 64)
def fwd(): return flash_attn_func(q, k, v, causal=True)
out = fwd()
def bwd(): return torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
def t(fn, n=3000):
    for _ in range(200): fn()
    ts = []
    for _ in range(7):
        s = time.perf_counter()
        for _ in range(n): fn()
        ts.append((time.perf_counter() - s) / n * 1e6)
    return min(ts)
print(f"fwd {t(fwd):.1f} us  bwd {t(bwd):.1f} us  empty_like x2 {t(lambda: (torch.empty_like(q), torch.empty(2,4,64))):.1f}")
if len(sys.argv) > 1:
    p = cProfile.Profile(); p.enable()
    for _ in range(3000): fwd()
    p.disable(); s = io.StringIO(); pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(25); print(s.getvalue()[:6000])
