"""Session 16: host time of one flash_attn_func forward / backward call on the GPU machine (tiny shapes, so the
GPU is idle and the wall time per call is the host's), then cProfile's split of it."""
import cProfile, io, pstats, time, torch
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_fwd_hopper

cfg = dict(flash_fwd_hopper.HOPPER_CONFIGS[(128, True)][0][1])
flash_fwd_hopper.hopper_forward_config = lambda *a: dict(cfg)          # the Gluon forward at any grid size
q, k, v = (torch.randn(2, 512, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)
fwd = lambda: flash_attn_func(q, k, v, causal=True)
out = fwd()
bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
for name, fn in (("fwd", fwd), ("bwd", bwd)):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for rep in range(5):
        t = time.perf_counter()
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) / 200 * 1e6)
    print(f"{name}: host {min(times):.0f} us/call (reps {' '.join(f'{x:.0f}' for x in times)})", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
    print(s.getvalue()[-6000:])
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(30)
    print(s.getvalue()[-7000:])
