"""Session 34: throughput of the SFU-class instructions GroupNorm's pass 3 issues (per SM per clock), on the GPU.
python xu_bench.py [--sass]   (--sass: compile offline for sm_90 and print each variant's loop instruction mix)"""
import os, sys, re
import torch, triton
import triton.language as tl

VARIANTS = {
    "fma":        ("fma.rn.f32 $0, $1, $1, $1;", 1),
    "ex2":        ("ex2.approx.ftz.f32 $0, $1;", 1),
    "rcp":        ("{.reg .b32 t; rcp.approx.ftz.f32 t, $1; add.f32 $0, t, 0f3F800000;}", 1),
    "tanh":       ("tanh.approx.f32 $0, $1;", 1),
    "f2fp":       ("{.reg .b32 t; cvt.rn.bf16x2.f32 t, $1, $1; mov.b32 $0, t;}", 1),
    "ex2_bf16x2": ("ex2.approx.ftz.bf16x2 $0, $1;", 1),
    "ex2_f16x2":  ("ex2.approx.f16x2 $0, $1;", 1),
    "ex2+rcp":    ("{.reg .b32 t; ex2.approx.ftz.f32 t, $1; add.f32 t, t, 0f3F800000; rcp.approx.ftz.f32 $0, t;}", 2),
    "ex2+f2fp":   ("{.reg .b32 t; ex2.approx.ftz.f32 t, $1; cvt.rn.bf16x2.f32 $0, t, t;}", 2),
    "ex2+4fma":   ("{.reg .b32 t; ex2.approx.ftz.f32 t, $1; fma.rn.f32 t, t, $1, $1; fma.rn.f32 t, t, $1, t;"
                   " fma.rn.f32 t, t, $1, t; fma.rn.f32 $0, t, $1, t;}", 1),
    "f2i+i2f":    ("{.reg .s32 t; cvt.rzi.s32.f32 t, $1; cvt.rn.f32.s32 $0, t;}", 2),
    "i2f":        ("{.reg .s32 t; mov.b32 t, $1; cvt.rn.f32.s32 $0, t;}", 1),
    "prmt_unpack": ("{.reg .b32 t; prmt.b32 t, $1, 0, 0x1054; mov.b32 $0, t;}", 1),
}


@triton.jit
def _loop(out, ITERS: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = offs.to(tl.float32) * 1e-7 + 0.5
    for _ in range(ITERS):
        x = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(out + offs, x)


WARPS, PER_THREAD, ITERS = 8, 8, 4096
BLOCK = WARPS * 32 * PER_THREAD


def sass(only=None):
    from triton.backends.compiler import GPUTarget
    import subprocess
    binp = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
    for name, (asm, _) in VARIANTS.items():
        src = triton.compiler.ASTSource(_loop, {"out": "*fp32", "ITERS": "constexpr", "ASM": "constexpr", "BLOCK": "constexpr"},
                                        {"ITERS": ITERS, "ASM": asm, "BLOCK": BLOCK})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=WARPS))
        open("/tmp/xu.ptx", "w").write(k.asm["ptx"])
        subprocess.run([binp + "/ptxas", "-arch=sm_90a", "/tmp/xu.ptx", "-o", "/tmp/xu.cubin"], check=True)
        s = subprocess.run([binp + "/nvdisasm", "-c", "/tmp/xu.cubin"], capture_output=True, text=True).stdout
        ops = {}
        for line in s.splitlines():
            m = re.search(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9]+)", line)
            if m:
                ops[m.group(2)] = ops.get(m.group(2), 0) + 1
        print(f"{name:12s}", {k: v for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8]})


def bench():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.empty(sms * 4 * BLOCK, device="cuda")
    grid = (sms * 4,)
    import subprocess
    print(subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip())
    for name, (asm, n_ops) in VARIANTS.items():
        f = lambda: _loop[grid](out, ITERS, asm, BLOCK, num_warps=WARPS)
        f(); torch.cuda.synchronize()
        ms = triton.testing.do_bench(f, warmup=20, rep=200)
        ops_per_sm = out.numel() * ITERS * n_ops / sms            # thread-level ops per SM
        clk = 1.98e9
        print(f"{name:12s} {ms * 1e3:8.1f} us   {ops_per_sm / (ms * 1e-3) / clk:6.1f} ops/clk/SM (at 1.98 GHz; n_ops {n_ops})")


if __name__ == "__main__":
    sass() if "--sass" in sys.argv else bench()
