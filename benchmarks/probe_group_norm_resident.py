"""Probe (session 7): is GroupNorm's RESIDENT mode slow because of its counter meeting?

    PYTHONPATH=src python benchmarks/probe_group_norm_resident.py LABEL OUT.json

Times the GroupNorm + SiLU forward (bf16, SD shapes, NCHW and channels_last) as CUDA-graph replays with
USE_RESIDENT off (the default plans), on (one launch, the counter meeting) and on without the meeting
(RESIDENT_SYNC=False: two launches, no spin), and checks each output against fp32 PyTorch. LABEL names the
source variant; with a LABEL other than "orig" only the one-launch RESIDENT rows run (session 7 ran it a second
time with `_arrive_and_wait` polling the counter through `tl.load(..., volatile=True)` instead of atomics).
The "% copy" column divides by a 1 GiB copy timed the same way, which reads lower than the bench's ceiling:
compare the microseconds. Results: benchmarks/results/h200-2026-11-21-s7/.
"""

import json, sys, time
import torch, torch.nn.functional as F, triton.testing
import flashfuse.ops.group_norm as gn

label = sys.argv[1]
G, EPS = 32, 1e-5
shapes = [(2, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)]
copy_src = torch.empty(1 << 28, device="cuda"); copy_dst = torch.empty_like(copy_src)
copy_ms = triton.testing.do_bench_cudagraph(lambda: copy_dst.copy_(copy_src), rep=200)
copy_gbps = 2 * copy_src.numel() * 4 / copy_ms / 1e6
del copy_src, copy_dst
out = []
for shape in shapes:
    for layout in ("nchw", "cl"):
        torch.manual_seed(0)
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        if layout == "cl":
            x = x.contiguous(memory_format=torch.channels_last)
        w = (1 + 0.1 * torch.randn(shape[1], device="cuda")).bfloat16()
        b = (0.1 * torch.randn(shape[1], device="cuda")).bfloat16()
        ref = F.silu(F.group_norm(x.float(), G, w.float(), b.float(), EPS))
        for variant, knobs in (("default", dict(USE_RESIDENT=False)),
                               ("resident", dict(USE_RESIDENT=True, RESIDENT_SYNC=True)),
                               ("resident-2launch", dict(USE_RESIDENT=True, RESIDENT_SYNC=False))):
            if label != "orig" and variant != "resident":
                continue
            for k, v in knobs.items():
                setattr(gn, k, v)
            fn = lambda: gn.group_norm_forward(x, G, w, b, EPS, "silu")
            y = fn()[0]
            torch.cuda.synchronize()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            t0 = time.time()
            ms = triton.testing.do_bench_cudagraph(fn, rep=100)
            pct = 100 * 2 * x.numel() * 2 / ms / 1e6 / copy_gbps
            row = dict(label=label, variant=variant, shape=shape, layout=layout, us=ms * 1e3, pct_copy=pct,
                       rel_err=err, nan=bool(torch.isnan(y).any()))
            out.append(row)
            print(f"{label:8s} {variant:17s} {'x'.join(map(str, shape)):15s} {layout:4s} {ms*1e3:9.1f} us "
                  f"{pct:5.1f}% err {err:.1e} nan {row['nan']}", flush=True)
gn.USE_RESIDENT = False
print(f"copy {copy_gbps:.0f} GB/s")
json.dump(out, open(sys.argv[2], "w"))
