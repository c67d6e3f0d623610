import sys, torch
import flashfuse.ops.group_norm as G
shape = tuple(int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16,640,64,64").split(","))
x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
w = torch.randn(shape[1], device="cuda").bfloat16(); b = torch.randn(shape[1], device="cuda").bfloat16()
for _ in range(4):
    G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
torch.cuda.synchronize()
