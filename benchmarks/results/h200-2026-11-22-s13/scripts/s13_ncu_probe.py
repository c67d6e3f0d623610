"""Session 13 probe 4 (under ncu): why a read-once GroupNorm body streams at ~55%: one launch each of x.clone(),
the default plan, s13_coop (registers, MEET 0 and 1, prefetch off) and s13_coop_tma (MEET 0) at (8, 320, 128, 128)
bf16 NCHW; warmed up outside the profiled range (NVTX 'prof')."""
import torch, os, sys
sys.path.insert(0, os.path.dirname(__file__))
from s13_coop import run
from s13_coop_tma import run_tma
from flashfuse.ops.group_norm import group_norm_forward
from flashfuse.ops._triton import ensure_tma_allocator
ensure_tma_allocator()
x = torch.randn((8, 320, 128, 128), device="cuda", dtype=torch.bfloat16)
w = torch.randn(320, device="cuda"); b = torch.randn(320, device="cuda")
fns = [("clone", lambda: x.clone()), ("default", lambda: group_norm_forward(x, 32, w, b, 1e-5, "silu", None)),
       ("coop_m0", lambda: run(x, w, b, 32, 8192, 8, meet=0)), ("coop_m1", lambda: run(x, w, b, 32, 8192, 8, meet=1)),
       ("tma_m0", lambda: run_tma(x, w, b, 32, 4096, 4, 3, 0))]
for _, f in fns:
    f(); f()
torch.cuda.synchronize()
for name, f in fns:
    torch.cuda.nvtx.range_push(name)
    f()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
