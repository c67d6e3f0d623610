"""Session 43: compile the Gluon forward for sm_90 (triton 3.6) offline: ptxas registers, spills, shared memory, and a
hash of the PTX without debug lines and without parameter declarations / loads (the tail descriptors add three
parameters). Usage: PYTHONPATH=/tmp/t36 python fwd_check43.py SRC [tail]"""
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
    tail = cfg.get("TAIL_DIM", 0)
    fn = H._flash_fwd_hopper_kernel
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    rows = bm // cfg["CONSUMERS"]
    tw = tail or head_dim
    const = dict(IS_VARLEN=varlen, HAS_LEFT=left, HAS_RIGHT=causal, BOTTOM_RIGHT=True, PAIRED=paired, HEAD_DIM=head_dim,
                 Q_SMEM=H._smem_layout([rows, head_dim], dtype), KV_SMEM=H._smem_layout([bn, head_dim], dtype),
                 QT_SMEM=H._smem_layout([rows, tw], dtype), KVT_SMEM=H._smem_layout([bn, tw], dtype),
                 **{k: v for k, v in cfg.items() if k != "PERSISTENT"})
    const = {k: v for k, v in const.items() if k in {p.name for p in fn.params}}
    sig = {}
    for p in fn.params:
        if p.is_constexpr: sig[p.name] = "constexpr"
        elif p.name.endswith("_desc"):
            box = rows if p.name[0] in "qo" else bn
            w = tw if p.name[1] == "t" else head_dim
            lay = H._smem_layout([1, box, 1, w], dtype)
            sig[p.name] = f"tensordesc<bf16[1,{box},1,{w}],{lay!r}>"
        elif p.name == "p_lse": sig[p.name] = "*fp32"
        elif p.name.startswith("p_cu"): sig[p.name] = "*i32"
        elif p.name == "p_out": sig[p.name] = "*bf16"
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
    ptx = "\n".join(l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "$L__", "Lfunc", ".param"))
                    and "ld.param" not in l and l.strip() not in ("(", ")", ")", ","))
    ptx = re.sub(r"_flash_fwd_hopper_kernel\S*", "K", ptx)
    tag = f"{os.environ.get('TAG','x')}_{head_dim}_{tail}_{int(causal)}_{int(paired)}_{int(varlen)}_{int(left)}"
    open(f"/tmp/ptx43_{tag}.ptx", "w").write(ptx)
    print(f"varlen={varlen} left={left} hd{head_dim}+{tail} causal={causal} paired={paired} {cfg}: regs={nregs} spill={spill} "
          f"smem={k.metadata.shared} hash={hashlib.md5(ptx.encode()).hexdigest()[:10]} {time.time()-t:.0f}s "
          f"{r.stderr[-300:] if r.returncode else ''}", flush=True)
    return k

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "tail":
        cases = [(128, c, p, dict(H._WARP_SPECIALIZED, BLOCK_N=bn, Q_STAGES=qs, NUM_STAGES=ns, O_FROM_REGS=True, TAIL_DIM=t))
                 for t, bn, qs, ns in [(32, 64, 2, 2), (32, 128, 1, 2), (32, 64, 1, 3), (64, 64, 2, 2), (64, 64, 1, 3)]
                 for c, p in [(False, True), (True, True), (True, False)]]
    else:
        cases = [(128, True, True, dict(Q_STAGES=1)), (128, False, True, {}), (64, True, True, dict(NUM_STAGES=3)),
                 (64, False, True, {}), (256, True, True, H._WIDE), (256, False, True, H._WIDE),
                 (128, True, False, dict(Q_STAGES=1)), (128, True, True, dict(Q_STAGES=1, SPLIT_PV_WAIT=True)),
                 (64, False, True, dict(CONSUMERS=3, BLOCK_M=192, CONSUMER_REGS=160))]
    for hd, causal, paired, cfg in cases:
        for varlen in ((False, True) if os.environ.get("VARLEN") else (False,)):
            c = dict(cfg, O_FROM_REGS=True) if varlen else cfg
            try:
                compile_fwd(hd, causal, paired=paired, cfg=c, varlen=varlen)
            except Exception as e:
                print(f"hd{hd} causal={causal} varlen={varlen}: FAILED {type(e).__name__}: {str(e)[:3000]}", flush=True)
