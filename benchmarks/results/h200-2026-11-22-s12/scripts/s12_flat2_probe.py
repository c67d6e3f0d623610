"""Session 12 probe 4: LAG as one pipelined loop with the finalize in a branch (lag_flat2_fwd) vs nested LAG."""
import torch, triton, json, os, sys, time
sys.path.insert(0, os.path.dirname(__file__))
from s12_lag2 import run_lag2, run_flat2
from flashfuse.ops.group_norm import group_norm_forward
from flashfuse.ops._triton import ensure_tma_allocator
ensure_tma_allocator()
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
TILES = ((16, 4, 3), (16, 4, 4), (32, 8, 3), (32, 8, 4), (32, 16, 4))
PS = (132, 198, 264, 396)
rows = []
t0 = time.time()
for shape in ((16, 1280, 32, 32), (8, 320, 64, 64), (4, 1280, 32, 32), (16, 640, 32, 32), (2, 320, 64, 64),
              (16, 640, 64, 64), (8, 320, 128, 128)):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.float(), 32, w, b, 1e-5))
    pct = lambda us: 4 * x.numel() / (us * 1e-6) / 1e9 / CEIL
    timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3
    res = {"shape": shape, "default": timed(lambda: group_norm_forward(x, 32, w, b, 1e-5, "silu", None))}
    rpg = (shape[1] // 32) * shape[2] * shape[3] // 256
    best = {}
    for kind, fn in (("nest", run_lag2), ("flat", run_flat2)):
        for tile in TILES:
            if rpg % tile[0]:
                continue
            for P in PS:
                call = (lambda: fn(x, w, b, 32, P, *tile, 0)) if kind == "nest" else (lambda: fn(x, w, b, 32, P, *tile))
                y, m, r = call()
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                if not err < 2e-2:
                    res[str((kind, tile, P))] = f"WRONG {err:.2e}"; continue
                us = timed(call)
                res[str((kind, tile, P))] = us
                if kind not in best or us < best[kind][1]:
                    best[kind] = ((tile, P), us)
    res["best"] = best
    rows.append(res)
    print(f"{str(shape):18s} default {res['default']:6.1f} us {pct(res['default']):5.1%} | " + "  ".join(
        f"{k} {v[0]} {v[1]:6.1f} us {pct(v[1]):5.1%}" for k, v in best.items()), flush=True)
    for tile in TILES:
        print("     flat", tile, "  ".join(f"P{P}:{pct(res[str(('flat', tile, P))]):5.1%}" if isinstance(res.get(str(('flat', tile, P))), float) else f"P{P}:-" for P in PS), flush=True)
json.dump(rows, open(f"{out}/flat2_probe.json", "w"), indent=1, default=str)
print(f"done {time.time() - t0:.0f} s")
