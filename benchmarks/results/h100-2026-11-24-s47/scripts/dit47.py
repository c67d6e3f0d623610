"""Session 47: the DiT-XL/2 step (batch 32, fp16) patched vs eager vs torch.compile: step times (CUDA-graph and
eager) and a kernel-time breakdown per model (torch.profiler, eager calls, grouped by kernel)."""
import os, json, re, collections, torch
from torch.profiler import profile, ProfilerActivity
from torch.autograd import DeviceType
from flashfuse.bench.suites import _diffusion_models as dm
from flashfuse.cuda_graph import cuda_graph

OUT = os.environ.get("OUT", "/tmp")
dev, dtype, B = "cuda", torch.float16, 32
cfg = dm.DIT_XL_2
g = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(B, 4, 32, 32, device=dev, dtype=dtype, generator=g)
t = torch.randint(0, 1000, (B,), device=dev, generator=g)
y = torch.randint(0, 1000, (B,), device=dev, generator=g)

def step(m):
    with torch.no_grad():
        return dm.dit_step(m, x, t, y)

def time_ms(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]

def kernels(fn, name):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3): fn()
        torch.cuda.synchronize()
    acc = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            acc[e.name][0] += e.device_time_total / 3; acc[e.name][1] += 1
    tot = sum(v[0] for v in acc.values())
    print(f"--- {name}: {tot / 1e3:.2f} ms of kernels per step, {sum(v[1] for v in acc.values()) // 3} launches", flush=True)
    cats = collections.defaultdict(float)
    for k, (us, n) in acc.items():
        c = ("gemm" if re.search(r"gemm|nvjet|sm90_xmma|cutlass|cublas|mm_", k, re.I) else
             "attn" if re.search(r"attn|fmha|flash|fwd_kernel|_fwd", k, re.I) else "other")
        cats[c] += us
    print("    " + "  ".join(f"{c} {us / 1e3:.2f} ms" for c, us in sorted(cats.items())), flush=True)
    for k, (us, n) in sorted(acc.items(), key=lambda kv: -kv[1][0])[:22]:
        print(f"    {us:8.1f} us {n // 3:4d}x  {k[:150]}", flush=True)
    return dict(total_us=tot, cats=cats, top={k: v for k, v in sorted(acc.items(), key=lambda kv: -kv[1][0])[:40]})

res = {}
ref = dm.build("dit", cfg, dtype, dev, patch=False)
out_ref = step(ref).float()
res["eager"] = dict(ms=time_ms(lambda: step(ref)), prof=kernels(lambda: step(ref), "eager diffusers"))
pat = dm.build("dit", cfg, dtype, dev, patch=True)
err = ((step(pat).float() - out_ref).abs().max() / out_ref.abs().max()).item()
print("patched vs eager rel err", err, flush=True)
res["patched"] = dict(ms=time_ms(lambda: step(pat)), prof=kernels(lambda: step(pat), "patched eager"))
gp = cuda_graph(pat)
res["patched_graph"] = dict(ms=time_ms(lambda: step(gp)))
del gp
comp = torch.compile(ref)
res["compile"] = dict(ms=time_ms(lambda: step(comp)), prof=kernels(lambda: step(comp), "compile default"))
ref2 = dm.build("dit", cfg, dtype, dev, patch=False)
ro = torch.compile(ref2, mode="reduce-overhead")
res["compile_ro"] = dict(ms=time_ms(lambda: step(ro)))
pc = torch.compile(pat)
res["patched_compile"] = dict(ms=time_ms(lambda: step(pc)), prof=kernels(lambda: step(pc), "patched + compile"))
for k, v in res.items():
    print(f"{k:16s} {v['ms']:7.2f} ms", flush=True)
json.dump(res, open(os.path.join(OUT, "dit47.json"), "w"), indent=1, default=str)
