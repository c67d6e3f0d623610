"""Offline sm_90 PTX of the Gluon GroupNorm backward (triton 3.6): PYTHONPATH=/tmp/t36:src python .gpu/bwd_sass.py MOD OUT"""
import os, sys, subprocess, importlib
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
H = importlib.import_module(sys.argv[1]); out = sys.argv[2]
BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
fn = H._group_norm_bwd_hopper_kernel
rows, cols = 16, 256
const = dict(HAS_RESIDUAL=os.environ.get("RES", "0") == "1", HAS_WEIGHT=True, HAS_BIAS=True, ACTIVATION=1, COMPUTE_DW=True,
             COMPUTE_DB=True, HAS_DRES=False, HAS_PAD=False, MEET=False, K_PAD=1, TILE_ROWS=rows, TILE_COLS=cols,
             SLOTS=H.SLOTS, SMEM=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2),
             WARPS=H.COMPUTE_WARPS, COMPUTE_REGS=H.COMPUTE_REGS, LOADER_REGS=H.LOADER_REGS, EMPTY_OFF=0)
lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)
sig = {}
for p in fn.params:
    if p.is_constexpr: sig[p.name] = "constexpr"
    elif p.name.endswith("_desc"): sig[p.name] = f"tensordesc<bf16[1,{rows},{cols}],{lay!r}>"
    elif p.name in ("p_res", "p_w", "p_b", "p_dx"): sig[p.name] = "*bf16"
    elif p.name == "p_count": sig[p.name] = "*i32"
    elif p.name.startswith("p_"): sig[p.name] = "*fp32"
    elif p.name.startswith("inv_"): sig[p.name] = "fp32"
    else: sig[p.name] = "i32"
attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name.startswith("p_")}
const = {k: v for k, v in const.items() if k in [p.name for p in fn.params]}
k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=H.COMPUTE_WARPS))
open(out + ".ptx", "w").write(k.asm["ptx"])
r = subprocess.run([BIN + "/ptxas", "-arch=sm_90a", "-v", out + ".ptx", "-o", out + ".cubin"], capture_output=True, text=True)
print(r.stderr[-300:])
