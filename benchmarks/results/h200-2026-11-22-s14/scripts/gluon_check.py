"""Compile the Gluon Hopper forward for sm_90 with triton 3.6 on the CPU machine; ptxas regs/spills."""
import os, sys, re, subprocess, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, "src")
import flashfuse.ops.attention.flash_fwd_hopper as H
H.INTERPRET = False
TARGET = GPUTarget("cuda", 90, 32)
CODES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}

def compile_one(head_dim, causal, cfg, dtype=torch.bfloat16, dump=None):
    fn = H._flash_fwd_hopper_kernel
    cfg = dict(cfg); bm, bn = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    nw = cfg.pop("num_warps"); psm = cfg.pop("P_SMEM", False)
    const = dict(HAS_RIGHT=causal, BOTTOM_RIGHT=True, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=head_dim,
                 NUM_STAGES=cfg.pop("NUM_STAGES"), Q_SMEM=H._smem_layout([bm, head_dim], dtype),
                 KV_SMEM=H._smem_layout([bn, head_dim], dtype), num_warps=nw,
                 P_SMEM=H._smem_layout([bm, bn], dtype) if psm else None)
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name.startswith("p_lse"): sig[p.name] = "*fp32"
        elif p.name.startswith("p_"): sig[p.name] = "*" + CODES[dtype]
        elif p.name == "qk_scale": sig[p.name] = "fp32"
        else: sig[p.name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name.startswith("p_")}
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=TARGET, options=dict(num_warps=nw))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    regs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    if dump:
        open(dump + ".ptx", "w").write(k.asm["ptx"]); open(dump + ".ttgir", "w").write(k.asm["ttgir"])
    print(f"hd{head_dim} causal={causal} {bm}x{bn} w{nw} st{const['NUM_STAGES']}: regs={regs} spill={spill} "
          f"smem={k.metadata.shared} {time.time()-t:.1f}s", flush=True)

if __name__ == "__main__":
    cfgs = [dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, num_warps=8)]
    for hd in (64, 128):
        for causal in (False, True):
            for c in cfgs:
                try:
                    compile_one(hd, causal, c, dump=f"/tmp/gl_hd{hd}_{int(causal)}" if len(sys.argv) > 1 else None)
                except Exception as e:
                    import traceback; traceback.print_exc(); sys.exit(1)
