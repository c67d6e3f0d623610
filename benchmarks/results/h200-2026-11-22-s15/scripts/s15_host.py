"""Session 15, call 9: host overhead of the Gluon path - flash_attn_func timed with do_bench (host included) and
do_bench_cudagraph (host excluded), Gluon on / off, hd128, S = 512 / 1024 / 2048, three repeats."""
import time, torch, triton
from flashfuse import flash_attn_func
import flashfuse.ops.attention.flash_fwd as FF
dev = "cuda"
for causal in (False, True):
    for S in (512, 1024, 2048):
        B, H, D = 16384 // S, 16, 128
        q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        row = []
        for gluon in (True, False):
            FF.GLUON_FORWARD = gluon
            fn = lambda: flash_attn_func(q, k, v, causal=causal)
            fn(); torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200): fn()
            host_us = (time.perf_counter() - t) / 200 * 1e6; torch.cuda.synchronize()
            eb = [flops / triton.testing.do_bench(fn, warmup=25, rep=100) / 1e9 for _ in range(3)]
            gb = [flops / triton.testing.do_bench_cudagraph(fn, rep=100) / 1e9 for _ in range(2)]
            row.append(f"{'gluon' if gluon else 'triton'}: host {host_us:5.0f} us/call  do_bench " + "/".join(f"{x:.0f}" for x in eb) + "  graph " + "/".join(f"{x:.0f}" for x in gb))
        FF.GLUON_FORWARD = True
        print(f"causal={int(causal)} S={S:5d}  " + "  |  ".join(row), flush=True)
