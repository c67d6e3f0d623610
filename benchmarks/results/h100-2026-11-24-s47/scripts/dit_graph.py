"""Session 47: the patched DiT-XL/2 step (batch 32, fp16) as one CUDA graph, kernel-time breakdown and step time,
for whichever flashfuse is on PYTHONPATH (A/B: the session's start vs now)."""
import os, sys, collections, re, torch
from torch.profiler import profile, ProfilerActivity
from torch.autograd import DeviceType
import flashfuse
from flashfuse.bench.suites import _diffusion_models as dm
from flashfuse.cuda_graph import cuda_graph
tag = sys.argv[1]
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(32, 4, 32, 32, device="cuda", dtype=torch.float16, generator=g)
t = torch.randint(0, 1000, (32,), device="cuda", generator=g); y = torch.randint(0, 1000, (32,), device="cuda", generator=g)
pat = dm.build("dit", dm.DIT_XL_2, torch.float16, "cuda", patch=True)
step = lambda m: dm.dit_step(m, x, t, y)
with torch.no_grad():
    for _ in range(3): step(pat)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3): step(pat)
        torch.cuda.synchronize()
    acc = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            acc[e.name] += e.device_time_total / 3
    print(f"[{tag}] {sum(acc.values()) / 1e3:.2f} ms of kernels per step", flush=True)
    for k, us in sorted(acc.items(), key=lambda kv: -kv[1])[:10]:
        print(f"[{tag}]   {us:8.1f} us  {k[:110]}", flush=True)
    gp = cuda_graph(pat)
    ts = []
    for i in range(40):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(gp); b.record(); torch.cuda.synchronize()
        if i >= 5: ts.append(a.elapsed_time(b))
    ts.sort()
    print(f"[{tag}] patched + CUDA graph: median {ts[len(ts) // 2]:.2f} ms, min {ts[0]:.2f}", flush=True)
