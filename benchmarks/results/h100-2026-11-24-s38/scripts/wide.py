"""Session 38: attention backward at head dims 160 / 192 / 256 (and 128 for reference): the Gluon wide consumer vs
flash_bwd's Triton grid (GLUON_BACKWARD off) vs cuDNN and SDPA's flash backend (FA2), CUDA-graph timed, bf16,
16384 tokens, heads = round(2048 / hd)."""
import os, sys, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
import flashfuse
from flashfuse.ops.attention import flash_bwd, flash_fwd

def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=50, return_mode="median")

rows = []
dims = [int(x) for x in os.environ.get("DIMS", "128,160,192,256").split(",")]
seqs = [int(x) for x in os.environ.get("SEQS", "1024,2048,4096").split(",")]
names = os.environ.get("NAMES", "gluon,triton,cudnn,fa2").split(",")
for S in seqs:
  for hd in dims:
    H = max(1, round(2048 / hd)); B = 16384 // S
    for causal in (False, True):
        g = torch.Generator(device="cuda").manual_seed(hd)
        q, k, v, do = (torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        fl = 4 * B * H * S * S * hd * (0.5 if causal else 1)
        res = {}
        for name in names:
            try:
                if name in ("gluon", "triton"):
                    flash_bwd.GLUON_BACKWARD = flash_fwd.GLUON_FORWARD = name != "triton"
                    fwd = lambda q=q, k=k, v=v: flashfuse.flash_attn_func(q, k, v, causal=causal)
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
                    mk = lambda: flashfuse.flash_attn_func(*leaves, causal=causal)
                    dout = do
                else:
                    be = SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION
                    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                    def fwd(qt=qt, kt=kt, vt=vt, be=be):
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    leaves = [x.detach().requires_grad_() for x in (qt, kt, vt)]
                    def mk(be=be, leaves=leaves):
                        with sdpa_kernel(be):
                            return F.scaled_dot_product_attention(*leaves, is_causal=causal)
                    dout = do.transpose(1, 2)
                t_f = bench(fwd)
                side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    o = mk()
                torch.cuda.current_stream().wait_stream(side)
                t_b = bench(lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True))
                res[name] = (fl / t_f / 1e9, 2.5 * fl / t_b / 1e9)
            except Exception as e:
                res[name] = (float("nan"), float("nan")); print(name, hd, type(e).__name__, str(e)[:300], flush=True)
        flash_bwd.GLUON_BACKWARD = flash_fwd.GLUON_FORWARD = True
        rows.append(dict(hd=hd, H=H, S=S, causal=causal, **res))
        print(f"S{S:5d} hd{hd:3d} H{H:2d} {'causal' if causal else 'full  '} fwd " +
              " ".join(f"{n} {res[n][0]:5.0f}" for n in res) + " | bwd " +
              " ".join(f"{n} {res[n][1]:5.0f}" for n in res) +
              (f" | gluon/cudnn fwd {res['gluon'][0] / res['cudnn'][0]:.2f} bwd {res['gluon'][1] / res['cudnn'][1]:.2f}" if "cudnn" in res and "gluon" in res else ""),
              flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"wide_{os.environ.get('TAG', 'x')}.json"), "w"), indent=1)
