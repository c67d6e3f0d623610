"""Offline sm_90 compile of the wide backward's dQ pass (flash_bwd_dq_hopper): regs, spills, smem."""
import os, re, subprocess, sys, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, "src")
import torch, triton, hashlib
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
import flashfuse.ops.attention.flash_bwd_dq_hopper as D
import flashfuse.ops.attention.flash_fwd_hopper as H

def _ptxhash(ptx):
    import re as _re
    ptx = _re.sub(r"//.*", "", ptx).split(".section")[0]
    ptx = "\n".join(l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "$L__", "Lfunc")) and l.strip())
    return hashlib.md5(ptx.encode()).hexdigest()[:10]

def compile_dq(head_dim, causal, left, dtype=torch.bfloat16, out="*bf16"):
    fn = D._flash_bwd_dq_hopper_kernel
    cfg = dict(D.DQ_CONFIG); bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    vec = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    const = dict(HAS_LEFT=left, HAS_RIGHT=causal, BOTTOM_RIGHT=True, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=head_dim,
                 NUM_STAGES=cfg["NUM_STAGES"], Q_SMEM=H._smem_layout([bm, head_dim], dtype),
                 KV_SMEM=H._smem_layout([bn, head_dim], dtype), DS_SMEM=H._smem_layout([bm, bn], dtype), num_warps=8)
    sig = {}
    for p in fn.params:
        n = p.name
        if p.is_constexpr: sig[n] = "constexpr"
        elif n in ("lse_desc", "delta_desc"): sig[n] = f"tensordesc<fp32[1,{bm}],{vec!r}>"
        elif n.endswith("_desc"):
            box = bm if n in ("q_desc", "do_desc") else bn
            sig[n] = f"tensordesc<bf16[1,{box},1,{head_dim}],{H._smem_layout([1, box, 1, head_dim], dtype)!r}>"
        elif n in ("qk_scale", "sm_scale"): sig[n] = "fp32"
        elif n == "p_dq": sig[n] = out
        else: sig[n] = "i32"
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    nregs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    print(f"dq hd{head_dim} causal={causal} left={left} out={out}: regs={nregs} spill={spill} smem={k.metadata.shared} hash={_ptxhash(k.asm['ptx'])} "
          f"{time.time()-t:.1f}s {r.stderr[-300:] if r.returncode else ''}", flush=True)

for causal, left in ((False, False), (True, False), (True, True)):
    compile_dq(256, causal, left)
compile_dq(256, True, False, out="*fp32")
