"""Compile the Gluon GroupNorm backward for sm_90 (triton 3.6) offline: regs, spills, smem."""
import os, sys, re, subprocess, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
sys.path.insert(0, "src")
import flashfuse.ops.group_norm_details._hopper_bwd as H
TARGET = GPUTarget("cuda", 90, 32)

def compile_bwd(res=True, w=True, b=True, act=1, pad=False, dtype="bf16", meet=True, dw=True, db=True, dres=True, dump=None):
    fn = H._group_norm_bwd_hopper_kernel
    bits = 16 if dtype != "fp32" else 32
    cols = 512 * 8 // bits
    rows = 16
    const = dict(HAS_RESIDUAL=res, HAS_WEIGHT=w, HAS_BIAS=b, ACTIVATION=act, COMPUTE_DW=dw, COMPUTE_DB=db, HAS_DRES=dres,
                 HAS_PAD=pad, MEET=meet, K_PAD=4, TILE_ROWS=rows, TILE_COLS=cols,
                 SLOTS=H.SLOTS, SMEM=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2),
                 WARPS=8, COMPUTE_REGS=112, LOADER_REGS=40)
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=3)
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name in ("x_desc", "dy_desc"): sig[p.name] = f"tensordesc<{dtype}[1,{rows},{cols}],{lay!r}>"
        elif p.name in ("p_res", "p_dx"): sig[p.name] = f"*{dtype}"
        elif p.name == "p_count": sig[p.name] = "*i32"
        elif p.name.startswith("p_"): sig[p.name] = "*fp32"
        elif p.name in ("inv_numel", "inv_rows_per_channel"): sig[p.name] = "fp32"
        else: sig[p.name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name.startswith("p_")}
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=TARGET, options=dict(num_warps=8))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    nregs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    if dump:
        open(dump + ".ptx", "w").write(k.asm["ptx"]); open(dump + ".ttgir", "w").write(k.asm["ttgir"])
    print(f"bwd res={res} w={w} b={b} act={act} pad={pad} meet={meet} {dtype}: regs={nregs} spill={spill} smem={k.metadata.shared} "
          f"{time.time()-t:.1f}s {r.stderr[-300:] if r.returncode else ''}", flush=True)
    return k

if __name__ == "__main__":
    compile_bwd(dump="/tmp/gnbwd")
    compile_bwd(res=False, w=False, b=False, act=0, pad=True, meet=False, dw=False, db=False, dres=False)
    compile_bwd(pad=True, dtype="fp32")
