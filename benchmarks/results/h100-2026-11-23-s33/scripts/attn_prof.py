"""Kernel breakdown of one hd64 / hd128 backward (B * S = 16384, 2048 model dim, bf16) for flashfuse and SDPA cuDNN."""
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity
import flashfuse
for d, s, causal in ((64, 1024, False), (64, 2048, False), (128, 1024, False)):
    h, b = 2048 // d, 16384 // s
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    def ff():
        o = flashfuse.flash_attn_func(q, k, v, causal=causal)
        return o, lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    def cu():
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return o, lambda: torch.autograd.grad(o, (q, k, v), do.transpose(1, 2), retain_graph=True)
    for name, mk in (("flashfuse", ff), ("cudnn", cu)):
        o, bwd = mk()
        for _ in range(5): bwd()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(10): bwd()
            torch.cuda.synchronize()
        tot = 0
        rows = []
        for e in p.key_averages():
            if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
                rows.append((e.self_device_time_total / 10, e.count // 10, e.key[:90]))
        rows.sort(reverse=True)
        print(f"== hd{d} S={s} causal={causal} {name}: total {sum(r[0] for r in rows):.1f} us per backward")
        for t, c, k_ in rows[:8]:
            print(f"   {t:8.1f} us  x{c}  {k_}")
