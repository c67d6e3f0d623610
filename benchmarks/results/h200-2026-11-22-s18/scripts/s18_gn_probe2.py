"""Session 18 probe 2: Gluon GroupNorm forward variants (compute warps, one-pass shifted statistics) vs the Triton
plans and x.clone(), bf16 NCHW, graph-timed, same run."""
import json, os, sys, time
import torch, triton
import flashfuse.ops.group_norm as G
H = G.hopper_fwd
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
SHAPES = [((2, 320, 64, 64), False), ((16, 1280, 32, 32), False), ((16, 640, 64, 64), False), ((16, 640, 64, 64), True),
          ((8, 320, 64, 64), False), ((8, 640, 32, 32), True)]
VARIANTS = [(8, False), (8, True), (16, False), (16, True)]
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
t0 = time.time()
for shape, temb in SHAPES:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
    nbytes = 2 * x.numel() * 2
    pct = lambda us: nbytes / (us * 1e-6) / 1e9 / CEIL
    res = {"shape": shape, "temb": temb}
    G.HOPPER_FWD = False
    y0, m0, r0 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
    res["default"] = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
    res["clone"] = timed(lambda: x.clone())
    G.HOPPER_FWD = True
    line = f"{str(shape):18s} temb={temb:d} default {res['default']:6.1f} us {pct(res['default']):5.1%} clone {res['clone']:5.1f} {pct(res['clone']):5.1%} |"
    for warps, one_pass in VARIANTS:
        H.COMPUTE_WARPS, H.ONE_PASS = warps, one_pass
        y1, m1, r1 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        torch.cuda.synchronize()
        err = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
        rerr = ((r1 - r0).abs() / r0).max().item()
        us = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
        res[f"w{warps}p{one_pass:d}"] = dict(us=us, err=err, rstd_err=rerr)
        line += f" w{warps} {'1p' if one_pass else '2p'} {us:6.1f} {pct(us):5.1%} e{err:.0e}/{rerr:.0e} |"
    rows.append(res)
    print(line, flush=True)
json.dump({"rows": rows}, open(f"{out}/gn_probe2.json", "w"), indent=1, default=str)
print(f"done {time.time() - t0:.0f} s")
