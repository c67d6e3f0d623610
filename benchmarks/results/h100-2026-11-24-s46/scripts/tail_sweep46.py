"""Session 46: the Gluon forward at head dims 65..96 as 64 columns + a 16 / 32-column tail (TAIL_DIM) in several tile
configs vs the same kernel padded to 128 (the route before) vs cuDNN, CUDA-graph timed, bf16, 16384 tokens, heads =
round(2048 / hd), rounds alternating, outputs checked against the padded route."""
import os, json, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
import flashfuse
from flashfuse.ops.attention import flash_fwd_hopper as H

def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=60, return_mode="median")

W = dict(H._WARP_SPECIALIZED)
FULL = {"t_q2": dict(W), "t_q2_regs": dict(W, O_FROM_REGS=True), "t_q1": dict(W, Q_STAGES=1),
        "t_s3": dict(W, NUM_STAGES=3)}
CAUSAL = {"t_q2": dict(W), "t_q1": dict(W, Q_STAGES=1), "t_s3": dict(W, NUM_STAGES=3),
          "t_bn64_s3": dict(W, BLOCK_N=64, NUM_STAGES=3)}
orig = H.hopper_forward_config
rows = []
dims = [int(x) for x in os.environ.get("DIMS", "80,96,72").split(",")]
seqs = [int(x) for x in os.environ.get("SEQS", "512,1024,2048,4096,8192").split(",")]
rounds = int(os.environ.get("ROUNDS", "2"))
for S in seqs:
  for hd in dims:
    Hh = max(1, round(2048 / hd)); B = 16384 // S
    tail = 16 if hd <= 80 else 32
    for causal in (False, True):
        g = torch.Generator(device="cuda").manual_seed(hd)
        q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fl = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
        configs = CAUSAL if causal else FULL
        names = ["pad128"] + list(configs) + ["cudnn", "shipped"]
        res = {n: [] for n in names}
        ref = None
        for r in range(rounds):
            for name in (names if r % 2 == 0 else names[::-1]):
                try:
                    if name == "cudnn":
                        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                        def fwd(qt=qt, kt=kt, vt=vt):
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    else:
                        if name == "shipped":
                            H.hopper_forward_config = orig
                        elif name == "pad128":
                            H.hopper_forward_config = lambda d, *a, **kw: orig(128, *a, **kw)
                        else:
                            cfg = dict(configs[name], PERSISTENT=True, TAIL_DIM=tail)
                            if causal and S // 128 % 2:
                                cfg.update(PERSISTENT=False, Q_STAGES=1)
                            H.hopper_forward_config = lambda *a, cfg=cfg, **kw: dict(cfg)
                        fwd = lambda: flashfuse.flash_attn_func(q, k, v, causal=causal)
                        out = fwd()
                        if ref is None:
                            ref = out
                        err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                        assert err < 2e-2, f"{name}: max rel err {err}"
                    res[name].append(fl / bench(fwd) / 1e9)
                except Exception as e:
                    res[name].append(float("nan")); print(name, hd, S, type(e).__name__, str(e)[:400], flush=True)
                finally:
                    H.hopper_forward_config = orig
        med = {n: sorted(v)[len(v) // 2] for n, v in res.items()}
        rows.append(dict(hd=hd, H=Hh, S=S, causal=causal, rounds=res, median=med))
        print(f"S{S:5d} hd{hd:3d} H{Hh:2d} {'causal' if causal else 'full  '} " +
              " ".join(f"{n} {med[n]:5.0f}" for n in names) + f" | shipped/pad128 "
              f"{med['shipped'] / med['pad128']:.2f} shipped/cudnn {med['shipped'] / med['cudnn']:.2f}", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"tail_{os.environ.get('TAG', 'x')}.json"), "w"),
          indent=1)
