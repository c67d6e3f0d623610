"""Session 11: forward with half the softmax exponentials on the FMA pipe (flash_fwd.POLY_EXP2) vs the SFU only,
beside cuDNN / FA2 SDPA in the same process. flash-attn benchmark shapes (16k tokens, model dim 2048)."""
import json, math, os, sys, time
import torch, triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_fwd as ff

OUT = os.environ.get("OUT", "/tmp")
DTYPES = [torch.bfloat16] + ([torch.float16] if os.environ.get("FP16") else [])
rows = []
def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3   # us

orig_fast_cfg = ff.fast_forward_config
def variant(poly, fast=None):
    ff.POLY_EXP2[torch.bfloat16] = poly; ff.POLY_EXP2[torch.float16] = poly
    if fast is None:
        ff.fast_forward_config = orig_fast_cfg
    else:
        ff.fast_forward_config = lambda *a, **k: dict(fast)

VARIANTS = {64: [("sfu", 0, None), ("poly3", 3, None), ("poly4", 4, None),
                 ("tma128x64-sfu", 0, ff._fast(128, 64, 8, 3)), ("tma128x64-poly3", 3, ff._fast(128, 64, 8, 3)),
                 ("tma128x128-poly3", 3, ff._fast(128, 128, 8, 3))],
            128: [("sfu", 0, None), ("poly3", 3, None), ("poly4", 4, None)]}
t_start = time.time()
for dt in DTYPES:
    for D in (64, 128):
        H = 2048 // D
        for causal in (False, True):
            for S in (1024, 2048, 4096, 8192, 16384):
                B = 16384 // S
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=dt) for _ in range(3))
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                ref = torch.nn.functional.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), is_causal=causal).transpose(1, 2)
                r = {"dtype": str(dt), "D": D, "causal": causal, "S": S}
                for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                    with sdpa_kernel([be]):
                        r[name] = bench(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
                for name, poly, fast in VARIANTS[D]:
                    variant(poly, fast)
                    out = flash_attn_func(q, k, v, causal=causal)
                    err = ((out.float() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        r[name] = None; r[name + "_err"] = err; continue
                    r[name] = bench(lambda: flash_attn_func(q, k, v, causal=causal)); r[name + "_err"] = err
                variant(0)
                rows.append(r)
                tf = lambda us: f"{flops / us / 1e6:6.1f}" if us else "  WRONG"
                print(f"{str(dt)[6:]:8s} hd{D} {'causal' if causal else 'full  '} S={S:5d} cudnn {tf(r['cudnn'])} fa2 {tf(r['fa2'])} | "
                      + " ".join(f"{n} {tf(r[n])}" for n, _, _ in VARIANTS[D]), flush=True)
json.dump(rows, open(f"{OUT}/poly_probe.json", "w"), indent=1)
print(f"done in {time.time() - t_start:.0f} s")
