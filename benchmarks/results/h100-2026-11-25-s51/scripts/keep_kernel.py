"""Session 50: a Gluon kernel that writes _dropout_keep's tile, for the layouts the attention kernels use; offline
compile (PYTHONPATH=/tmp/t36 python .gpu/keep_kernel.py src) or, on the GPU, compared with dropout_mask."""
import os, re, sys, subprocess, tempfile
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "src")
import torch, triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from flashfuse.ops.attention._hopper_common import _dropout_keep, _dropout_rng

LAYOUTS = {  # name: (R, C, warps_per_cta, instr N, num_warps, transposed)
    "fwd64x128": (64, 128, [4, 1], 128, 4, False),
    "bwdT128x64": (128, 64, [8, 1], 64, 8, True),
    "bwdT128x128": (128, 128, [8, 1], 128, 8, True),
    "rows128x128": (128, 128, [8, 1], 128, 8, False),
    "rows64x64_4x2": (64, 64, [4, 2], 32, 8, False),
    "rows64x128_4x2": (64, 128, [4, 2], 64, 8, False),
}


@gluon.jit
def keep_kernel(p_rng, p_out, dropout_p, bh, q0, k0, seqlen_k, R: gl.constexpr, C: gl.constexpr,
                layout: gl.constexpr, TRANSPOSED: gl.constexpr):
    rng = _dropout_rng(p_rng, dropout_p)
    keep = _dropout_keep(rng, bh, q0, k0, R, C, layout, TRANSPOSED)
    r = gl.expand_dims(gl.arange(0, R, layout=gl.SliceLayout(1, layout)), 1)
    c = gl.expand_dims(gl.arange(0, C, layout=gl.SliceLayout(0, layout)), 0)
    if TRANSPOSED:    # out[q, k]: rows are keys
        offs = (q0 + c) * seqlen_k + (k0 + r)
    else:
        offs = (q0 + r) * seqlen_k + (k0 + c)
    gl.store(p_out + offs, keep.to(gl.int8))


def layout_of(name):
    R, C, warps, n, nw, tr = LAYOUTS[name]
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, 16])


def offline(name):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    R, C, warps, n, nw, tr = LAYOUTS[name]
    sig = {"p_rng": "*i64", "p_out": "*i8", "dropout_p": "fp32", "bh": "i32", "q0": "i32", "k0": "i32",
           "seqlen_k": "i32", "R": "constexpr", "C": "constexpr", "layout": "constexpr", "TRANSPOSED": "constexpr"}
    k = triton.compile(GluonASTSource(keep_kernel, sig, dict(R=R, C=C, layout=layout_of(name), TRANSPOSED=tr)),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=nw))
    ptx = k.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    counts = {op: len(re.findall(op, ptx)) for op in ("mul.hi.u32", "shfl", "st.shared", "ld.shared", "bar.sync")}
    print(name, counts, re.findall(r"Used \d+ registers", r.stderr), flush=True)


def on_gpu():
    from flashfuse.ops.attention.dropout import dropout_mask
    torch.manual_seed(0)
    rng = torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64, device="cuda")
    ok = True
    for name, (R, C, warps, n, nw, tr) in LAYOUTS.items():
        for p, bh, q0, k0 in ((0.1, 3, 32, 48), (0.5, 0, 0, 0), (0.9, 7, 176, 16)):
            nq, nk = (C, R) if tr else (R, C)          # TRANSPOSED tiles: rows are keys
            sq, sk = q0 + nq + 16, k0 + nk + 32
            out = torch.full((sq, sk), 2, dtype=torch.int8, device="cuda")
            keep_kernel[(1,)](rng, out, p, bh, q0, k0, sk, R=R, C=C, layout=layout_of(name), TRANSPOSED=tr,
                              num_warps=nw)
            ref = dropout_mask(rng, bh + 1, 1, sq, sk, p)[bh, 0].to(torch.int8)
            got = out[q0:q0 + nq, k0:k0 + nk]
            same = torch.equal(got, ref[q0:q0 + nq, k0:k0 + nk])
            ok &= same
            print(f"{name} p={p} bh={bh} q0={q0} k0={k0}: {'equal' if same else 'DIFFER'} "
                  f"kept {got.float().mean().item():.3f}", flush=True)
    print("KEEP TILES", "OK" if ok else "FAIL")


if __name__ == "__main__":
    if torch.cuda.is_available():
        on_gpu()
    else:
        for name in LAYOUTS:
            try:
                offline(name)
            except Exception as e:
                print(name, "ERROR", str(e)[-1500:])
