import os, sys, re, subprocess, tempfile, importlib
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
sys.path.insert(0, "src")
mod = importlib.import_module("flashfuse.ops.group_norm_details." + (sys.argv[1] if len(sys.argv) > 1 else "_hopper_fwd_cl"))
fn = mod._group_norm_fwd_hopper_cl_kernel
layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
const = dict(HAS_RESIDUAL=False, HAS_WEIGHT=True, HAS_BIAS=True, ACTIVATION=1, HAS_PAD=False, TILE_P=64, BOX_C=64,
             N_CB_PAD=16, G_PAD=32, CPG_PAD=32, K_BLOCK=64, SLOTS=24, SMEM=layout, WARPS=8, PARTS=2,
             COMPUTE_REGS=112, LOADER_REGS=40)
sig = {}
for p in fn.params:
    if p.is_constexpr: sig[p.name] = "constexpr"
    elif p.name == "x_desc": sig[p.name] = f"tensordesc<bf16[64,64],{layout!r}>"
    elif p.name in ("p_y", "p_res"): sig[p.name] = "*bf16"
    elif p.name in ("p_trace", "p_part"): sig[p.name] = "*i64"
    elif p.name.startswith("p_"): sig[p.name] = "*fp32"
    elif p.name == "eps": sig[p.name] = "fp32"
    else: sig[p.name] = "i32"
k = triton.compile(GluonASTSource(fn, sig, const, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
    f.write(k.asm["ptx"]); open("/tmp/cl.ptx", "w").write(k.asm["ptx"])
r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/tmp/cl.cubin"], capture_output=True, text=True)
print(r.stderr[-600:], "smem", k.metadata.shared)
