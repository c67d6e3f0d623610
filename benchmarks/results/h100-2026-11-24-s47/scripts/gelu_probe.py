"""Session 47: a Linear + tanh-GELU (diffusers' GELU(approximate="tanh"): DiT / PixArt / SD3 / Flux feed-forwards)
as one cuBLASLt GEMM with the bias + GELU epilogue (torch._addmm_activation) vs Linear then F.gelu; which GELU the
epilogue computes (fp32, TF32 off)."""
import os, json, torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

torch.backends.cuda.matmul.allow_tf32 = False
x = torch.randn(512, 1152, device="cuda"); w = torch.randn(4608, 1152, device="cuda") / 34; b = torch.randn(4608, device="cuda")
y = torch._addmm_activation(b, x, w.t(), use_gelu=True)
lin = F.linear(x, w, b)
for a in ("tanh", "none"):
    print(f"fp32 epilogue vs gelu({a}): max abs diff {(y - F.gelu(lin, approximate=a)).abs().max().item():.3e}", flush=True)

def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=100, return_mode="median")

rows = []
for (m, k, n) in [(8192, 1152, 4608), (2048, 1152, 4608), (8192, 1536, 6144), (4096, 3072, 12288)]:
    for dt in (torch.float16, torch.bfloat16):
        x = torch.randn(m, k, device="cuda", dtype=dt); w = (torch.randn(n, k, device="cuda") / k ** 0.5).to(dt)
        b = torch.randn(n, device="cuda", dtype=dt)
        ref = F.gelu(F.linear(x.float(), w.float(), b.float()), approximate="tanh")
        ep = torch._addmm_activation(b, x, w.t(), use_gelu=True)
        two = F.gelu(F.linear(x, w, b), approximate="tanh")
        e_ep = ((ep.float() - ref).norm() / ref.norm()).item(); e_two = ((two.float() - ref).norm() / ref.norm()).item()
        t = {}
        for r in range(3):
            for name, fn in [("linear+gelu", lambda: F.gelu(F.linear(x, w, b), approximate="tanh")),
                             ("epilogue", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
                             ("linear", lambda: F.linear(x, w, b))]:
                t.setdefault(name, []).append(bench(fn) * 1e3)
        med = {k2: sorted(v)[1] for k2, v in t.items()}
        fl = 2 * m * k * n
        rows.append(dict(m=m, k=k, n=n, dtype=str(dt), us=med, err_epilogue=e_ep, err_two=e_two))
        print(f"{m}x{k}x{n} {str(dt)[6:]:8s} " + " ".join(f"{k2} {v:7.1f} us ({fl / v / 1e6:4.0f} TF)" for k2, v in med.items())
              + f" | rel err epilogue {e_ep:.2e} two-op {e_two:.2e}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "gelu_probe.json"), "w"), indent=1)
