"""Probe (session 25, for a GPU session): the channels_last Gluon backward vs the Triton plans.

    OUT=dir PYTHONPATH=src python benchmarks/probe_group_norm_cl_backward.py

Times group_norm_backward (SiLU, 32 groups, bf16, channels_last x and dy) at SD shapes with and without the
(N, C, 1, 1) time embedding as CUDA-graph replays: group_norm_details/_hopper_bwd_cl.py (HOPPER_BWD_CL on; plans
under MIN_FILL forced and starred) with 1 compute partition of 16 warps and 2 of 8 (session 26) beside the Triton
plans (off), with the largest relative difference of any gradient between the two. "%": 3 tensor passes (x, dy read, dx written) over an H100's 3000 GB/s copy ceiling.
Writes OUT/cl_bwd.json.
"""
import json, os
import torch, triton
import flashfuse.ops.group_norm as G
out = os.environ.get("OUT", "/tmp")
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
CL = torch.channels_last
rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
rows = []
VARIANTS = [(1, 16), (2, 8)]      # the first is the default
for shape in [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 640, 32, 32),
              (4, 640, 64, 64), (16, 320, 64, 64)]:
    for temb in (False, True):
        torch.manual_seed(0)
        x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=CL)
        C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        y, mean, rstd = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        dy = torch.randn_like(y)
        bwd = lambda: G.group_norm_backward(dy, x, 32, w, b, mean, rstd, "silu", r)
        res = {"shape": shape, "temb": temb}
        G.HOPPER_BWD_CL = False
        g0 = bwd(); res["triton"] = timed(bwd)
        G.HOPPER_BWD_CL = True
        p = G.hopper_bwd_cl.plan(shape[0], C, shape[2] * shape[3], 2, 132)
        res["plan"] = str(p)
        if p is None:
            G.hopper_bwd_cl.MIN_FILL = 0.0
            p = G.hopper_bwd_cl.plan(shape[0], C, shape[2] * shape[3], 2, 132)
            res["forced"] = str(p)
        if p is not None:
            for parts, warps in VARIANTS:       # compute partitions x warps (PARTS_BWD_CL, WARPS_BWD_CL)
                G.hopper_bwd_cl.PARTS_BWD_CL, G.hopper_bwd_cl.WARPS_BWD_CL = parts, warps
                g1 = bwd(); res[f"gluon_{parts}x{warps}"] = timed(bwd)
                res[f"err_{parts}x{warps}"] = [None if a is None else rel(a, c) for a, c in zip(g1, g0)]
            G.hopper_bwd_cl.PARTS_BWD_CL, G.hopper_bwd_cl.WARPS_BWD_CL = VARIANTS[0]
            res["gluon"] = res[f"gluon_{VARIANTS[0][0]}x{VARIANTS[0][1]}"]
        G.hopper_bwd_cl.MIN_FILL = 0.9
        res["clone"] = timed(lambda: x.clone())
        nb = 3 * x.numel() * 2
        rows.append(res)
        gl_us = res.get("gluon", float("nan"))
        print(f"{str(shape):18s} temb={temb:d} bwd gluon {gl_us:6.1f}{'*' if 'forced' in res else ' '} "
              f"({nb / gl_us / 3e6:4.0%}) triton {res['triton']:6.1f} ({nb / res['triton'] / 3e6:4.0%}) | clone "
              f"{res['clone']:5.1f} | " + " ".join(f"{k} {v:6.1f}" for k, v in res.items() if k.startswith("gluon_")) +
              f" err {max((e or 0) for k, v in res.items() if k.startswith('err_') for e in v):.1e} "
              f"{res.get('forced', res['plan'])}", flush=True)
json.dump(rows, open(f"{out}/cl_bwd.json", "w"), indent=1)
