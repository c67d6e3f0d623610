"""Session 51: dropout's cost with the mask drawn 16 scores per Philox4x32-7 call (8-bit uniforms) against session 50's
(8 per Philox4x32-10 call, 16-bit), H100, bf16, 16384 tokens, model dim 2048, dropout_p 0.1, fwd / bwd TFLOP/s
(fwd 4 B H S^2 D, x0.5 causal; bwd 2.5x), median of 3 rounds of triton.testing.do_bench. Run once per source tree
(argv[1] = label: 'old' times flashfuse's route only; 'new' adds the hd64 Gluon forward, no dropout, SDPA FA2 / cuDNN
with dropout)."""
import json, os, sys
import torch, triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_fwd

LABEL = sys.argv[1]
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


DIMS = [int(x) for x in os.environ.get("DIMS", "64,128").split(",")]
SEQS = [int(x) for x in os.environ.get("SEQS", "1024,2048,4096,8192").split(",")]
MODES = os.environ.get("MODES", "fwd,bwd").split(",")
for d in DIMS:
    h = round(2048 / d)
    for causal in (False, True):
        for s in SEQS:
            b = 16384 // s
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
            provs = {f"{LABEL}-drop": (lambda: flash_attn_func(q, k, v, dropout_p=P, causal=causal), (q, k, v), True)}
            if LABEL == "new" and not os.environ.get("LEAN"):
                if d == 64:
                    provs["new-drop-triton64"] = (provs["new-drop"][0], (q, k, v), False)
                provs["nodrop"] = (lambda: flash_attn_func(q, k, v, causal=causal), (q, k, v), True)
                for name, backend in (("fa2-drop", SDPBackend.FLASH_ATTENTION), ("cudnn-drop", SDPBackend.CUDNN_ATTENTION)):
                    def f(backend=backend):
                        with sdpa_kernel(backend):
                            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, dropout_p=P,
                                                                                    is_causal=causal)
                    provs[name] = (f, (qt, kt, vt), True)
            for mode in MODES:
                row = dict(d=d, causal=causal, s=s, mode=mode)
                for name, (fn, leaves, gluon) in provs.items():
                    if name.endswith("triton64") and mode == "bwd":
                        continue
                    flash_fwd.GLUON_FORWARD = gluon
                    try:
                        row[name] = round(tflops(bench(fn, mode, leaves), b, h, s, d, causal, mode), 1)
                    except Exception as e:  # noqa
                        row[name] = None
                        row[name + "_error"] = str(e)[:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
            del q, k, v, qt, kt, vt
            torch.cuda.empty_cache()

out = os.environ.get("OUT", ".")
json.dump(rows, open(os.path.join(out, f"drop_time51_{LABEL}.json"), "w"), indent=1)
