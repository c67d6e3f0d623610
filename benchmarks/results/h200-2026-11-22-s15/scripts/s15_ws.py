"""Session 15 (call 5: host-side 4-D TMA descriptors): warp-specialized persistent Gluon forward (producer warp + two consumer warpgroups) - correctness, then configs vs flashfuse and cuDNN."""
import json, math, os, sys, time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
import flashfuse.ops.attention.flash_fwd as FF
import flashfuse.ops.attention.flash_fwd_hopper as H

OUT = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda")
print("available:", H.available(dev), triton.__version__, flush=True)

def ref(q, k, v, causal, scale):
    # fp32 math, bottom-right causal; (B, S, H, D) layout, GQA by repeat
    B, Sq, Hq, D = q.shape; Sk, Hk = k.shape[1], k.shape[2]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf = kf.repeat_interleave(Hq // Hk, 1); vf = vf.repeat_interleave(Hq // Hk, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        r = torch.arange(Sq, device=q.device)[:, None]; c = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(c > r + (Sk - Sq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = (p @ vf).transpose(1, 2)
    return o, lse

def ref_lp(q, k, v, causal, scale):
    # the same in bf16: bf16 products, softmax rounded to bf16 before P V
    B, Sq, Hq, D = q.shape; Sk, Hk = k.shape[1], k.shape[2]
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))
    kb = kb.repeat_interleave(Hq // Hk, 1); vb = vb.repeat_interleave(Hq // Hk, 1)
    s = (qb @ kb.transpose(-1, -2)).float() * scale
    if causal:
        r = torch.arange(Sq, device=q.device)[:, None]; c = torch.arange(Sk, device=q.device)[None, :]
        s = s.masked_fill(c > r + (Sk - Sq), float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0).to(q.dtype)
    return (p @ vb).transpose(1, 2).float()

def run_hopper(q, k, v, causal, scale, cfg):
    B, Sq, Hq, D = q.shape; Sk, Hk = k.shape[1], k.shape[2]
    out = torch.empty_like(q); lse = torch.empty(B, Hq, Sq, device=q.device, dtype=torch.float32)
    return H.hopper_forward(q, k, v, out, lse, q_strides=q.stride(), k_strides=k.stride(), v_strides=v.stride(),
                            o_strides=out.stride(), lse_strides=(lse.stride(0), lse.stride(1)), nheads_q=Hq,
                            nheads_k=Hk, seqlen_q=Sq, seqlen_k=Sk, qk_scale=scale * math.log2(math.e),
                            window_right=0 if causal else -1, bottom_right=True, config=cfg)

def W(persistent, regs=240):
    return dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, num_warps=4, WARP_SPECIALIZED=True, PERSISTENT=persistent,
                CONSUMER_REGS=regs)
CFG_BY_D = {128: {"ws": W(False), "ws-persist": W(True)}, 64: {"ws": W(False), "ws-persist": W(True)}}
DIMS = tuple(int(d) for d in os.environ.get("DIMS", "128").split(","))

# 1. correctness (bf16): error vs fp32 reference, compared with the reference computed in bf16 (flash-attn's rule)
torch.manual_seed(0)
bad = 0
shapes = [(2, 113, 203, 4, 2), (1, 1023, 1024, 4, 4), (1, 1024, 1023, 2, 1), (2, 2048, 2048, 4, 2), (1, 300, 100, 2, 2),
          (1, 4096, 4096, 2, 2), (1, 1, 77, 2, 2), (2, 777, 1500, 4, 1), (4, 2048, 2048, 8, 2), (3, 1000, 1500, 8, 4),
          (8, 777, 777, 6, 3), (2, 1500, 700, 16, 16)]
for D in DIMS:
    for name, cfg in CFG_BY_D[D].items():
        for causal in (False, True):
            for (B, Sq, Sk, Hq, Hk) in shapes:
                q = torch.randn(B, Sq, Hq, D, device=dev, dtype=torch.bfloat16)
                k = torch.randn(B, Sk, Hk, D, device=dev, dtype=torch.bfloat16)
                v = torch.randn(B, Sk, Hk, D, device=dev, dtype=torch.bfloat16)
                scale = D ** -0.5
                try:
                    o, lse = run_hopper(q, k, v, causal, scale, cfg)
                    torch.cuda.synchronize()
                except Exception as e:
                    print("FAIL-RUN", name, D, causal, (B, Sq, Sk, Hq, Hk), repr(e)[:300], flush=True); bad += 1; continue
                o_ref, lse_ref = ref(q, k, v, causal, scale)
                o_lp = ref_lp(q, k, v, causal, scale)
                err = (o.float() - o_ref).abs().max().item()
                lp_err = (o_lp - o_ref).abs().max().item()
                fin = torch.isfinite(lse_ref)
                lse_err = (lse[fin] - lse_ref[fin]).abs().max().item() if fin.any() else 0.0
                lse_inf_ok = bool((lse[~fin] == float("inf")).all())
                ok = err <= 2 * lp_err + 1e-3 and lse_err < 1e-3 and lse_inf_ok and torch.isfinite(o).all().item()
                if not ok:
                    bad += 1
                    print("BAD", name, D, causal, (B, Sq, Sk, Hq, Hk), f"err={err:.3g} lp={lp_err:.3g} lse={lse_err:.3g} inf_ok={lse_inf_ok}", flush=True)
print("correctness: bad =", bad, flush=True)

# 2. timing: flash-attn benchmark shapes (16k tokens, 2048 model dim), bf16
def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100)

rows = []
for D in DIMS:
    for causal in (False, True):
        for S in (512, 1024, 2048, 4096, 8192, 16384):
            CFGS = CFG_BY_D[D]
            B, Hq = 16384 // S, 2048 // D
            q, k, v = (torch.randn(B, S, Hq, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * B * Hq * S * S * D * (0.5 if causal else 1.0)
            scale = D ** -0.5
            res = {}
            res["flashfuse"] = bench(lambda: FF.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=0 if causal else -1))
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                res["cudnn"] = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
            for name, cfg in CFGS.items():
                try:
                    res[name] = bench(lambda: run_hopper(q, k, v, causal, scale, cfg))
                except Exception as e:
                    res[name] = float("nan")
            tf = {n: flops / (ms * 1e-3) / 1e12 for n, ms in res.items()}
            rows.append(dict(D=D, causal=causal, S=S, tflops=tf))
            best = max((n for n in CFGS), key=lambda n: tf[n] if tf[n] == tf[n] else -1)
            print(f"hd{D} causal={int(causal)} S={S:5d}  flashfuse {tf['flashfuse']:6.1f}  cudnn {tf['cudnn']:6.1f}  " +
                  "  ".join(f"{n} {tf[n]:6.1f}" for n in CFGS) + f"   best {best} {tf[best]/tf['cudnn']:.3f}x cudnn", flush=True)
json.dump(rows, open(os.path.join(OUT, "gluon_fwd_sweep.json"), "w"), indent=1)
