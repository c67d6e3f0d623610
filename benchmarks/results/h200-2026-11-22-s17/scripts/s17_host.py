"""Session 17: host time of one flash_attn_func forward / backward call (tiny shapes: the GPU idles, the wall time
per call is the host's) with LaunchCache's direct launch on and off, same process; then cProfile's split."""
import cProfile, io, pstats, time, torch
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_fwd_hopper, flash_bwd_hopper, flash_bwd

cfg = dict(flash_fwd_hopper.HOPPER_CONFIGS[(128, True)][0][1])
flash_fwd_hopper.hopper_forward_config = lambda *a: dict(cfg)          # the Gluon forward at any grid size
caches = [flash_fwd_hopper._launch_forward, flash_bwd_hopper._launch_backward, flash_bwd._launch_preprocess]
q, k, v = (torch.randn(2, 512, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
dout = torch.randn_like(q)
fwd = lambda: flash_attn_func(q, k, v, causal=True)
out = fwd()
bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
def host_us(fn):
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
    return min(times), times
for rnd in range(2):
    for fast in (False, True):
        for c in caches:
            c.fast = fast
        for name, fn in (("fwd", fwd), ("bwd", bwd)):
            best, times = host_us(fn)
            print(f"round {rnd} fast={fast} {name}: host {best:.0f} us/call (reps {' '.join(f'{x:.0f}' for x in times)})", flush=True)
for name, fn in (("fwd", fwd), ("bwd", bwd)):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
    print(name, s.getvalue()[-9000:])
