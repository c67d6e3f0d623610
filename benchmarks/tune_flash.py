"""Sweep tile configs of the FlashAttention kernels on the GPU, beside SDPA (cuDNN, flash) in the same run.

    python benchmarks/tune_flash.py [--seqlen 8192] [--hdims 64,128] [--out results.json]

Forward and backward configs are swept whole (the backward's dK/dV and dQ tiles together). Every config is checked against SDPA before it is timed.
Used to choose the tables in flash_fwd.forward_config / flash_bwd.backward_config (benchmarks/NOTES.md).
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import flashfuse
from flashfuse.ops.attention import flash_bwd, flash_fwd


def cfg(bm, bn, w, s):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)


# Candidates screened offline for register spills (ptxas -v on the sm_90a build, see NOTES.md).
FWD = {
    64: [cfg(128, 64, 4, 3), cfg(128, 128, 8, 3), cfg(128, 64, 8, 3), cfg(64, 64, 4, 3), cfg(128, 32, 4, 3),
         cfg(128, 128, 8, 2)],
    128: [cfg(128, 64, 8, 3), cfg(128, 128, 8, 3), cfg(128, 128, 8, 2), cfg(64, 64, 4, 3), cfg(128, 64, 8, 2),
          cfg(128, 32, 4, 3)],
}
def bcfg(m1, n1, m2, n2, w, st):
    return dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2, num_warps=w, num_stages=st)


# (dK/dV tiles, dQ tiles) of the fused backward grid; first of each list is the shipped default.
BWD = {
    64: [bcfg(32, 64, 64, 64, 4, 3), bcfg(64, 128, 128, 64, 8, 2), bcfg(64, 128, 128, 32, 8, 3)],
    128: [bcfg(64, 128, 128, 64, 8, 2), bcfg(64, 128, 128, 32, 8, 3), bcfg(32, 128, 128, 64, 8, 2)],
}


def flops(batch, nheads, seqlen, hdim, causal):
    return 4 * batch * nheads * seqlen * seqlen * hdim * (0.5 if causal else 1.0)


def bench_fwd_bwd(fn, inputs, dout):
    out = fn(*inputs)
    t_fwd = do_bench(lambda: fn(*inputs), warmup=25, rep=100, return_mode="median")
    t_bwd = do_bench(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), warmup=25, rep=100,
                     return_mode="median")
    return out, t_fwd, t_bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--hdims", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-fwd", action="store_true", help="sweep the backward only")
    args = ap.parse_args()
    rows = []
    dtype = torch.bfloat16
    for hdim in (int(h) for h in args.hdims.split(",")):
        for causal in (bool(int(c)) for c in args.causal.split(",")):
            seqlen = args.seqlen
            nheads, batch = 2048 // hdim, 16384 // seqlen
            fl = flops(batch, nheads, seqlen, hdim, causal)
            q, k, v = (torch.randn(batch, nheads, seqlen, hdim, device="cuda", dtype=dtype, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)
            ref = None
            for backend, name in ((SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"), (SDPBackend.FLASH_ATTENTION, "sdpa-flash")):
                with sdpa_kernel(backend):
                    out, tf, tb = bench_fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal),
                                                (q, k, v), dout)
                ref = out.detach().float() if ref is None else ref
                rows.append(dict(hd=hdim, causal=causal, S=seqlen, impl=name, fwd=fl / tf * 1e-9, bwd=2.5 * fl / tb * 1e-9))
                print(rows[-1], flush=True)
            qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
            dout_t = dout.transpose(1, 2)
            fn = lambda a, b, c: flashfuse.flash_attn_func(a, b, c, causal=causal)  # noqa: E731

            def check(out):
                err = ((out.transpose(1, 2).float() - ref).norm() / ref.norm()).item()
                return err

            default_fwd, default_bwd = flash_fwd.forward_config, flash_bwd.backward_config
            for c in ([] if args.skip_fwd else FWD[hdim]):
                flash_fwd.forward_config = lambda *a, c=c: c
                try:
                    out = fn(qt, kt, vt)
                    err = check(out)
                    tf = do_bench(lambda: fn(qt, kt, vt), warmup=25, rep=100, return_mode="median")
                    rows.append(dict(hd=hdim, causal=causal, S=seqlen, impl="ff-fwd", cfg=c, err=err, fwd=fl / tf * 1e-9))
                except Exception as e:  # noqa: BLE001 (a config that does not compile is a result too)
                    rows.append(dict(hd=hdim, causal=causal, S=seqlen, impl="ff-fwd", cfg=c, error=repr(e)[:200]))
                print(rows[-1], flush=True)
            flash_fwd.forward_config = default_fwd
            for c in BWD[hdim]:
                flash_bwd.backward_config = lambda *a, c=c: c
                try:
                    out = fn(qt, kt, vt)
                    grads = torch.autograd.grad(out, (qt, kt, vt), dout_t, retain_graph=True)
                    bad = any(not torch.isfinite(g).all() for g in grads)
                    tb = do_bench(lambda: torch.autograd.grad(out, (qt, kt, vt), dout_t, retain_graph=True),
                                  warmup=25, rep=100, return_mode="median")
                    rows.append(dict(hd=hdim, causal=causal, S=seqlen, impl="ff-bwd", cfg=c, nonfinite=bad,
                                     bwd=2.5 * fl / tb * 1e-9))
                except Exception as e:  # noqa: BLE001
                    rows.append(dict(hd=hdim, causal=causal, S=seqlen, impl="ff-bwd", cfg=c, error=repr(e)[:200]))
                print(rows[-1], flush=True)
            flash_bwd.backward_config = default_bwd
    if args.out:
        json.dump(rows, open(args.out, "w"), indent=1)
    print("\nsummary (TFLOP/s):")
    for r in rows:
        if "error" in r:
            continue
        print(f"hd{r['hd']:>4} {'causal' if r['causal'] else 'full  '} {r['impl']:<12} "
              f"{r.get('fwd', float('nan')):7.1f} {r.get('bwd', float('nan')):7.1f}  {r.get('cfg', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
