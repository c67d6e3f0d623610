"""Compile the Gluon backward for sm_90 (triton 3.6) offline; SASS: MUFU.EX2 / HGMMA / DEPBAR order in the loop."""
import os, sys, re, subprocess, tempfile, time
os.environ["TRITON_INTERPRET"] = "0"
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
sys.path.insert(0, os.environ.get("SRC", "src"))
import flashfuse.ops.attention.flash_fwd_hopper as H
import flashfuse.ops.attention.flash_bwd_hopper as B
TARGET = GPUTarget("cuda", 90, 32)
bindir = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")

def compile_bwd(hd, causal, cfg, dtype=torch.bfloat16):
    fn = B._flash_bwd_hopper_kernel
    cfg = dict(cfg); bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    const = dict(HAS_RIGHT=causal, BOTTOM_RIGHT=True, FP32_GRADS=False, HEAD_DIM=hd,
                 Q_SMEM=H._smem_layout([bm, hd], dtype), KV_SMEM=H._smem_layout([bn, hd], dtype),
                 DS_SMEM=H._smem_layout([bn, bm] if cfg["SCORES_T"] else [bm, bn], dtype),
                 DQ_SMEM=H._smem_layout([bm, hd], torch.float32), **cfg)
    nw = const["num_warps"]
    const = {k: v for k, v in const.items() if k in {p.name for p in fn.params}}
    sig = {}
    for p in fn.params:
        n = p.name
        if p.is_constexpr: sig[n] = "constexpr"
        elif n in ("q_desc", "do_desc"): sig[n] = f"tensordesc<bf16[1,{bm},1,{hd}],{H._smem_layout([1,bm,1,hd],dtype)!r}>"
        elif n in ("k_desc", "v_desc", "dk_desc", "dv_desc"): sig[n] = f"tensordesc<bf16[1,{bn},1,{hd}],{H._smem_layout([1,bn,1,hd],dtype)!r}>"
        elif n == "dq_desc": sig[n] = f"tensordesc<fp32[1,{bm},1,{hd}],{H._smem_layout([1,bm,1,hd],torch.float32)!r}>"
        elif n in ("lse_desc", "delta_desc"): sig[n] = f"tensordesc<fp32[1,{bm}],{B._VEC_LAYOUT!r}>"
        elif n in ("p_dk", "p_dv"): sig[n] = "*bf16"
        elif n in ("qk_scale", "sm_scale"): sig[n] = "fp32"
        else: sig[n] = "i32"
    t = time.time()
    k = triton.compile(GluonASTSource(fn, sig, const, {}), target=TARGET, options=dict(num_warps=nw))
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    sass = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
    return k, sass, time.time() - t

def events(sass):
    L = [l for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", l)]
    ev = []
    for l in L:
        for key in ("HGMMA", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "MUFU.EX2", "BAR.SYNC", "BAR.ARV", "SYNCS", "BRA", "UTMA", "UBLKRED", "STS", "LDS"):
            if key in l:
                ev.append((key, l.strip())); break
    return ev

def summarize(ev):
    out = []; prev = None; n = 0
    for key, l in ev:
        tag = key
        if key == "WARPGROUP.DEPBAR": tag = "DEPBAR" + re.search(r"0x\d", l).group(0)
        if key == "HGMMA": tag = "HGMMA" + ("(gsb0)" if "gsb0" in l else "")
        if key == "BRA": tag = "BRA"
        if tag == prev: n += 1; continue
        if prev: out.append(f"{prev}x{n}" if n > 1 else prev)
        prev, n = tag, 1
    out.append(f"{prev}x{n}" if n > 1 else prev)
    return " ".join(out)

if __name__ == "__main__":
    tag = sys.argv[1] if len(sys.argv) > 1 else "base"
    for hd, causal in [(64, False), (128, False), (64, True), (128, True)]:
        cfg = B.HOPPER_BWD_CONFIGS[hd]
        k, sass, dt = compile_bwd(hd, causal, cfg)
        open(f"/tmp/s31/{tag}_{hd}_{int(causal)}.sass", "w").write(sass)
        print(f"hd{hd} causal={causal} shared={k.metadata.shared} {dt:.0f}s")
        print("  ", summarize(events(sass)))
