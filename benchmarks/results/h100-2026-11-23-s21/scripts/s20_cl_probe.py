"""Session 20: the channels_last Gluon forward (group_norm_details/_hopper_fwd_cl.py) vs the Triton plans (HOPPER_FWD
off) and x.clone(), GroupNorm + SiLU, graph-timed, same run; with / without the (N, C, 1, 1) time embedding."""
import json, os, sys, time
import torch, triton
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm_details import _hopper_fwd_cl as CL
from flashfuse.ops._triton import sm_count
out = os.environ.get("OUT", "/tmp")
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[os.environ.get("DT", "bf16")]
SHAPES = [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)]
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
for shape in SHAPES:
    for temb in (False, True):
        torch.manual_seed(0)
        x = (torch.randn(shape, device="cuda", dtype=dtype) * 2 + 1).to(memory_format=torch.channels_last)
        C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=dtype) if temb else None
        res = {"shape": shape, "temb": temb, "plan": str(CL.plan(shape[0], shape[1], shape[2] * shape[3], x.element_size(), sm_count(x.device)))}
        G.HOPPER_FWD = True
        y1, m1, r1 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res["gluon"] = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
        G.HOPPER_FWD = False
        y0, m0, r0 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res["triton"] = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
        res["clone"] = timed(lambda: x.clone())
        res["err"] = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
        res["err_mean"] = (m1 - m0).abs().max().item()
        nb = 2 * x.numel() * x.element_size()
        rows.append(res)
        print(f"{str(shape):18s} temb={temb:d} gluon {res['gluon']:7.1f} us {nb / res['gluon'] / 1e3:6.0f} GB/s  triton "
              f"{res['triton']:7.1f} us {nb / res['triton'] / 1e3:6.0f} GB/s  clone {res['clone']:6.1f} us "
              f"{nb / res['clone'] / 1e3:6.0f} GB/s  err {res['err']:.1e} dmean {res['err_mean']:.1e} {res['plan']}", flush=True)
json.dump(rows, open(f"{out}/cl_probe.json", "w"), indent=1)
