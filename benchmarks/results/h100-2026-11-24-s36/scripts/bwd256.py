"""Session 36: the Triton backward's tiles at head dims padded to 256 (hd160: SD-1.5's deepest level), CUDA-graph
timed; each config's gradients against the shipped config's."""
import os, sys, json, time, torch
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_bwd, flash_fwd

D, S = int(os.environ.get("D", "160")), 2048
causal = bool(int(os.environ.get("CAUSAL", "0")))
H, B = 2048 // D, 16384 // S
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
opts = dict(softmax_scale=D ** -0.5, window_right=0 if causal else -1)
out, lse = flash_fwd.flash_attn_forward(q, k, v, **opts)
fl = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1)

def c(m1, n1, m2, n2, w, st):
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2, num_warps=w, num_stages=st)
def a(m1, n1, w, st):
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, num_warps=w, num_stages=st, STAGGER=False)
CONFIGS = [("det", c(16, 32, 32, 16, 4, 1)), ("det", c(32, 32, 32, 32, 4, 2)), ("det", c(32, 32, 32, 32, 4, 3)),
           ("det", c(32, 32, 32, 32, 8, 2)), ("det", c(32, 64, 64, 32, 8, 3)), ("det", c(64, 64, 64, 64, 8, 2)),
           ("det", c(32, 64, 32, 32, 4, 2)), ("det", c(64, 64, 64, 64, 4, 2))]
ref = None
rows = []
for kind, cfg in CONFIGS:
    t0 = time.time()
    try:
        call = lambda: flash_bwd.flash_attn_backward(do, q, k, v, out, lse, config=dict(cfg), deterministic=kind == "det",
                                                     atomic_dq=kind == "atomic", **opts)
        grads = call(); torch.cuda.synchronize()
        if ref is None:
            ref = grads
        err = max(((x.float() - y.float()).norm() / y.float().norm()).item() for x, y in zip(grads, ref))
        t = do_bench_cudagraph(call, rep=60, return_mode="median")
        rows.append(dict(kind=kind, cfg=cfg, ms=t, tflops=fl / t / 1e9, err=err))
        print(f"D{D} {'causal' if causal else 'full'} {kind:6s} {cfg}: {fl / t / 1e9:6.1f} TFLOP/s err {err:.1e} "
              f"({time.time() - t0:.0f}s)", flush=True)
    except Exception as e:
        print(f"D{D} {kind} {cfg}: {type(e).__name__} {str(e)[:150]}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"bwd256_D{D}_c{int(causal)}.json"), "w"), indent=1)
