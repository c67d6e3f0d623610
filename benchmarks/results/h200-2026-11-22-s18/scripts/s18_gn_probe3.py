"""Session 18 probe 3: Gluon GroupNorm forward variants (affine / residual rows a tile ahead; two compute partitions) vs the Triton
plans and x.clone(), bf16 NCHW, graph-timed, same run."""
import json, os, sys, time
import torch, triton
import flashfuse.ops.group_norm as G
H = G.hopper_fwd
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
SHAPES = [((2, 320, 64, 64), False), ((16, 1280, 32, 32), False), ((16, 640, 64, 64), False), ((16, 640, 64, 64), True),
          ((8, 320, 64, 64), False), ((8, 640, 32, 32), True)]
VARIANTS = {
    "p1w8": dict(PARTS=1, COMPUTE_WARPS=8, TILE_BYTES=16384, SLOTS=14, COMPUTE_REGS=160),
    "p2w4r16": dict(PARTS=2, COMPUTE_WARPS=4, TILE_BYTES=8192, SLOTS=28, COMPUTE_REGS=168),
    "p2w8r16": dict(PARTS=2, COMPUTE_WARPS=8, TILE_BYTES=8192, SLOTS=28, COMPUTE_REGS=112),
    "p2w8r16s27": dict(PARTS=2, COMPUTE_WARPS=8, TILE_BYTES=8192, SLOTS=27, COMPUTE_REGS=112),
}
H.MIN_GROUPS_PER_SM = 0
DEFAULTS = {k: getattr(H, k) for k in ("PARTS", "COMPUTE_WARPS", "TILE_BYTES", "SLOTS", "COMPUTE_REGS")}
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
    for name, v in VARIANTS.items():
        for key, val in {**DEFAULTS, **v}.items():
            setattr(H, key, val)
        y1, m1, r1 = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        torch.cuda.synchronize()
        err = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
        rerr = ((r1 - r0).abs() / r0).max().item()
        us = timed(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r))
        res[name] = dict(us=us, err=err, rstd_err=rerr)
        line += f" {name} {us:6.1f} {pct(us):5.1%} e{err:.0e}/{rerr:.0e} |"
    rows.append(res)
    print(line, flush=True)
json.dump({"rows": rows}, open(f"{out}/gn_probe3.json", "w"), indent=1, default=str)
print(f"done {time.time() - t0:.0f} s")
