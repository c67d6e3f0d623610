"""Probe (session 7): do L2 eviction hints keep GroupNorm's second read of x in L2?

    PYTHONPATH=src python benchmarks/probe_group_norm_evict.py LABEL OUT.json

Times the GroupNorm + SiLU forward (bf16, SD shapes; NCHW with the default plan and with LOOP forced, and
channels_last) as CUDA-graph replays, checked against fp32 PyTorch; "% of 4240 GB/s" uses the bench's copy
ceiling of the session. Session 7 ran it as is ("orig") and with the first-pass loads of x marked
evict_last and the stores of y evict_first ("evict"). Results: benchmarks/results/h200-2026-11-21-s7/.
"""
import json, sys
import torch, torch.nn.functional as F, triton.testing
import flashfuse.ops.group_norm as gn

label, G, EPS = sys.argv[1], 32, 1e-5
shapes = [(2, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32), (2, 640, 128, 128), (2, 1280, 64, 64)]
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
        for variant, knobs in (("default", dict(CHUNKED_NCHW_MIN_GROUP=65536)),
                               ("loop", dict(CHUNKED_NCHW_MIN_GROUP=1 << 40))):
            if layout == "cl" and variant == "loop":
                continue
            for k, v in knobs.items():
                setattr(gn, k, v)
            gn.chunk_plan.cache_clear()
            fn = lambda: gn.group_norm_forward(x, G, w, b, EPS, "silu")
            y = fn()[0]
            err = ((y.float() - ref).norm() / ref.norm()).item()
            ms = triton.testing.do_bench_cudagraph(fn, rep=200)
            row = dict(label=label, variant=variant, shape=shape, layout=layout, us=ms * 1e3,
                       pct_copy_4240=100 * 2 * x.numel() * 2 / ms / 1e6 / 4240, rel_err=err)
            out.append(row)
            print(f"{label:6s} {variant:8s} {'x'.join(map(str, shape)):15s} {layout:4s} {ms*1e3:8.1f} us "
                  f"{row['pct_copy_4240']:5.1f}% of 4240 GB/s  err {err:.1e}", flush=True)
json.dump(out, open(sys.argv[2], "w"))
