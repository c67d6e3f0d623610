"""Offline sm_90 SASS of the Gluon GroupNorm forward (triton 3.6): PYTHONPATH=/tmp/t36:src python .gpu/gn_sass.py OUT"""
import os, sys, re, subprocess, importlib
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
sys.path.insert(0, "src")
DT = os.environ.get('DT', 'bf16')
modname = os.environ.get("GN_MOD", "flashfuse.ops.group_norm_details._hopper_fwd")
UNIFORM = os.environ.get("UNIFORM")
H = importlib.import_module(modname)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")

def compile_gn(out, res=False, act=1, pad=False, meet=False, **extra):
    fn = H._group_norm_fwd_hopper_kernel
    bits = 32 if DT == 'fp32' else 16; cols = 512 * 8 // bits; rows = H.TILE_BYTES // H.ROW_BYTES
    const = dict(HAS_RESIDUAL=res, HAS_WEIGHT=True, HAS_BIAS=True, ACTIVATION=act, HAS_PAD=pad, MEET=meet, K_PAD=2,
                 TILE_ROWS=rows, TILE_COLS=cols, SLOTS=H.SLOTS,
                 SMEM=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2),
                 WARPS=H.COMPUTE_WARPS // getattr(H, "HALVES", 1), PARTS=H.PARTS, HALVES=getattr(H, "HALVES", 1), COMPUTE_REGS=H.COMPUTE_REGS, LOADER_REGS=H.LOADER_REGS, EMPTY_OFF=0)
    const.update(extra)

    const = {k: v for k, v in const.items() if k in [p.name for p in fn.params]}
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=3)
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name == "x_desc": sig[p.name] = f"tensordesc<{DT}[1,{rows},{cols}],{lay!r}>"
        elif p.name in ("p_res", "p_y"): sig[p.name] = "*" + DT
        elif p.name in ("p_w", "p_b"): sig[p.name] = "*" + DT
        elif p.name in ("p_mean", "p_rstd", "p_part"): sig[p.name] = "*fp32"
        elif p.name == "p_count": sig[p.name] = "*i32"
        elif p.name in ("inv_numel", "eps", "inv_rows_per_channel"): sig[p.name] = "fp32"
        else: sig[p.name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name.startswith("p_")}
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=H.COMPUTE_WARPS // getattr(H, "HALVES", 1)))
    open(out + ".ptx", "w").write(k.asm["ptx"]); open(out + ".ttgir", "w").write(k.asm["ttgir"])
    r = subprocess.run([BIN + "/ptxas", "-arch=sm_90a", "-v", out + ".ptx", "-o", out + ".cubin"], capture_output=True, text=True)
    print(r.stderr[-400:])
    sass = subprocess.run([BIN + "/nvdisasm", "-c", "-g", out + ".cubin"], capture_output=True, text=True).stdout
    open(out + ".sass", "w").write(sass)
    return sass

if __name__ == "__main__":
    compile_gn(sys.argv[1], res=os.environ.get("RES","1")=="1", pad=os.environ.get("PAD","1")=="1", HOLD=os.environ.get("HOLD","1")=="1")
