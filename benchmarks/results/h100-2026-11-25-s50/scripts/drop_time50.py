"""Session 50: dropout's cost, same process, H100: flash_attn_func with dropout_p = 0.1 on the Gluon kernels, on the
Triton kernels (GLUON_FORWARD / GLUON_BACKWARD off: the route before this session), without dropout, and SDPA's flash
(FA2) and efficient backends with the same dropout_p. 16384 tokens, model dim 2048, bf16, fwd and bwd TFLOP/s
(fwd 4 B H S^2 D, x0.5 causal; bwd 2.5x), CUDA events, median of 3 rounds of triton.testing.do_bench."""
import json, os, sys
import torch, triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_bwd, flash_fwd

P = 0.1
rows = []


def tflops(ms, b, h, s, d, causal, mode):
    f = 4 * b * h * s * s * d * (0.5 if causal else 1.0) * (2.5 if mode == "bwd" else 1.0)
    return f / ms / 1e9


def bench(fn, mode, leaves):
    if mode == "fwd":
        call = fn
    else:
        out = fn()
        dout = torch.randn_like(out)
        call = lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)
    ts = [triton.testing.do_bench(call, warmup=25, rep=100) for _ in range(3)]
    return sorted(ts)[1]


for d in (64, 128):
    h = 2048 // d
    for causal in (False, True):
        for s in (1024, 2048, 4096, 8192):
            b = 16384 // s
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
            provs = {
                "gluon-drop": (lambda: flash_attn_func(q, k, v, dropout_p=P, causal=causal), (q, k, v), True),
                "triton-drop": (lambda: flash_attn_func(q, k, v, dropout_p=P, causal=causal), (q, k, v), False),
                "gluon-nodrop": (lambda: flash_attn_func(q, k, v, causal=causal), (q, k, v), True),
            }
            for name, backend in (("sdpa-flash-drop", SDPBackend.FLASH_ATTENTION),
                                  ("sdpa-eff-drop", SDPBackend.EFFICIENT_ATTENTION),
                                  ("sdpa-cudnn-drop", SDPBackend.CUDNN_ATTENTION)):
                def f(backend=backend):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, dropout_p=P,
                                                                                is_causal=causal)
                provs[name] = (f, (qt, kt, vt), True)
            for mode in ("fwd", "bwd"):
                row = dict(d=d, causal=causal, s=s, mode=mode)
                for name, (fn, leaves, gluon) in provs.items():
                    flash_fwd.GLUON_FORWARD = flash_bwd.GLUON_BACKWARD = gluon
                    try:
                        row[name] = round(tflops(bench(fn, mode, leaves), b, h, s, d, causal, mode), 1)
                    except Exception as e:  # noqa
                        row[name] = None
                        row[name + "_error"] = str(e)[:200]
                    flash_fwd.GLUON_FORWARD = flash_bwd.GLUON_BACKWARD = True
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v, qt, kt, vt
            torch.cuda.empty_cache()

os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "drop_time50.json"), "w"), indent=1)
names = ["gluon-drop", "triton-drop", "gluon-nodrop", "sdpa-flash-drop", "sdpa-eff-drop", "sdpa-cudnn-drop"]
print("d causal S mode | " + " ".join(names) + " | gluon/triton gluon/fa2 drop/nodrop")
for r in rows:
    g = r["gluon-drop"] or 0
    ratio = lambda x: f"{g / x:.2f}" if x else "-"
    print(f"{r['d']} {int(r['causal'])} {r['s']} {r['mode']} | " + " ".join(str(r.get(n)) for n in names)
          + f" | {ratio(r['triton-drop'])} {ratio(r['sdpa-flash-drop'])} {ratio(r['gluon-nodrop'])}")
