"""Compile the Gluon GroupNorm forward for sm_90 (triton 3.6) offline: regs, spills, smem."""
import os, sys, re, subprocess, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
sys.path.insert(0, "src")
import flashfuse.ops.group_norm_details._hopper_fwd as H
TARGET = GPUTarget("cuda", 90, 32)

def compile_gn(meet=False, res=True, w=True, b=True, act=1, pad=False, dtype="bf16", dump=None, one_pass=True, warps=8, rows=32, slots=None, parts=1, cregs=160):
    fn = H._group_norm_fwd_hopper_kernel
    bits = 16 if dtype != "fp32" else 32
    cols = 512 * 8 // bits
    const = dict(HAS_RESIDUAL=res, HAS_WEIGHT=w, HAS_BIAS=b, ACTIVATION=act, HAS_PAD=pad, MEET=meet, K_PAD=2, TILE_ROWS=rows, TILE_COLS=cols,
                 SLOTS=slots or H.SLOTS, SMEM=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2),
                 WARPS=warps, PARTS=parts, COMPUTE_REGS=cregs, LOADER_REGS=40)
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=3)
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name == "x_desc": sig[p.name] = f"tensordesc<{dtype}[1,{rows},{cols}],{lay!r}>"
        elif p.name in ("p_res", "p_y"): sig[p.name] = f"*{dtype}"
        elif p.name in ("p_w", "p_b"): sig[p.name] = "*fp32"
        elif p.name in ("p_mean", "p_rstd", "p_part"): sig[p.name] = "*fp32"
        elif p.name == "p_count": sig[p.name] = "*i32"
        elif p.name in ("inv_numel", "eps", "inv_rows_per_channel"): sig[p.name] = "fp32"
        else: sig[p.name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name.startswith("p_")}
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=TARGET, options=dict(num_warps=warps))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    nregs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    if dump:
        open(dump + ".ptx", "w").write(k.asm["ptx"]); open(dump + ".ttgir", "w").write(k.asm["ttgir"])
    print(f"gn warps={warps} parts={parts} rows={rows} cregs={cregs} res={res} w={w} b={b} act={act} pad={pad} {dtype}: regs={nregs} spill={spill} smem={k.metadata.shared} "
          f"{time.time()-t:.1f}s {r.stderr[-300:] if r.returncode else ''}", flush=True)
    return k

if __name__ == "__main__":
    compile_gn(parts=2, warps=8, rows=16, slots=28, cregs=112, dump="/tmp/gnp2w8")
    compile_gn(meet=True, parts=2, warps=8, rows=16, slots=28, cregs=112)
    compile_gn(parts=2, warps=8, rows=16, slots=28, cregs=112, res=False, w=False, b=False, act=0, pad=True)
    compile_gn(parts=2, warps=8, rows=16, slots=28, cregs=112, pad=True, dtype="fp32")
