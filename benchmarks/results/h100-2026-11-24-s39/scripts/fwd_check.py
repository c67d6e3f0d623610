"""Session 29: compile the Gluon forward for sm_90 (triton 3.6) offline: ptxas registers, spills, shared memory, a hash of
the PTX without debug lines. Run from the repository root with triton 3.6 first on PYTHONPATH (an extracted wheel);
the probes' constexprs (HALF_LAST, PINGPONG, KV_JOINT, O_DIRECT) were added to the cases with the patches applied."""
import os, sys, re, subprocess, tempfile, time, hashlib
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "src")
import flashfuse.ops.attention.flash_fwd_hopper as H
TARGET = GPUTarget("cuda", 90, 32)

def compile_fwd(head_dim, causal, paired=True, cfg=None, dtype=torch.bfloat16, left=False, varlen=False):
    cfg = dict(H._WARP_SPECIALIZED, **(cfg or {}))
    fn = H._flash_fwd_hopper_kernel
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    rows = bm // cfg["CONSUMERS"]
    const = dict(IS_VARLEN=varlen, HAS_LEFT=left, HAS_RIGHT=causal, BOTTOM_RIGHT=True, PAIRED=paired, HEAD_DIM=head_dim,
                 Q_SMEM=H._smem_layout([rows, head_dim], dtype), KV_SMEM=H._smem_layout([bn, head_dim], dtype),
                 **{k: v for k, v in cfg.items() if k != "PERSISTENT"})
    const = {k: v for k, v in const.items() if k in {p.name for p in fn.params}}
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name.endswith("_desc"):
            box = rows if p.name[0] in "qo" else bn
            lay = H._smem_layout([1, box, 1, head_dim], dtype)
            sig[p.name] = f"tensordesc<bf16[1,{box},1,{head_dim}],{lay!r}>"
        elif p.name == "p_lse": sig[p.name] = "*fp32"
        elif p.name.startswith("p_cu"): sig[p.name] = "*i32"
        elif p.name == "p_out": sig[p.name] = "*bf16"
        elif p.name == "stride_o_s" and os.environ.get("DIV"): sig[p.name] = "i32"
        elif p.name == "qk_scale": sig[p.name] = "fp32"
        else: sig[p.name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name == "p_lse"}
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=TARGET, options=dict(num_warps=4))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    nregs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    ptx = re.sub(r"//.*", "", k.asm["ptx"]).split(".section")[0]
    ptx = "\n".join(l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "$L__", "Lfunc")) and l.strip())
    ptx = re.sub(r"_flash_fwd_hopper_kernel\S*", "K", ptx); open(f"/tmp/ptx_{os.environ.get('TAG','x')}_{head_dim}_{int(causal)}_{int(varlen)}.ptx", "w").write(ptx)
    print(f"varlen={varlen} left={left} hd{head_dim} causal={causal} {cfg}: regs={nregs} spill={spill} smem={k.metadata.shared} "
          f"hash={hashlib.md5(ptx.encode()).hexdigest()[:10]} {time.time()-t:.0f}s {r.stderr[-300:] if r.returncode else ''}",
          flush=True)
    return k

if __name__ == "__main__":
    V = bool(os.environ.get("VARLEN"))
    cases = [(128, True, True, dict(Q_STAGES=1)), (128, False, True, {}), (64, True, True, dict(NUM_STAGES=3)),
             (64, False, True, {}), (256, True, True, H._WIDE), (128, True, False, dict(Q_STAGES=1))]
    for hd, causal, paired, cfg in cases:
        for varlen in ((False, True) if V else (False,)):
            c = dict(cfg, O_FROM_REGS=True) if varlen else cfg
            try:
                compile_fwd(hd, causal, paired=paired, cfg=c, varlen=varlen)
            except Exception as e:
                print(f"hd{hd} causal={causal} varlen={varlen}: FAILED {type(e).__name__}: {str(e)[:3000]}", flush=True)
