"""Session 39 A/B: the channels_last Gluon GroupNorm forward under different plans (compute partitions x tile pixels),
same process, graph-timed, bf16 SiLU; each checked against the Triton plans' output."""
import sys, time, torch
sys.path.insert(0, ".gpu")
import flashfuse.ops.group_norm as G
from flashfuse.ops.group_norm_details import _hopper_fwd_cl as cl
from s28_abtools import gn_inputs, timed

VARIANTS = [(2, 64), (2, 32), (4, 32), (4, 16), (4, 64)]
shapes = [(16, 640, 64, 64), (8, 320, 128, 128), (16, 1280, 32, 32), (8, 320, 64, 64), (16, 320, 64, 64),
          (2, 320, 64, 64), (2, 640, 64, 64), (2, 960, 32, 32), (4, 640, 64, 64)]
def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()
tot = {v: 0.0 for v in VARIANTS}
for shape in shapes:
    for temb in (False, True):
        if temb and shape not in ((16, 640, 64, 64), (8, 320, 128, 128), (2, 320, 64, 64)):
            continue
        x, w, b, r = gn_inputs(shape, temb)
        x = x.contiguous(memory_format=torch.channels_last)
        ff = lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", r)
        G.HOPPER_FWD = False
        y_ref, m_ref, s_ref = [v.clone() for v in ff()]
        t_tri = timed(ff)
        G.HOPPER_FWD = True
        res = {}
        for rnd in range(3):
            for v in (VARIANTS if rnd % 2 == 0 else VARIANTS[::-1]):
                cl.DEFAULT = v
                p = cl.plan(shape[0], shape[1], shape[2] * shape[3], 2, torch.cuda.get_device_properties(0).multi_processor_count)
                if p is None:
                    res[v] = None
                    continue
                t0 = time.time()
                y, m, s = ff()
                if rnd == 0:
                    err = (rel(y, y_ref), rel(m, m_ref), rel(s, s_ref))
                    bad = not torch.isfinite(y).all().item() or err[0] > 1e-2 or err[1] > 1e-4 or err[2] > 1e-4
                    res[v] = [p, err, bad, []]
                res[v][3].append(timed(ff))
        line = f"{str(shape):18s} temb={int(temb)} triton {t_tri:6.1f} |"
        for v in VARIANTS:
            if res.get(v) is None:
                line += f" {v}: -- |"
                continue
            p, err, bad, ts = res[v]
            line += f" {v}: {min(ts):6.1f}{' BAD' + str(err) if bad else ''} (K{p.n_chunks} pps{p.pps} c{p.chunk_px}) |"
            tot[v] += min(ts) if res[(2, 64)] else 0
        gb = 2 * x.numel() * 2 / 1e3
        best = min(min(res[v][3]) for v in VARIANTS if res.get(v))
        print(line, f"best {gb / best:.0f} GB/s clone {timed(lambda: x.clone()):5.1f}", flush=True)
cl.DEFAULT = (2, 64)
print("sums:", {v: round(t, 1) for v, t in tot.items()})
