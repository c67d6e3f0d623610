"""Session 23: host time per attention call (tiny shapes forced onto the Gluon kernels: the GPU idles, the wall time
per call is the host's), for whichever source tree is on PYTHONPATH; torch SDPA (cuDNN) beside it."""
import sys, time, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_fwd_hopper, flash_fwd

tag = sys.argv[1]
cfg = dict(flash_fwd_hopper.HOPPER_CONFIGS[(128, True)][0][1])
flash_fwd_hopper.hopper_forward_config = lambda *a: dict(cfg)          # the Gluon forward at any grid size
q, k, v = (torch.randn(2, 512, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
qn = q.detach()
dout = torch.randn_like(q)
out = flash_attn_func(q, k, v, causal=True)
qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out_s = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
dout_s = dout.transpose(1, 2)
def host_us(fn, n=200):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    times = []
    for rep in range(7):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / n * 1e6)
    return min(times), sorted(times)[len(times) // 2]
def cudnn_fwd():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
cases = {
    "fwd grad": lambda: flash_attn_func(q, k, v, causal=True),
    "fwd nograd": lambda: flash_attn_func(qn, qn, qn, causal=True),
    "flash_attn_forward": lambda: flash_fwd.flash_attn_forward(qn, qn, qn, softmax_scale=0.1, window_right=0),
    "bwd": lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True),
    "cudnn fwd grad": cudnn_fwd,
    "cudnn bwd": lambda: torch.autograd.grad(out_s, (qt, kt, vt), dout_s, retain_graph=True),
}
for rnd in range(2):
    for name, fn in cases.items():
        best, med = host_us(fn)
        print(f"{tag} round {rnd} {name:20s} host min {best:6.1f} us  median {med:6.1f}", flush=True)
