import torch
import flashfuse.ops.group_norm as G
x = torch.randn(16, 640, 64, 64, device="cuda", dtype=torch.bfloat16) * 2 + 1
w = torch.randn(640, device="cuda"); b = torch.randn(640, device="cuda")
y, mean, rstd = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
dy = torch.randn_like(y)
for _ in range(4):
    G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", None)
torch.cuda.synchronize()
