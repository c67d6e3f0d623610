"""Session 23: where the hd64 causal forward's time goes at short S. Writes an instrumented copy of
flash_fwd_hopper.py (globaltimer stamps per program, consumer warpgroup and tile) and prints per-phase
durations by key-block count, plus the CUDA-graph time beside cuDNN."""
import os, sys, json, importlib, statistics
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph

d = "src/flashfuse/ops/attention"
s = open(f"{d}/flash_fwd_hopper.py").read()
def sub(a, b):
    global s
    assert s.count(a) == 1, a
    s = s.replace(a, b)
sub("    @gluon.jit\n    def _tma_box(", '''    @gluon.jit
    def _st(p, idx):
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(p + idx, t)

    @gluon.jit
    def _tma_box(''')
sub("    def _ws_consumer(descs, p_lse,", "    def _ws_consumer(descs, p_tr, p_lse,")
sub('''            q_slot = WG * Q_STAGES + it % Q_STAGES
            q = q_smem.index(q_slot)''', '''            p_t = p_tr + ((gl.program_id(0) * 2 + WG) * 64 + k) * 8
            _st(p_t, 0)
            gl.store(p_t + 7, n_blocks.to(gl.int64))
            q_slot = WG * Q_STAGES + it % Q_STAGES
            q = q_smem.index(q_slot)''')
sub('''            mbarrier.wait(k_ready.index(c % NUM_STAGES), (c // NUM_STAGES) & 1)
            s_tok''', '''            mbarrier.wait(k_ready.index(c % NUM_STAGES), (c // NUM_STAGES) & 1)
            _st(p_t, 1)
            s_tok''')
sub('''            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
            mbarrier.arrive(k_empty.index(c % NUM_STAGES), count=1)''', '''            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
            _st(p_t, 2)
            mbarrier.arrive(k_empty.index(c % NUM_STAGES), count=1)''')
sub('''            mbarrier.arrive(q_empty.index(q_slot), count=1)      # every Q K^T of this tile is done''',
    '''            _st(p_t, 3)
            mbarrier.arrive(q_empty.index(q_slot), count=1)      # every Q K^T of this tile is done''')
sub('''            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
            mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)''', '''            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
            _st(p_t, 4)
            mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)''')
sub('''            tma.async_copy_shared_to_global(o_desc, [i_b, row0, i_h, 0], _tma_box(o_buf, o_desc))  # rows past seqlen_q dropped''',
    '''            tma.async_copy_shared_to_global(o_desc, [i_b, row0, i_h, 0], _tma_box(o_buf, o_desc))  # rows past seqlen_q dropped
            _st(p_t, 5)''')
sub("        q_desc, k_desc, v_desc, o_desc, p_lse, stride_lse_b,", "        q_desc, k_desc, v_desc, o_desc, p_tr, p_lse, stride_lse_b,")
s = s.replace("(_ws_consumer, (descs, p_lse,", "(_ws_consumer, (descs, p_tr, p_lse,")
sub("        (programs, ), *descs, lse,", "        (programs, ), *descs, TRACE, lse,")
s = s.replace("from ..._env import", "TRACE = None\nfrom ..._env import")
open(f"{d}/_v_trace.py", "w").write(s)
from flashfuse.ops.attention import flash_fwd, flash_fwd_hopper as H
V = importlib.import_module("flashfuse.ops.attention._v_trace")

def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=150, return_mode="median")

W = H._WARP_SPECIALIZED
orig = H.hopper_forward_config
out_rows = []
for hd, causal, S, extra in ((64, True, 512, {}), (64, True, 512, dict(BLOCK_N=64)), (64, True, 1024, {}),
                             (64, True, 2048, {}), (64, False, 512, {}), (128, True, 512, dict(Q_STAGES=1))):
    Hh, B = 2048 // hd, 16384 // S
    q, k, v = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    cfg = dict(W, PERSISTENT=True, **extra)
    H.hopper_forward_config = lambda *a: dict(cfg)
    run = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=0 if causal else -1)
    t_main = bench(run)
    ref = F.scaled_dot_product_attention(qt[:2].float(), kt[:2].float(), vt[:2].float(), is_causal=causal).transpose(1, 2)
    err = ((run()[0][:2].float() - ref).norm() / ref.norm()).item()
    # traced run (plain launch, not graph): one warm call, then the traced one
    flash_fwd.flash_fwd_hopper = V
    V.hopper_forward_config = lambda *a: dict(cfg)
    V.TRACE = torch.zeros(132 * 2 * 64 * 8, dtype=torch.int64, device="cuda")
    run(); torch.cuda.synchronize(); V.TRACE.zero_(); run(); torch.cuda.synchronize()
    t_tr = bench(run)
    flash_fwd.flash_fwd_hopper = H
    tr = V.TRACE.view(132, 2, 64, 8).cpu()
    t0 = tr[..., 0][tr[..., 0] > 0].min().item()
    span = (tr[..., 5].max().item() - t0) / 1e3
    phases = {}
    for p in range(132):
        for wg in range(2):
            for kk in range(64):
                r = tr[p, wg, kk]
                if r[0] == 0:
                    continue
                nb = int(r[7])
                ph = phases.setdefault(nb, [[] for _ in range(6)])
                for i in range(1, 6):
                    ph[i - 1].append((r[i] - r[i - 1]).item())
                nxt = tr[p, wg, kk + 1, 0].item() if kk + 1 < 64 else 0
                ph[5].append((nxt - r[5]).item() if nxt > 0 else float("nan"))
    name = f"hd{hd} {'causal' if causal else 'full'} S={S} {extra or ''}"
    print(f"{name}: cudnn {flops / t_c / 1e9:.1f} | ours {flops / t_main / 1e9:.1f} (err {err:.1e}) | traced {flops / t_tr / 1e9:.1f}"
          f" | span of traced run {span:.1f} us (graph-timed {t_main * 1e3:.1f} us)")
    print("  n_blocks tiles | wait Q/K0 | first S | loop | last PV | epilogue | to next tile   (median ns)")
    for nb in sorted(phases):
        ph = phases[nb]
        med = [statistics.median([x for x in col if x == x]) if any(x == x for x in col) else float("nan") for col in ph]
        print(f"  {nb:8d} {len(ph[0]):5d} | " + " | ".join(f"{m:8.0f}" for m in med))
        out_rows.append(dict(case=name, n_blocks=nb, tiles=len(ph[0]), median_ns=med))
    out_rows.append(dict(case=name, cudnn=flops / t_c / 1e9, ours=flops / t_main / 1e9, traced=flops / t_tr / 1e9, span_us=span))
    H.hopper_forward_config = orig
json.dump(out_rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "s23_trace.json"), "w"), indent=1)
