"""Compile the warp-specialized Gluon forward for sm_90 (triton 3.6) offline: regs, spills, smem, PTX dump."""
import os, sys, re, subprocess, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, "src")
import flashfuse.ops.attention.flash_fwd_hopper as H
TARGET = GPUTarget("cuda", 90, 32)

def compile_ws(head_dim, causal, paired=False, bm=128, bn=128, stages=2, regs=240, consumers=2, maxnreg=None, dump=None, dtype=torch.bfloat16):
    fn = H._flash_fwd_hopper_kernel
    const = dict(HAS_RIGHT=causal, BOTTOM_RIGHT=True, PAIRED=paired, CONSUMERS=consumers, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=head_dim, NUM_STAGES=stages,
                 Q_SMEM=H._smem_layout([64, head_dim], dtype), KV_SMEM=H._smem_layout([bn, head_dim], dtype),
                 CONSUMER_REGS=regs, num_warps=4)
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name.endswith("_desc"):
            box = 64 if p.name[0] in "qo" else bn
            lay = H._smem_layout([1, box, 1, head_dim], dtype)
            sig[p.name] = f"tensordesc<bf16[1,{box},1,{head_dim}],{lay!r}>"
        elif p.name == "p_lse": sig[p.name] = "*fp32"
        elif p.name == "qk_scale": sig[p.name] = "fp32"
        else: sig[p.name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name == "p_lse"}
    opts = dict(num_warps=4)
    if maxnreg: opts["maxnreg"] = maxnreg
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=TARGET, options=opts)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    nregs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    if dump:
        open(dump + ".ptx", "w").write(k.asm["ptx"]); open(dump + ".ttgir", "w").write(k.asm["ttgir"])
        open(dump + ".cubin", "wb").write(k.asm["cubin"])
    print(f"ws hd{head_dim} causal={causal} {bm}x{bn} st{stages} regs={regs} maxnreg={maxnreg}: ptxas regs={nregs} "
          f"spill={spill} smem={k.metadata.shared} warps={k.metadata.num_warps} {time.time()-t:.1f}s {r.stderr[-300:] if r.returncode else ''}",
          flush=True)
    return k

if __name__ == "__main__":
    for causal in (False, True):
        compile_ws(64, causal, bm=192, consumers=3, regs=160)
        compile_ws(64, causal, bm=192, bn=64, consumers=3, regs=160)
        compile_ws(64, causal, bm=192, bn=64, stages=3, consumers=3, regs=160)
