"""Session 48: offline triton 3.6 sm_90 compiles (PYTHONPATH=/tmp/t36) of the Gluon attention kernels with and
without HAS_SOFTCAP: ptxas registers, spills, shared memory, wgmma serialization warnings, and a hash of the PTX without
debug lines and parameter declarations / loads (so the softcap-off PTX can be compared with the previous commit's).
Usage: python softcap_check48.py SRC [fwd|bwd|all] [softcap|plain|both]"""
import hashlib, os, re, subprocess, sys, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, sys.argv[1])
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
import flashfuse.ops.attention.flash_fwd_hopper as H
import flashfuse.ops.attention.flash_bwd_hopper as B
import flashfuse.ops.attention.flash_bwd_dq_hopper as DQ

FLOATS = ("qk_scale", "sm_scale", "softcap_scale", "dropout_p")
ALIBI = os.environ.get("ALIBI") == "1"          # HAS_ALIBI in every compile (session 48's second part)
DROPOUT = os.environ.get("DROPOUT") == "1"      # HAS_DROPOUT in every compile (session 50)


def ptx_hash(ptx):
    ptx = re.sub(r"//.*", "", ptx).split(".section")[0]
    lines = [l for l in ptx.splitlines() if l.strip() and not l.strip().startswith((".loc", ".file", "$L__", "Lfunc",
                                                                                  ".param"))
             and "ld.param" not in l and l.strip() not in ("(", ")", ",")]
    text = re.sub(r"_flash_\w+_kernel\S*", "K", "\n".join(lines))
    return hashlib.md5(text.encode()).hexdigest()[:10], len(lines)


def build(fn, const, desc_type, num_warps, fp32=False):
    sig = {}
    for p in fn.params:
        n = p.name
        if p.is_constexpr: sig[n] = "constexpr"
        elif n.endswith("_desc"): sig[n] = desc_type(n)
        elif n in FLOATS: sig[n] = "fp32"
        elif n in ("p_dk", "p_dv", "p_dq"): sig[n] = "*fp32" if fp32 else "*bf16"
        elif n in ("p_lse", "p_alibi"): sig[n] = "*fp32"
        elif n == "p_rng": sig[n] = "*i64"
        elif n == "p_out": sig[n] = "*bf16"
        elif n.startswith("p_cu"): sig[n] = "*i32"
        else: sig[n] = "i32"
    const = {k: v for k, v in dict(const, HAS_ALIBI=ALIBI, HAS_DROPOUT=DROPOUT).items() if k in [p.name for p in fn.params]}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(fn.params) if p.name == "p_lse"}
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=num_warps))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    cubin = f.name + ".cubin"
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", cubin], capture_output=True, text=True)
    sass = ""
    if r.returncode == 0:
        d = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", cubin], capture_output=True,
                           text=True).stdout
        ins = [l for l in d.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", l)]
        cnt = lambda pat: sum(1 for l in ins if re.search(pat, l))
        pats = dict(imad_wide="IMAD.WIDE", imad_hi="IMAD.HI", lop3="LOP3", isetp="ISETP", shf="SHF", sel="SEL")
        sass = f"sass={len(ins)} " + " ".join(f"{k}={sum(1 for l in ins if v in l)}" for k, v in pats.items()) + " "
    regs = re.findall(r"Used (\d+) registers", r.stderr)
    spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    h, n = ptx_hash(k.asm["ptx"])
    if os.environ.get("PTXDUMP"):
        open(os.path.join(os.environ["PTXDUMP"], h + ".ptx"), "w").write(k.asm["ptx"])
    warn = " ".join(c for c in ("C7514", "C7515") if c in r.stderr)
    return (f"regs={regs} spill={spill} {sass} smem={k.metadata.shared} hash={h} lines={n} {warn} {time.time() - t:.0f}s "
            f"{r.stderr[-300:] if r.returncode else ''}")


def fwd(head_dim, causal, softcap, cfg, varlen=False, left=False):
    dtype = torch.bfloat16
    cfg = dict(H._WARP_SPECIALIZED, **cfg)
    tail = cfg.get("TAIL_DIM", 0)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    rows, tw = bm // cfg["CONSUMERS"], tail or head_dim
    paired = causal and cfg.get("PERSISTENT", True) and not cfg.pop("UNPAIRED", False)
    const = dict(IS_VARLEN=varlen, HAS_LEFT=left, HAS_RIGHT=causal, BOTTOM_RIGHT=True, HAS_SOFTCAP=softcap,
                 PAIRED=paired, HEAD_DIM=head_dim, Q_SMEM=H._smem_layout([rows, head_dim], dtype),
                 KV_SMEM=H._smem_layout([bn, head_dim], dtype), QT_SMEM=H._smem_layout([rows, tw], dtype),
                 KVT_SMEM=H._smem_layout([bn, tw], dtype), **{k: v for k, v in cfg.items() if k != "PERSISTENT"})

    def desc(n):
        box = rows if n[0] in "qo" else bn
        w = tw if n[1] == "t" else head_dim
        return f"tensordesc<bf16[1,{box},1,{w}],{H._smem_layout([1, box, 1, w], dtype)!r}>"
    return build(H._flash_fwd_hopper_kernel, const, desc, 4)


BWD = {64: (128, 128, False, False, 64, 0), 128: (64, 128, True, False, 128, 0), 160: (64, 64, False, True, 128, 32),
       192: (64, 64, False, True, 128, 64), 256: (64, 64, False, True, 256, 0), 80: (64, 128, True, False, 64, 16),
       -64: (64, 128, True, False, 64, 0)}   # -64: hd64 in the transposed layout (hd128's consumer)


def bwd(head_dim, causal, softcap, varlen=False):
    bm, bn, scores_t, dqpass, width, tail = BWD[head_dim]
    dtype = torch.bfloat16
    vec = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    const = dict(HAS_LEFT=False, HAS_RIGHT=causal, BOTTOM_RIGHT=True, HAS_SOFTCAP=softcap, IS_VARLEN=varlen,
                 FP32_GRADS=False, BLOCK_M=bm, BLOCK_N=bn, HEAD_DIM=width, NUM_STAGES=2, SCORES_T=scores_t,
                 DQ_PASS=dqpass, Q_SMEM=H._smem_layout([bm, width], dtype), KV_SMEM=H._smem_layout([bn, width], dtype),
                 DS_SMEM=H._smem_layout([bn, bm] if scores_t else [bm, bn], dtype),
                 DQ_SMEM=H._smem_layout([bm, width], torch.float32), TAIL_DIM=tail,
                 QT_SMEM=H._smem_layout([bm, tail or width], dtype), KVT_SMEM=H._smem_layout([bn, tail or width], dtype),
                 DQT_SMEM=H._smem_layout([bm, tail or width], torch.float32), num_warps=8)

    def desc(n, bm=bm):
        if n in ("lse_desc", "delta_desc"): return f"tensordesc<fp32[1,{bm}],{vec!r}>"
        w = (tail or width) if n in ("qt_desc", "kt_desc", "vt_desc", "dot_desc", "dqt_desc") else width
        if n in ("dq_desc", "dqt_desc"):
            return f"tensordesc<fp32[1,{bm},1,{w}],{H._smem_layout([1, bm, 1, w], torch.float32)!r}>"
        box = bm if n in ("q_desc", "do_desc", "qt_desc", "dot_desc") else bn
        return f"tensordesc<bf16[1,{box},1,{w}],{H._smem_layout([1, box, 1, w], dtype)!r}>"
    out = [f"bwd hd{head_dim} causal={causal} softcap={softcap} varlen={varlen}: "
           + build(B._flash_bwd_hopper_kernel, const, desc, 8)]
    if dqpass:
        cfg = DQ.dq_config(tail)
        dbm = cfg["BLOCK_M"]
        c = dict(const, BLOCK_M=dbm, BLOCK_N=cfg["BLOCK_N"], V_STAGES=cfg["V_STAGES"],
                 Q_SMEM=H._smem_layout([dbm, width], dtype), KV_SMEM=H._smem_layout([cfg["BLOCK_N"], width], dtype),
                 QT_SMEM=H._smem_layout([dbm, tail or width], dtype),
                 KVT_SMEM=H._smem_layout([cfg["BLOCK_N"], tail or width], dtype))
        bn_saved = bn

        def desc_dq(n):
            if n in ("lse_desc", "delta_desc"): return f"tensordesc<fp32[1,{dbm}],{vec!r}>"
            w = (tail or width) if n in ("qt_desc", "kt_desc", "vt_desc", "dot_desc") else width
            box = dbm if n in ("q_desc", "do_desc", "qt_desc", "dot_desc") else cfg["BLOCK_N"]
            return f"tensordesc<bf16[1,{box},1,{w}],{H._smem_layout([1, box, 1, w], dtype)!r}>"
        out.append(f"dq  hd{head_dim} causal={causal} softcap={softcap} varlen={varlen}: "
                   + build(DQ._flash_bwd_dq_hopper_kernel, c, desc_dq, 8))
    return out


which = sys.argv[2] if len(sys.argv) > 2 else "all"
modes = {"softcap": (True,), "plain": (False,), "both": (False, True)}[sys.argv[3] if len(sys.argv) > 3 else "both"]
FWD_CASES = [(64, False, {}), (64, True, dict(NUM_STAGES=3)), (128, False, {}), (128, True, dict(Q_STAGES=1)),
             (128, True, dict(Q_STAGES=1, SPLIT_PV_WAIT=True)), (64, False, dict(TAIL_DIM=16)),
             (128, False, dict(BLOCK_N=64, O_FROM_REGS=True, TAIL_DIM=32)), (256, False, H._WIDE), (256, True, H._WIDE)]
for sc in modes:
    if which in ("fwd", "all"):
        for hd, causal, cfg in FWD_CASES:
            try:
                print(f"fwd hd{hd} causal={causal} softcap={sc} {cfg}: " + fwd(hd, causal, sc, dict(cfg)), flush=True)
            except Exception as e:
                print(f"fwd hd{hd} causal={causal} softcap={sc}: FAILED {type(e).__name__}: {str(e)[:3000]}", flush=True)
    if which in ("bwd", "all"):
        for hd in (64, 128, 80, 256, 160):
            for causal in (False, True):
                try:
                    print("\n".join(bwd(hd, causal, sc)), flush=True)
                except Exception as e:
                    print(f"bwd hd{hd} causal={causal} softcap={sc}: FAILED {type(e).__name__}: {str(e)[:3000]}",
                          flush=True)
