"""Kernel time of one SD-1.5 UNet call (CFG batch 2, 64x64 latents, fp16): flashfuse-patched (channels_last,
as the flashfuse-graph provider) vs torch.compile (default mode; reduce-overhead replays the same kernels) vs
eager diffusers channels_last. Per kernel name: calls and us per UNet call; per category totals."""
import re, sys, time, json, os
import torch
from torch.profiler import profile, ProfilerActivity
from flashfuse.bench.suites import _diffusion_models as dm

dev, dtype = "cuda", torch.float16
torch.manual_seed(0)
x = torch.randn(2, 4, 64, 64, device=dev, dtype=dtype)
t = torch.tensor(500, device=dev)
text = torch.randn(2, 77, 768, device=dev, dtype=dtype)
CATS = [("attention", r"flash|fmha|attn|attention|_fwd_kernel|cudnn.*sdpa|sdpa"),
        ("group_norm", r"group_norm|_chunked|groupnorm|GroupNorm"),
        ("conv", r"conv|implicit|fprop|nhwc|xmma_fprop|cudnn"),
        ("gemm", r"gemm|nvjet|cutlass|sm90_xmma|matmul|cublas|_mm_"),
        ("triton", r"^triton_"),
        ]

def cat(name):
    for c, rx in CATS:
        if re.search(rx, name, re.I):
            return c
    return "other"

def prof(fn, label, n=5):
    with torch.no_grad():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / n * 1e6
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
    rows = {}
    for e in p.key_averages():
        us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if us <= 0:
            continue
        rows[e.key] = (e.count / n, us / n)
    tot = sum(v[1] for v in rows.values())
    cats = {}
    for k, (c, us) in rows.items():
        cats[cat(k)] = cats.get(cat(k), 0) + us
    print(f"\n===== {label}: kernels {tot:.0f} us per UNet call, wall (eager launches) {wall:.0f} us")
    print("  " + "  ".join(f"{k} {v:.0f}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1])))
    for k, (c, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:28]:
        print(f"  {us:8.1f} us {c:6.1f}x  [{cat(k)}] {k[:110]}")
    return dict(total=tot, wall=wall, cats=cats, rows={k: list(v) for k, v in rows.items()})

out = {}
def run_patched():
    m = dm.build("unet", dm.SD15_UNET, dtype, dev, patch=True).to(memory_format=torch.channels_last)
    return lambda: m(x, t, encoder_hidden_states=text).sample

def run_eager_cl():
    m = dm.build("unet", dm.SD15_UNET, dtype, dev, patch=False).to(memory_format=torch.channels_last)
    return lambda: m(x, t, encoder_hidden_states=text).sample

def run_compiled():
    m = dm.build("unet", dm.SD15_UNET, dtype, dev, patch=False)
    c = torch.compile(m)
    return lambda: c(x, t, encoder_hidden_states=text).sample

RUNS = (("flashfuse patched, channels_last", run_patched), ("eager diffusers, channels_last", run_eager_cl),
        ("torch.compile (default mode)", run_compiled))
for label, mk in RUNS[:int(os.environ.get("PROF_RUNS", 3))]:
    t0 = time.time()
    f = mk()
    out[label] = prof(f, label)
    print(f"  ({time.time() - t0:.0f} s)", flush=True)
    del f
    torch.cuda.empty_cache()
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "prof_sd15_unet.json"), "w"), indent=1)
