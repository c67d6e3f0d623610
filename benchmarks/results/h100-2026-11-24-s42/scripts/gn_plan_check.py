"""Session 42: the plan rules before (1d0b6d7) and after (MIN_ROUNDS in the forward; the backward's time model) at
shapes whose plan changed, graph-timed, 3 rounds alternating: forward (old vs new forward plan) and forward + backward
(new forward plan; old vs new backward plan)."""
import torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops import group_norm as gnm
from flashfuse.ops.group_norm_details import _hopper_bwd as hb, _hopper_fwd as hf
from flashfuse.ops._triton import cdiv

new_f, new_b = hf.plan, hb.plan


def old_chunking(n, c, hw, groups, es, sms, max_tiles, min_fill, split):
    cols, tile_rows = hf.ROW_BYTES // es, hf.TILE_BYTES // hf.ROW_BYTES
    if hw % cols:
        return None
    cpg, rpc, ng = c // groups, hw // cols, n * groups
    best = None
    for k in range(1, min(cpg, hf.K_PAD_MAX, sms) + 1):
        tiles = cdiv(cpg // k * rpc, tile_rows)
        if cpg % k or tiles > max_tiles:
            continue
        per_round = min(sms // k, ng)
        cost = cdiv(ng, per_round) * tiles
        if best is None or cost < best[0]:
            best = (cost, hf.Plan(k, cpg // k * rpc, per_round))
        if not split:
            break
    if best is None or ng * cpg * rpc < min_fill * best[0] * tile_rows * sms:
        return None
    return best[1]


old_f = lambda n, c, hw, g, es, sms, *a, **k: old_chunking(n, c, hw, g, es, sms, hf.SLOTS, hf.MIN_FILL, False)
old_b = lambda n, c, hw, g, es, sms: old_chunking(n, c, hw, g, es, sms, hb.MAX_CHUNK_TILES, hb.MIN_FILL, True)
import sys
FWD = [(1, 512, 128), (1, 640, 128), (2, 1280, 64), (2, 320, 128), (2, 960, 64), (2, 512, 64), (2, 640, 96)]
BWD = [(2, 640, 64), (2, 320, 128)]


def bench(f, variants):
    res = {k: [] for k in variants}
    for rnd in range(3):
        for k in (list(variants) if rnd % 2 == 0 else list(variants)[::-1]):
            variants[k]()
            res[k].append(do_bench_cudagraph(f, rep=40, return_mode="median") * 1e3)
    return {k: sorted(v)[1] for k, v in res.items()}


def setf(p):
    hf.plan = p


def setb(p):
    hb.plan = p


for shapes, mode in ((FWD, "fwd"), (BWD, "fwd+bwd")):
    for (n, c, h) in shapes:
        torch.manual_seed(0)
        x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16, requires_grad=mode != "fwd")
        w = (1 + 0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)).requires_grad_(mode != "fwd")
        b = (0.1 * torch.randn(c, device="cuda", dtype=torch.bfloat16)).requires_grad_(mode != "fwd")
        if mode == "fwd":
            f = lambda: gnm.group_norm(x, 32, w, b, 1e-5, activation="silu")
            po, pn = old_f(n, c, h * h, 32, 2, 132), new_f(n, c, h * h, 32, 2, 132)
            t = bench(f, {"old": lambda: setf(old_f), "new": lambda: setf(new_f)})
        else:
            dy = torch.randn_like(x)
            f = lambda: torch.autograd.grad(gnm.group_norm(x, 32, w, b, 1e-5, activation="silu"), (x, w, b), dy)
            po, pn = old_b(n, c, h * h, 32, 2, 132), new_b(n, c, h * h, 32, 2, 132)
            t = bench(f, {"old": lambda: setb(old_b), "new": lambda: setb(new_b)})
        k = lambda p: p and p.n_chunks
        print(f"{mode:8s} ({n}, {c}, {h}, {h})  K {k(po)} -> {k(pn)}: {t['old']:7.1f} -> {t['new']:7.1f} us  "
              f"({t['new'] / t['old']:.3f}x)", flush=True)
hf.plan, hb.plan = new_f, new_b
