import sys, os, torch, traceback
from flashfuse.ops.attention import flash_bwd, flash_fwd
hd, causal, mode = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
lens = {"equal": [1024, 1024], "al4": [1000, 36, 1500, 128, 2048, 4, 700, 64, 2000], "m64": [1024, 64, 128, 2048, 640],
        "al16": [1008, 32, 1504, 128, 2048, 16, 704, 64, 2000]}.get(mode, [1000, 37, 1500, 129, 2048, 1, 700, 64, 1999])
H = 4
cu = torch.tensor([0, *lens], device="cuda").cumsum(0).to(torch.int32)
T = sum(lens)
q, k, v, do = (torch.randn(T, H, hd, device="cuda", dtype=torch.bfloat16) for _ in range(4))
opts = dict(softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
var = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens), max_seqlen_k=max(lens))
out, lse = flash_fwd.flash_attn_forward(q, k, v, **opts, **var)
torch.cuda.synchronize()
try:
    dq, dk, dv = flash_bwd.flash_attn_backward(do, q, k, v, out, lse, **opts, **var)
    torch.cuda.synchronize()
    flash_bwd.GLUON_BACKWARD = False
    dq2, dk2, dv2 = flash_bwd.flash_attn_backward(do, q, k, v, out, lse, **opts, **var)
    print(f"hd{hd} causal={causal} {mode}: OK", [(a.float() - b.float()).abs().max().item() for a, b in ((dq, dq2), (dk, dk2), (dv, dv2))])
except Exception as e:
    print(f"hd{hd} causal={causal} {mode}: FAIL", str(e)[:3000])
