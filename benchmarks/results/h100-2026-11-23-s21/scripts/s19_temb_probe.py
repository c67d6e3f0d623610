"""Session 19: GroupNorm + SiLU with and without the (N, C, 1, 1) time embedding, bf16, both layouts, graph-timed:
the tree on PYTHONPATH (run twice: before / after the RES_PER_CHANNEL fix) vs x.clone(). fwd and fwd+bwd (autograd:
dx, dw, db, dtemb). Prints one row per case; JSON to $OUT/temb_<tag>.json."""
import json, os, sys, time
import torch, triton
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm import group_norm
tag = sys.argv[1]
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
SHAPES = [(2, 320, 64, 64), (8, 320, 64, 64), (8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)]
timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
rows = []
for shape in SHAPES:
    for cl in (False, True):
        for temb in (False, True):
            torch.manual_seed(0)
            x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
            if cl:
                x = x.to(memory_format=torch.channels_last)
            C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
            r = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
            y = group_norm(x, 32, w, b, 1e-5, "silu", r)
            ref = torch.nn.functional.silu(torch.nn.functional.group_norm((x if r is None else x + r).float(), 32, w, b))
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            fwd = timed(lambda: group_norm(x, 32, w, b, 1e-5, "silu", r))
            xl = x.detach().requires_grad_(); wl = w.detach().requires_grad_(); bl = b.detach().requires_grad_()
            rl = None if r is None else r.detach().requires_grad_()
            dy = torch.randn_like(x)
            def step():
                y = group_norm(xl, 32, wl, bl, 1e-5, "silu", rl)
                torch.autograd.grad(y, [t for t in (xl, wl, bl, rl) if t is not None], dy)
            step()
            fb = timed(step)
            nb = x.numel() * 2
            res = dict(shape=shape, channels_last=cl, temb=temb, fwd_us=fwd, fwd_pct=2 * nb / (fwd * 1e3) / CEIL,
                       fb_us=fb, fb_pct=5 * nb / (fb * 1e3) / CEIL, err=err)
            rows.append(res)
            print(f"{tag:5s} {str(shape):18s} {'cl  ' if cl else 'nchw'} temb={temb:d} fwd {fwd:7.1f} us "
                  f"{res['fwd_pct']:6.1%} fwd+bwd {fb:7.1f} us {res['fb_pct']:6.1%} err {err:.1e}", flush=True)
json.dump(rows, open(f"{out}/temb_{tag}.json", "w"), indent=1)
