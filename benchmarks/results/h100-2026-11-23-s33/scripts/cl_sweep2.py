"""channels_last CHUNKED (Triton plans) on an H100, part 2: the forward where it runs CHUNKED ((16, 1280, 32, 32):
C = 1280 stays off the Gluon forward; (2, 320, 64, 64)), fwd graph-timed, over tile x programs per SM x stages; and the
backward (fwd+bwd) at 1 program per SM and 5 stages beside the shipped 2 / 3."""
import itertools, torch, triton
import flashfuse.ops.group_norm as gn
from flashfuse.ops.group_norm import group_norm
torch.manual_seed(0)

def make(shape):
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=torch.channels_last).requires_grad_()
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    b = (0.1 * torch.randn(c, device="cuda")).bfloat16().requires_grad_()
    return (x, w, b), torch.randn_like(x)

fwd_in = [make(s) for s in [(16, 1280, 32, 32), (2, 320, 64, 64), (8, 320, 64, 64)]]
def fwd(l):
    return lambda: group_norm(l[0], 32, l[1], l[2], 1e-5, activation="silu")
base = (gn.CHUNK_TILE, gn.CHUNK_PROGRAMS_PER_SM, gn.CHUNK_STAGES)
ref = [fwd(l)().detach() for l, _ in fwd_in]
print("forward (us): (16, 1280, 32, 32) (2, 320, 64, 64) (8, 320, 64, 64)")
res = {}
for combo in [base] + [c for c in itertools.product((2048, 4096, 8192), (1, 2, 4, 8), (2, 3, 4)) if c != base] + [base]:
    gn.CHUNK_TILE, gn.CHUNK_PROGRAMS_PER_SM, gn.CHUNK_STAGES = combo
    ts, ok = [], True
    with torch.no_grad():
        for (l, _), r in zip(fwd_in, ref):
            fn = fwd(l)
            ok = ok and torch.allclose(fn().float(), r.float(), rtol=2e-2, atol=2e-2)
            ts.append(triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3)
    res[combo] = ts
    print(f"fwd tile {combo[0]:5d} progs/SM {combo[1]} stages {combo[2]}: " + " ".join(f"{t:6.1f}" for t in ts) +
          f"  sum {sum(ts):6.1f}" + ("" if ok else "  MISMATCH"), flush=True)
print("best fwd:", *[f"{k}: {sum(v):.1f}" for k, v in sorted(res.items(), key=lambda kv: sum(kv[1]))[:4]], sep="\n  ")
gn.CHUNK_TILE, gn.CHUNK_PROGRAMS_PER_SM, gn.CHUNK_STAGES = base

bwd_in = [make(s) for s in [(8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)]]
def fb(l, d):
    return lambda: torch.autograd.grad(group_norm(l[0], 32, l[1], l[2], 1e-5, activation="silu"), l, d)
bbase = (gn.CHUNK_TILE, gn.CHUNK_PROGRAMS_PER_SM_BWD, gn.CHUNK_STAGES)
for combo in [bbase, (4096, 1, 3), (4096, 1, 4), (4096, 2, 5), (4096, 1, 5), (2048, 2, 3), bbase]:
    gn.CHUNK_TILE, gn.CHUNK_PROGRAMS_PER_SM_BWD, gn.CHUNK_STAGES = combo
    ts = [triton.testing.do_bench_cudagraph(fb(l, d), rep=30) * 1e3 for l, d in bwd_in]
    print(f"fwd+bwd tile {combo[0]:5d} bwd progs/SM {combo[1]} stages {combo[2]}: " + " ".join(f"{t:6.1f}" for t in ts) +
          f"  sum {sum(ts):6.1f}", flush=True)
