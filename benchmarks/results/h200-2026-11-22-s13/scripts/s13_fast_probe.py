"""Session 13 probe 5: the read-once bodies with the fast SiLU (glu.py's MUFU ex2 + rcp instead of an IEEE
division): s13_coop (registers, MEET 0/1) and s13_coop_tma (TMA, MEET 0), vs default and clone; bf16 NCHW."""
import torch, triton, json, os, sys, time, traceback
sys.path.insert(0, os.path.dirname(__file__))
from s13_coop import run, plan
from s13_coop_tma import run_tma
from flashfuse.ops.group_norm import group_norm_forward
from flashfuse.ops._triton import ensure_tma_allocator
ensure_tma_allocator()
out = os.environ.get("OUT", "/tmp")
CEIL = 4221.0
VARIANTS = [  # ("reg", chunk, warps, meet, fast) / ("tma", chunk, warps, stages, fast)
    ("reg", 8192, 8, 1, False), ("reg", 8192, 8, 0, True), ("reg", 8192, 8, 1, True), ("reg", 4096, 4, 1, True),
    ("reg", 8192, 4, 1, True), ("reg", 4096, 8, 1, True), ("reg", 16384, 8, 1, True), ("reg", 2048, 4, 1, True),
    ("tma", 4096, 4, 3, True), ("tma", 8192, 8, 3, True), ("tma", 4096, 4, 4, True),
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
        try:
            if v[0] == "reg":
                _, chunk, warps, meet, fast = v
                fn = lambda: run(x, w, b, 32, chunk, warps, meet=meet, fast=fast)
                st = plan(x, 32, chunk, warps, 99, meet, fast=fast)
            else:
                _, chunk, warps, stages, fast = v
                meet = 0
                fn = lambda: run_tma(x, w, b, 32, chunk, warps, stages, 0, fast=fast)[0]
                st = None
            y = fn(); torch.cuda.synchronize()
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            us = timed(fn)
            y = fn(); torch.cuda.synchronize()
            err2 = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            if st is None:
                st = run_tma(x, w, b, 32, chunk, warps, stages, 0, fast=fast)[1]
            ok = err < 2e-2 and err2 < 2e-2
            res[str(v)] = dict(us=us, err=err, err2=err2, regs=st["regs"], occ=st["occ"], P=st["P"], K=st["K"])
            line += f" {v[1:]}: {us:6.1f} {pct(us):5.1%}{'' if ok or not meet else ' WRONG'} r{st['regs']} o{st['occ']} |"
        except Exception as e:
            res[str(v)] = repr(e)[:400]
            line += f" {v}: ERR {repr(e)[:80]} |"
            traceback.print_exc()
    rows.append(res)
    print(line, flush=True)
json.dump({"rows": rows}, open(f"{out}/fast_probe.json", "w"), indent=1, default=str)
print(f"done {time.time() - t0:.0f} s")
