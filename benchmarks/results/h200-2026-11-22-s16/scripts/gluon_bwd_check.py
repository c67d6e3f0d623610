"""Compile the warp-specialized Gluon backward for sm_90 (triton 3.6) offline: regs, spills, smem, dumps."""
import os, sys, re, subprocess, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
sys.path.insert(0, "src")
import flashfuse.ops.attention.flash_bwd_hopper as B
import flashfuse.ops.attention.flash_fwd_hopper as H
TARGET = GPUTarget("cuda", 90, 32)

def compile_bwd(head_dim, causal, bm=64, bn=128, stages=2, fp32=False, dump=None, dtype=torch.bfloat16):
    fn = B._flash_bwd_hopper_kernel
    vec = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    const = dict(HAS_RIGHT=causal, BOTTOM_RIGHT=True, FP32_GRADS=fp32, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=head_dim, NUM_STAGES=stages,
                 Q_SMEM=H._smem_layout([bm, head_dim], dtype), KV_SMEM=H._smem_layout([bn, head_dim], dtype),
                 DS_SMEM=H._smem_layout([bn, bm], dtype), DQ_SMEM=H._smem_layout([bm, head_dim], torch.float32),
                 num_warps=8)
    sig = {}
    for p in fn.params:
        n = p.name
        if p.is_constexpr: sig[n] = "constexpr"
        elif n in ("lse_desc", "delta_desc"): sig[n] = f"tensordesc<fp32[1,{bm}],{vec!r}>"
        elif n == "dq_desc": sig[n] = f"tensordesc<fp32[1,{bm},1,{head_dim}],{H._smem_layout([1, bm, 1, head_dim], torch.float32)!r}>"
        elif n.endswith("_desc"):
            box = bm if n[0] in "qd" and n != "dk_desc" and n != "dv_desc" else bn
            sig[n] = f"tensordesc<bf16[1,{box},1,{head_dim}],{H._smem_layout([1, box, 1, head_dim], dtype)!r}>"
        elif n in ("qk_scale", "sm_scale"): sig[n] = "fp32"
        elif n in ("p_dk", "p_dv"): sig[n] = "*fp32"
        else: sig[n] = "i32"
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, {}), target=TARGET, options=dict(num_warps=8))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    nregs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    setmax = re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32 (\d+)", k.asm["ptx"])
    if dump:
        open(dump + ".ptx", "w").write(k.asm["ptx"]); open(dump + ".ttgir", "w").write(k.asm["ttgir"])
        open(dump + ".cubin", "wb").write(k.asm["cubin"])
    print(f"bwd hd{head_dim} causal={causal} {bm}x{bn} st{stages}: ptxas regs={nregs} spill={spill} setmaxnreg={setmax} "
          f"smem={k.metadata.shared} {time.time()-t:.1f}s {r.stderr[-400:] if r.returncode else ''}", flush=True)
    return k

if __name__ == "__main__":
    compile_bwd(128, False, dump="/tmp/bwd128")
    for hd in (64, 128):
        for causal in (False, True):
            compile_bwd(hd, causal)
            compile_bwd(hd, causal, fp32=True)
