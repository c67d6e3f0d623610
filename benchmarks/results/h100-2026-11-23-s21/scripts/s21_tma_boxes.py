"""Session 21: read bandwidth of TMA boxes of different shapes over a channels_last [N HW, C] bf16 tensor (Triton
tensor descriptors, pipelined loop over the channel blocks of a pixel slab; each program sums its slab). Is a
128-byte-wide box (the CL Gluon forward's [64 px, 64 ch]) slower to stream than wider ones?"""
import torch, triton, triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

@triton.jit
def _read_desc(desc, out, n_rows, C: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BP, BC], tl.float32)
    for p0 in range(pid * BP, n_rows, tl.num_programs(0) * BP):
        for c0 in tl.range(0, C, BC, num_stages=STAGES):
            acc += desc.load([p0, c0]).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))

@triton.jit
def _read_ptr(x, out, n_rows, C: tl.constexpr, BP: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BP, BC], tl.float32)
    rows = tl.arange(0, BP); cols = tl.arange(0, BC)
    for p0 in range(pid * BP, n_rows, tl.num_programs(0) * BP):
        for c0 in tl.range(0, C, BC, num_stages=STAGES):
            acc += tl.load(x + (p0 + rows)[:, None].to(tl.int64) * C + c0 + cols[None, :]).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))

timed = lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
sms = torch.cuda.get_device_properties(0).multi_processor_count
for shape in [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32)]:
    n, c, h, w = shape
    x = torch.randn(n * h * w, c, device="cuda", dtype=torch.bfloat16)
    nb = x.numel() * 2
    row = [f"{str(shape):18s} clone(2x) {2 * nb / timed(lambda: x.clone()) / 1e3:5.0f} GB/s"]
    for bp, bc in [(64, 64), (128, 64), (32, 128), (16, 256), (64, 128)]:
        if c % bc:
            continue
        for stages in (3, 6):
            best = 0
            for progs in (sms, 2 * sms, 4 * sms):
                out = torch.empty(progs, device="cuda")
                desc = TensorDescriptor.from_tensor(x, [bp, bc])
                try:
                    t = timed(lambda: _read_desc[(progs,)](desc, out, x.shape[0], c, bp, bc, stages, num_warps=4))
                    best = max(best, nb / t / 1e3)
                except Exception as e:
                    row.append(f"err {type(e).__name__}")
                    break
            row.append(f"tma[{bp},{bc}]s{stages} {best:5.0f}")
    for bp, bc in [(64, 64), (16, 256)]:
        best = 0
        for progs in (sms, 2 * sms, 4 * sms):
            out = torch.empty(progs, device="cuda")
            best = max(best, nb / timed(lambda: _read_ptr[(progs,)](x, out, x.shape[0], c, bp, bc, 4, num_warps=4)) / 1e3)
        row.append(f"ptr[{bp},{bc}] {best:5.0f}")
    print("  ".join(row), flush=True)
