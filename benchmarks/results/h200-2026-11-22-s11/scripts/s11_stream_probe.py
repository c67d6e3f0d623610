"""Session 11 probe 3: the ceiling of the LAG loop structure. The same persistent programs and tile walk as
s11_lagtma_probe.py's main loop, with the GroupNorm arithmetic taken out:
  copy1: y = x (TMA load, pointer store): one read, one write per tile, what a copy kernel of this shape does;
  copy2: also loads the previous group's tile (the L2 re-read) and adds it in: LAG's memory traffic exactly.
If copy1 streams near x.clone() and copy2 near LAG, the re-read is the cost; if copy1 is already slow, the loop
(TMA loads through Triton's pipeliner at 2-4 programs per SM) is."""
import torch, triton, triton.language as tl, os, sys, time, json

@triton.jit
def stream_kernel(X, Y, N_GROUPS, RPG, R_TOTAL, BR: tl.constexpr, STAGES: tl.constexpr, REREAD: tl.constexpr):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    n_mine = (N_GROUPS - pid + P - 1) // P
    n_t = RPG // BR
    xd = tl.make_tensor_descriptor(X, [R_TOTAL, 256], [256, 1], [BR, 256])
    g = pid.to(tl.int64)
    for j in range(0, n_mine):
        gp = tl.maximum(g - P, 0)
        for t in tl.range(0, n_t, num_stages=STAGES):
            row = (g * RPG + t * BR).to(tl.int32)
            s = xd.load([row, 0]).to(tl.float32)
            if REREAD:
                s += xd.load([(gp * RPG + t * BR).to(tl.int32), 0]).to(tl.float32)
            o = (row + tl.arange(0, BR)).to(tl.int64)[:, None] * 256 + tl.arange(0, 256)[None, :]
            tl.store(Y + o, s.to(Y.dtype.element_ty))
        g += P

if __name__ == "__main__":
    from flashfuse.ops._triton import ensure_tma_allocator
    ensure_tma_allocator()
    out = os.environ.get("OUT", "/tmp")
    rows = []
    for shape in ((16, 1280, 32, 32), (16, 640, 64, 64), (8, 320, 128, 128), (8, 320, 64, 64)):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        rpg = (shape[1] // 32) * shape[2] * shape[3] // 256
        nbytes = 2 * x.numel() * 2
        gbs = lambda us: nbytes / (us * 1e-6) / 1e9
        timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
        res = {"shape": shape, "clone": timed(lambda: x.clone())}
        for rr in (False, True):
            for pps in (1, 2, 3, 4, 6, 8):
                for br, warps in ((16, 4), (32, 4), (8, 4), (16, 8)):
                    for st in (2, 3, 4):
                        P = min(pps * 132, shape[0] * 32)
                        fn = lambda: stream_kernel[(P,)](x, y, shape[0] * 32, rpg, x.numel() // 256, br, st, rr, num_warps=warps)
                        fn()
                        if not rr:
                            assert torch.equal(y, x)
                        res[f"{'copy2' if rr else 'copy1'}-{pps}-{br}-{warps}-{st}"] = timed(fn)
        rows.append(res)
        for kind in ("copy1", "copy2"):
            cands = {k: v for k, v in res.items() if k.startswith(kind)}
            best = min(cands, key=cands.get)
            print(f"{str(shape):18s} clone {gbs(res['clone']):5.0f} GB/s  {kind} best {best} {gbs(cands[best]):5.0f} GB/s   "
                  + " ".join(f"{k[6:]}:{gbs(v):.0f}" for k, v in sorted(cands.items(), key=lambda kv: kv[1])[:6]), flush=True)
    json.dump(rows, open(f"{out}/stream_probe.json", "w"), indent=1, default=str)
