"""Session 42: bf16 vs fp16, flashfuse vs cuDNN, the rows where fp16 read slower; each measurement ~2 s of do_bench
with start / end wall times, so the nvidia-smi log (clocks, power) can be read per window."""
import time, json, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench
import flashfuse

CASES = [("fwd", 64, True, 16384), ("fwd", 128, False, 16384), ("bwd", 128, False, 4096), ("bwd", 64, True, 8192),
         ("fwd", 64, True, 8192)]
rows = []
for rnd in range(2):
    for mode, D, causal, S in CASES:
        B, H = 16384 // S, 2048 // D
        fl = 4 * B * H * S * S * D * (0.5 if causal else 1) * (2.5 if mode == "bwd" else 1)
        for dt in ((torch.bfloat16, torch.float16) if rnd == 0 else (torch.float16, torch.bfloat16)):
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(4))
            for prov in ("ff", "cudnn") if rnd == 0 else ("cudnn", "ff"):
                if prov == "ff":
                    fn = lambda: flashfuse.flash_attn_func(q, k, v, causal=causal)
                else:
                    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                    def fn():
                        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                if mode == "fwd":
                    call = fn
                else:
                    o = fn()
                    ins = (q, k, v) if prov == "ff" else (qt, kt, vt)
                    g = do if prov == "ff" else do.transpose(1, 2)
                    call = lambda: torch.autograd.grad(o, ins, g, retain_graph=True)
                call(); torch.cuda.synchronize()
                t0 = time.time()
                ms = do_bench(call, warmup=200, rep=2000)
                t1 = time.time()
                r = dict(rnd=rnd, mode=mode, D=D, causal=causal, S=S, dtype=str(dt)[6:], prov=prov, ms=ms,
                         tflops=fl / ms / 1e9, t0=t0, t1=t1)
                rows.append(r)
                print(f"{rnd} {mode} hd{D} {'causal' if causal else 'full'} S={S} {r['dtype']:9s} {prov:6s} {r['tflops']:6.1f}",
                      flush=True)
json.dump(rows, open(sys.argv[1], "w"))
