"""Session 13 probe 1: cooperative read-once GroupNorm + SiLU forward (s13_coop.py), NCHW; probe 2: prefetch and the data-as-flag meeting (MEET=2) bf16, vs the default plan
and x.clone(), same run, graph-timed. MEET=0 rows time the body without the meeting (wrong answers)."""
import torch, triton, json, os, sys, time, traceback
sys.path.insert(0, os.path.dirname(__file__))
from s13_coop import run, plan
from flashfuse.ops.group_norm import group_norm_forward
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
VARIANTS = [  # (chunk, warps, meet, prefetch)
    (8192, 8, 1, 0), (8192, 8, 2, 0), (8192, 8, 0, 1), (8192, 8, 1, 1), (8192, 8, 2, 1), (4096, 4, 2, 1),
    (4096, 8, 2, 1), (8192, 4, 2, 1), (16384, 8, 2, 1), (4096, 4, 0, 1),
]
rows = []
t0 = time.time()
for shape in ((16, 1280, 32, 32), (16, 640, 64, 64), (8, 320, 128, 128), (8, 320, 64, 64), (2, 320, 128, 128),
              (2, 640, 64, 64), (2, 1280, 32, 32)):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.float(), 32, w, b, 1e-5))
    nbytes = 2 * x.numel() * 2
    pct = lambda us: nbytes / (us * 1e-6) / 1e9 / CEIL
    timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3
    res = {"shape": shape, "default": timed(lambda: group_norm_forward(x, 32, w, b, 1e-5, "silu", None)),
           "clone": timed(lambda: x.clone())}
    line = f"{str(shape):18s} default {res['default']:6.1f} us {pct(res['default']):5.1%}  clone {res['clone']:6.1f} us {pct(res['clone']):5.1%} |"
    for v in VARIANTS:
        chunk, warps, meet, pf = v
        occ_cap, coop = 99, True
        try:
            st = plan(x, 32, chunk, warps, occ_cap, meet, prefetch=bool(pf))
            y = run(x, w, b, 32, chunk, warps, occ_cap, meet, coop=coop, prefetch=bool(pf))
            torch.cuda.synchronize()
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            us = timed(lambda: run(x, w, b, 32, chunk, warps, occ_cap, meet, coop=coop, prefetch=bool(pf)))
            y = run(x, w, b, 32, chunk, warps, occ_cap, meet, coop=coop, prefetch=bool(pf))
            torch.cuda.synchronize()
            err2 = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            ok = err < 2e-2 and err2 < 2e-2
            res[str(v)] = dict(us=us, err=err, err2=err2, regs=st["regs"], occ=st["occ"], P=st["P"], K=st["K"])
            line += f" {v}: {us:6.1f} {pct(us):5.1%}{'' if ok or not meet else ' WRONG'} r{st['regs']} o{st['occ']} K{st['K']} |"
        except Exception as e:
            res[str(v)] = repr(e)[:400]
            line += f" {v}: ERR {repr(e)[:80]} |"
            traceback.print_exc()
    rows.append(res)
    print(line, flush=True)
json.dump({"rows": rows}, open(f"{out}/coop_probe2.json", "w"), indent=1, default=str)
print(f"done {time.time() - t0:.0f} s")
