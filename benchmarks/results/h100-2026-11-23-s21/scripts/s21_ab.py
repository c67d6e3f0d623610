"""Session 21: A/B of the channels_last Gluon forward, same run: "before" (.gpu/cl_before_stats.py, per-position
shifted statistics) vs the working tree ("after"), Triton plans and clone; bf16, graph-timed; error vs Triton."""
import importlib, json, os, shutil, sys
import torch, triton
import flashfuse.ops.group_norm as G
src_dir = "src/flashfuse/ops/group_norm_details"
shutil.copy(".gpu/cl_before_stats.py", f"{src_dir}/_cl_before.py")
before = importlib.import_module("flashfuse.ops.group_norm_details._cl_before")
after = G.hopper_fwd_cl
out = os.environ.get("OUT", "/tmp")
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
for shape in [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (2, 640, 32, 32), (12, 640, 40, 40)]:
    for temb in (False, True):
        torch.manual_seed(0)
        x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=torch.channels_last)
        C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
        r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
        f = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        res = {"shape": shape, "temb": temb}
        G.HOPPER_FWD = False
        y0, m0, s0 = f(); res["triton"] = timed(f)
        G.HOPPER_FWD = True
        for name, mod in (("before", before), ("after", after)):
            G.hopper_fwd_cl = mod
            y1, m1, s1 = f(); res[name] = timed(f)
            res[name + "_err"] = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
            res[name + "_drstd"] = ((s1 - s0).abs() / s0).max().item()
        G.hopper_fwd_cl = after
        res["clone"] = timed(lambda: x.clone())
        nb = 2 * x.numel() * 2
        rows.append(res)
        print(f"{str(shape):18s} temb={temb:d} before {res['before']:6.1f} after {res['after']:6.1f} us ({nb / res['after'] / 3e6:4.0%} of 3000 GB/s)"
              f" triton {res['triton']:6.1f} clone {res['clone']:5.1f}  err {res['before_err']:.1e} {res['after_err']:.1e}"
              f" drstd {res['before_drstd']:.1e} {res['after_drstd']:.1e}", flush=True)
json.dump(rows, open(f"{out}/ab.json", "w"), indent=1)
