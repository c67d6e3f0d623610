"""Session 47: the adaptive LayerNorm forward's (BLOCK_M, num_warps) at DiT widths (8192 tokens, fp16), plain and
the residual form (h = r + gate * x, then LN), CUDA-graph timed, % of the copy ceiling (3002 GB/s, H100)."""
import os, json, torch
from triton.testing import do_bench_cudagraph
import flashfuse.ops.modulation as mod
from flashfuse.ops._triton import next_power_of_2

orig = mod._row_config
rows = []
for D in (1152, 1536, 3072):
    B, T = 32, 256
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(B, T, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    sc, sh, gt = (0.1 * torch.randn(B, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))
    ref_y = mod.ada_layer_norm(x, sc, sh)
    ref_yr, ref_h = mod.ada_layer_norm(x, sc, sh, residual=r, gate=gt)
    bn = next_power_of_2(D)
    cands = [("shipped", None)] + [((bm, w), (bm, bn, w)) for bm in (1, 2, 4, 8) for w in (4, 8, 16)
                                    if 8 <= bm * bn // (32 * w) <= 64]
    for name, cfg in cands:
        if cfg is not None:
            mod._row_config = lambda n_rows, n_cols, max_block_n, cfg=cfg: cfg if max_block_n == mod.MAX_BLOCK_N_FWD else orig(n_rows, n_cols, max_block_n)
        try:
            y = mod.ada_layer_norm(x, sc, sh); yr, h = mod.ada_layer_norm(x, sc, sh, residual=r, gate=gt)
            assert torch.equal(y, ref_y) and torch.equal(yr, ref_yr) and torch.equal(h, ref_h)
            t_plain = do_bench_cudagraph(lambda: mod.ada_layer_norm(x, sc, sh), rep=50, return_mode="median")
            t_res = do_bench_cudagraph(lambda: mod.ada_layer_norm(x, sc, sh, residual=r, gate=gt), rep=50,
                                       return_mode="median")
            nb = x.numel() * 2
            res = dict(D=D, cfg=str(name), plain_us=t_plain * 1e3, res_us=t_res * 1e3,
                       plain_pct=2 * nb / (t_plain * 1e-3) / 3002e9 * 100, res_pct=4 * nb / (t_res * 1e-3) / 3002e9 * 100)
            rows.append(res)
            print(f"D{D} {str(name):10s} plain {res['plain_us']:6.1f} us {res['plain_pct']:4.0f}%  residual "
                  f"{res['res_us']:6.1f} us {res['res_pct']:4.0f}%", flush=True)
        except Exception as e:
            print(D, name, type(e).__name__, str(e)[:200], flush=True)
        finally:
            mod._row_config = orig
    gate_t = do_bench_cudagraph(lambda: mod.ada_layer_norm_gate(r, gt, x), rep=50, return_mode="median")
    print(f"D{D} gate alone {gate_t * 1e3:6.1f} us ({3 * x.numel() * 2 / (gate_t * 1e-3) / 3002e9 * 100:.0f}%); "
          f"copy {do_bench_cudagraph(lambda: x.clone(), rep=50, return_mode='median') * 1e3:.1f} us", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "adaln_sweep.json"), "w"), indent=1)
