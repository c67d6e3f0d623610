"""Forward-only sweep of PERSISTENT v2 (3b84c47) plan knobs vs CHUNKED, graph-timed (do_bench_cudagraph)."""
import torch, triton
import flashfuse.ops.group_norm as gn
from flashfuse.ops.group_norm_details import _persistent_launch as pl
ceil = 4240.0
def run(shape, cl, knobs):
    for k, v in knobs.items():
        setattr(pl if k == "BACKOFF_NS" else gn, k, v)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if cl: x = x.to(memory_format=torch.channels_last)
    w = torch.randn(shape[1], device="cuda"); b = torch.randn(shape[1], device="cuda")
    f = lambda: gn.group_norm_forward(x, 32, w, b, 1e-5, "silu")
    y = f()[0]; torch.cuda.synchronize()
    ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.float(), 32, w, b, 1e-5))
    err = ((y.float() - ref).norm() / ref.norm()).item()
    t = triton.testing.do_bench_cudagraph(f, rep=20)
    gbps = 2 * x.numel() * 2 / (t * 1e-3) / 1e9
    return t * 1e3, 100 * gbps / ceil, err
BASE = dict(USE_RESIDENT=False, CHUNKED_NCHW=True, CHUNKED_CHANNELS_LAST=True)
VARS = {
    "chunked": dict(BASE, USE_PERSISTENT=False, CHUNKED_NCHW_MIN_GROUP=65536, BACKOFF_NS=0),
    "v2-bo": dict(BASE, USE_PERSISTENT=True, CHUNKED_NCHW_MIN_GROUP=0, PERSISTENT_PROGRAMS_PER_SM=4, PERSISTENT_ROUND_BYTES=8 << 20, PERSISTENT_EXTRA_LAG=1, BACKOFF_NS=1),
    "v2-pps8-bo": dict(BASE, USE_PERSISTENT=True, PERSISTENT_PROGRAMS_PER_SM=8, BACKOFF_NS=1),
    "v2-pps8-r16-bo": dict(BASE, USE_PERSISTENT=True, PERSISTENT_PROGRAMS_PER_SM=8, PERSISTENT_ROUND_BYTES=16 << 20, BACKOFF_NS=1),
    "v2-pps8-r24-lag0-bo": dict(BASE, USE_PERSISTENT=True, PERSISTENT_PROGRAMS_PER_SM=8, PERSISTENT_ROUND_BYTES=24 << 20, PERSISTENT_EXTRA_LAG=0, BACKOFF_NS=1),
    "v2-nobo": dict(BASE, USE_PERSISTENT=True, PERSISTENT_PROGRAMS_PER_SM=4, PERSISTENT_ROUND_BYTES=8 << 20, PERSISTENT_EXTRA_LAG=1, BACKOFF_NS=0),
}
for shape in ((8, 320, 128, 128), (16, 640, 64, 64), (16, 1280, 32, 32)):
    for cl in (False, True):
        row = []
        for name, knobs in VARS.items():
            us, pct, err = run(shape, cl, knobs)
            row.append(f"{name}={pct:.1f}%" + ("" if err < 2e-2 else f"(ERR {err:.1e})"))
        print("x".join(map(str, shape)), "cl" if cl else "nchw", " ".join(row), flush=True)
print({(k[0].__name__, dict(k[1]).get("num_warps"), k[-1]): v for k, v in pl._PROGRAMS.items()})
