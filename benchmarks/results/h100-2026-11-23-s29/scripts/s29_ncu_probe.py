"""ncu target: hd64 causal S = 1024 (B16 H32, bf16) forward, flashfuse then cuDNN, three calls each."""
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from flashfuse.ops.attention import flash_fwd
q, k, v = (torch.randn(16, 1024, 32, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    flash_fwd.flash_attn_forward(q, k, v, softmax_scale=0.125, window_right=0)
qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(3):
        F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
torch.cuda.synchronize()
