"""Offline sm_90 compile (triton 3.6: PYTHONPATH=/tmp/t36) of the Gluon backward kernels (dK / dV and the dQ pass):
registers, spills, shared memory and a hash of the PTX without debug lines and without parameter declarations / loads
(the tail descriptors add four parameters to each kernel). Usage: python bwd_check45.py SRC [old|tail|all]
(session 45: the dQ pass's BLOCK_M / V_STAGES from dq_config, or DQ_BM / DQ_VST from the environment; session 46:
dqt_desc / DQT_SMEM passed where the kernel has them, and `narrow` = head dims 80 / 96 as 64 + 16 / 32 columns in the
transposed-scores kernel, causal or not, bf16 / fp32 grads):
old = the 16 variants of session 40's bwd_check.py (hd64 / 128 / 256, causal or not, dense or varlen, and the
hd256 dQ pass); tail = head dims 160 / 192 as 128 + 32 / 64 columns (both kernels, causal or not, bf16 / fp32 grads)."""
import hashlib, os, re, subprocess, sys, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, sys.argv[1])
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon import language as gl
import flashfuse.ops.attention.flash_bwd_hopper as B
import flashfuse.ops.attention.flash_bwd_dq_hopper as DQ
import flashfuse.ops.attention.flash_fwd_hopper as H


def ptx_hash(ptx):
    ptx = re.sub(r"//.*", "", ptx).split(".section")[0]
    lines = [l for l in ptx.splitlines() if l.strip() and not l.strip().startswith((".loc", ".file", "$L__", "Lfunc", ".param"))
             and "ld.param" not in l and l.strip() not in ("(", ")", ",")]
    return hashlib.md5("\n".join(lines).encode()).hexdigest()[:10], len(lines)


def build(fn, const, bm, bn, head_dim, tail, fp32=False, dtype=torch.bfloat16):
    vec = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    sig = {}
    for p in fn.params:
        n = p.name
        if p.is_constexpr: sig[n] = "constexpr"
        elif n in ("lse_desc", "delta_desc"): sig[n] = f"tensordesc<fp32[1,{bm}],{vec!r}>"
        elif n == "dq_desc": sig[n] = f"tensordesc<fp32[1,{bm},1,{head_dim}],{H._smem_layout([1, bm, 1, head_dim], torch.float32)!r}>"
        elif n == "dqt_desc":
            w = tail or head_dim
            sig[n] = f"tensordesc<fp32[1,{bm},1,{w}],{H._smem_layout([1, bm, 1, w], torch.float32)!r}>"
        elif n.endswith("_desc"):
            box = bm if n in ("q_desc", "do_desc", "qt_desc", "dot_desc") else bn
            width = (tail or head_dim) if n in ("qt_desc", "kt_desc", "vt_desc", "dot_desc") else head_dim
            sig[n] = f"tensordesc<bf16[1,{box},1,{width}],{H._smem_layout([1, box, 1, width], dtype)!r}>"
        elif n in ("qk_scale", "sm_scale"): sig[n] = "fp32"
        elif n in ("p_dk", "p_dv", "p_dq"): sig[n] = "*fp32" if fp32 else "*bf16"
        elif n.startswith("p_cu"): sig[n] = "*i32"
        else: sig[n] = "i32"
    t = time.time()
    const = {k: v for k, v in const.items() if k in [p.name for p in fn.params]}
    k = triton.compile(GluonASTSource(fn, sig, const, {}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    regs = re.findall(r"Used (\d+) registers", r.stderr); spill = re.findall(r"(\d+) bytes spill stores", r.stderr)
    h, n = ptx_hash(k.asm["ptx"])
    warn = " ".join(c for c in ("C7514", "C7515") if c in r.stderr)   # ptxas: wgmma serialized
    bars = k.asm["ptx"].count("bar.sync") + k.asm["ptx"].count("barrier.sync")
    return f"regs={regs} spill={spill} smem={k.metadata.shared} hash={h} lines={n} bar={bars} {warn} {time.time()-t:.0f}s {r.stderr[-300:] if r.returncode else ''}"


def main_kernel(head_dim, causal, varlen, fp32=False):
    bm, bn, scores_t, dqpass, width, tail = {64: (128, 128, False, False, 64, 0), 128: (64, 128, True, False, 128, 0),
                                             160: (64, 64, False, True, 128, 32), 192: (64, 64, False, True, 128, 64),
                                             256: (64, 64, False, True, 256, 0), 80: (64, 128, True, False, 64, 16),
                                             96: (64, 128, True, False, 64, 32)}[head_dim]
    dtype = torch.bfloat16
    const = dict(HAS_LEFT=False, HAS_RIGHT=causal, BOTTOM_RIGHT=True, IS_VARLEN=varlen, FP32_GRADS=fp32, BLOCK_M=bm,
                 BLOCK_N=bn, HEAD_DIM=width, NUM_STAGES=2, SCORES_T=scores_t, DQ_PASS=dqpass,
                 Q_SMEM=H._smem_layout([bm, width], dtype), KV_SMEM=H._smem_layout([bn, width], dtype),
                 DS_SMEM=H._smem_layout([bn, bm] if scores_t else [bm, bn], dtype),
                 DQ_SMEM=H._smem_layout([bm, width], torch.float32), TAIL_DIM=tail,
                 QT_SMEM=H._smem_layout([bm, tail or width], dtype), KVT_SMEM=H._smem_layout([bn, tail or width], dtype),
                 DQT_SMEM=H._smem_layout([bm, tail or width], torch.float32), num_warps=8)
    print(f"bwd hd{head_dim} causal={causal} varlen={varlen} fp32={fp32}:",
          build(B._flash_bwd_hopper_kernel, const, bm, bn, width, tail, fp32), flush=True)


def dq_kernel(head_dim, causal, varlen, fp32=False):
    bn, dtype = 64, torch.bfloat16
    bm = int(os.environ.get("DQ_BM", "0")) or DQ.dq_config({160: 32, 192: 64, 256: 0}[head_dim])["BLOCK_M"]
    width, tail = {160: (128, 32), 192: (128, 64), 256: (256, 0)}[head_dim]
    const = dict(HAS_LEFT=False, HAS_RIGHT=causal, BOTTOM_RIGHT=True, IS_VARLEN=varlen, BLOCK_M=bm, BLOCK_N=bn,
                 HEAD_DIM=width, NUM_STAGES=2, V_STAGES=int(os.environ.get("DQ_VST", "0")) or DQ.dq_config({160: 32, 192: 64, 256: 0}[head_dim])["V_STAGES"], Q_SMEM=H._smem_layout([bm, width], dtype),
                 KV_SMEM=H._smem_layout([bn, width], dtype), DS_SMEM=H._smem_layout([bm, bn], dtype), TAIL_DIM=tail,
                 QT_SMEM=H._smem_layout([bm, tail or width], dtype), KVT_SMEM=H._smem_layout([bn, tail or width], dtype),
                 num_warps=8)
    print(f"dq hd{head_dim} causal={causal} varlen={varlen} fp32={fp32}:",
          build(DQ._flash_bwd_dq_hopper_kernel, const, bm, bn, width, tail, fp32), flush=True)


which = sys.argv[2] if len(sys.argv) > 2 else "all"
if which in ("old", "all"):
    for hd in (64, 128, 256):
        for causal in (False, True):
            for varlen in (False, True):
                main_kernel(hd, causal, varlen)
    for causal in (False, True):
        for varlen in (False, True):
            dq_kernel(256, causal, varlen)
if which in ("tail", "all"):
    for hd in (160, 192):
        for causal in (False, True):
            main_kernel(hd, causal, False)
            dq_kernel(hd, causal, False)
        main_kernel(hd, False, False, fp32=True)
        dq_kernel(hd, False, False, fp32=True)
if which in ("narrow", "all"):
    for hd in (80, 96):
        for causal in (False, True):
            main_kernel(hd, causal, False)
        main_kernel(hd, False, False, fp32=True)
