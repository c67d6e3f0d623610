"""Session 20: where the channels_last Gluon forward's time goes. Writes an instrumented copy of _hopper_fwd_cl.py
(globaltimer stamps per program, partition and round: start, stats done, spin done, merge done, normalize done) and
prints per-shape phase durations."""
import json, os, re, sys, importlib
import torch
src_dir = "src/flashfuse/ops/group_norm_details"
s = open(f"{src_dir}/_hopper_fwd_cl.py").read()
def sub(a, b, count=1):
    global s
    assert s.count(a) >= 1, a
    s = s.replace(a, b, count)
sub("    @gluon.jit\n    def _channel_rows(", '''    @gluon.jit
    def _st(p, idx):
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(p + idx, t)

    @gluon.jit
    def _channel_rows(''')
sub("def _meet(p_part_n, p_count_n,", "def _meet(p_tr, ti, p_part_n, p_count_n,")
sub('''            arrived = gl.atomic_add(p_count_n, 0, sem="acquire", scope="gpu")
        gl.thread_barrier()''', '''            arrived = gl.atomic_add(p_count_n, 0, sem="acquire", scope="gpu")
        gl.thread_barrier()
        _st(p_tr, ti + 2)''')
sub('''        p_scr = p_scr + (pid * PARTS + PART) * (2 * c + 2 * G_PAD) ''', '''        p_tr = (p_scr + per_round * n_chunks * PARTS * (2 * c + 2 * G_PAD)).to(gl.pointer_type(gl.int64), bitcast=True) + \\
            (pid * PARTS + PART) * 512
        p_scr = p_scr + (pid * PARTS + PART) * (2 * c + 2 * G_PAD) ''')
sub('''            k = i * n_cb * n_pt
''', '''            k = i * n_cb * n_pt
            ti = (i // PARTS) * 8
            _st(p_tr, ti)
''')
sub('''            mean, rstd, og, m_g = _meet(''', '''            _st(p_tr, ti + 1)
            mean, rstd, og, m_g = _meet(p_tr, ti, ''')
sub('''            gl.store(p_mean + n * groups + og, mean, mask=m_g & (j == 0))''', '''            _st(p_tr, ti + 3)
            gl.store(p_mean + n * groups + og, mean, mask=m_g & (j == 0))''')
sub('''                    else:
                        gl.store(p_y + offs, z.to(ring.dtype))
''', '''                    else:
                        gl.store(p_y + offs, z.to(ring.dtype))
            _st(p_tr, ti + 4)
''')
sub('''    part = torch.empty(n * p.n_chunks * num_groups * 2 + grid * PARTS * (2 * c + 2 * g_pad), dtype''',
    '''    global TRACE
    part = torch.zeros(n * p.n_chunks * num_groups * 2 + grid * PARTS * (2 * c + 2 * g_pad) + grid * PARTS * 1024, dtype''')
sub('''    count = torch.zeros(n''', '''    TRACE = (part[n * p.n_chunks * num_groups * 2 + grid * PARTS * (2 * c + 2 * g_pad):].view(torch.int64).view(grid, PARTS, 64, 8), p)
    count = torch.zeros(n''')
open(f"{src_dir}/_hopper_fwd_cl_trace.py", "w").write(s)
# variant "spaced": each sample's counter on its own 128-byte line, the spin by volatile loads, one acquire at the end
sub("gl.atomic_add(p_count_n, 0, sem=\"acquire\", scope=\"gpu\")\n        while arrived < n_chunks:\n            arrived = gl.atomic_add(p_count_n, 0, sem=\"acquire\", scope=\"gpu\")",
    "gl.load(p_count_n, volatile=True)\n        while arrived < n_chunks:\n            arrived = gl.load(p_count_n, volatile=True)\n        gl.atomic_add(p_count_n, 0, sem=\"acquire\", scope=\"gpu\")")
sub("p_count + n, n_chunks", "p_count + n * 32, n_chunks")
sub("count = torch.zeros(n,", "count = torch.zeros(n * 32,")
open(f"{src_dir}/_hopper_fwd_cl_trace2.py", "w").write(s)
s = open(f"{src_dir}/_hopper_fwd_cl_trace.py").read()
sub("def _chunk_stats(ring, ready, res, res_row0, k,", "def _chunk_stats(p_tr, ring, ready, res, res_row0, k,")
sub("_chunk_stats(ring, ready, res_rows,", "_chunk_stats(p_tr + 4096 + (i // PARTS) * 4096, ring, ready, res_rows,")
sub("""            kk = k + cb * n_pt
            c = _stage_s(ring, ready, kk, r, HAS_RESIDUAL, SLOTS, tile)                 # the shifts: tile 0""",
    """            kk = k + cb * n_pt
            _st(p_tr, 8 + cb * 4)
            c = _stage_s(ring, ready, kk, r, HAS_RESIDUAL, SLOTS, tile)                 # the shifts: tile 0
            _st(p_tr, 8 + cb * 4 + 1)""")
sub("""            gl.store(p_scr + (cb * BOX_C + cols) * 2, mean_c)""", """            _st(p_tr, 8 + cb * 4 + 2)
            gl.store(p_scr + (cb * BOX_C + cols) * 2, mean_c)""")
sub("""            gl.store(p_scr + (cb * BOX_C + cols) * 2 + 1, m2_c)
""", """            gl.store(p_scr + (cb * BOX_C + cols) * 2 + 1, m2_c)
            _st(p_tr, 8 + cb * 4 + 3)
""")
sub("grid * PARTS * 1024, dtype", "grid * PARTS * 1024 * 32, dtype")
sub(".view(torch.int64).view(grid, PARTS, 64, 8), p)", ".view(torch.int64)[:grid * PARTS * 512 * 32].view(grid, PARTS, 512 * 32), p)")
sub("(pid * PARTS + PART) * 512", "(pid * PARTS + PART) * 512 * 32")
open(f"{src_dir}/_hopper_fwd_cl_trace3.py", "w").write(s)
import triton
import flashfuse.ops.group_norm as G
T3 = importlib.import_module("flashfuse.ops.group_norm_details._hopper_fwd_cl_trace3")
G.hopper_fwd_cl = T3
for shape in [(2, 320, 64, 64), (16, 1280, 32, 32)]:
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=torch.channels_last)
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    for _ in range(3):
        y, m, r = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
    torch.cuda.synchronize()
    tr, p = T3.TRACE
    tr = tr.cpu().double()
    n_cb = C // 64
    base = tr[:, 0, 0].min()
    st = tr[:, 0, 4096 + 8:4096 + 8 + n_cb * 4].reshape(-1, n_cb, 4) - base          # part 0, round 0: [grid, n_cb, 4]
    print(shape, p, flush=True)
    for cb in range(n_cb):
        q = st[:, cb].median(dim=0).values / 1e3
        print(f"   cb {cb:2d}: before wait {q[0]:6.2f} data {q[1]:6.2f} reduced {q[2]:6.2f} stored {q[3]:6.2f} us", flush=True)
    print(f"   round: start {(tr[:, 0, 0] - base).median() / 1e3:.2f} stats {(tr[:, 0, 1] - base).median() / 1e3:.2f} "
          f"spin {(tr[:, 0, 2] - base).median() / 1e3:.2f} norm {(tr[:, 0, 4] - base).median() / 1e3:.2f}", flush=True)
raise SystemExit

VARIANTS = {"base": importlib.import_module("flashfuse.ops.group_norm_details._hopper_fwd_cl_trace"),
            "spaced": importlib.import_module("flashfuse.ops.group_norm_details._hopper_fwd_cl_trace2")}
out = os.environ.get("OUT", "/tmp")
SHAPES = [(2, 320, 64, 64), (8, 320, 64, 64), (16, 640, 64, 64), (16, 1280, 32, 32)]
res = {}
for (vname, T), shape in [(v, sh) for v in VARIANTS.items() for sh in SHAPES]:
    G.hopper_fwd_cl = T
    x = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1).to(memory_format=torch.channels_last)
    C = shape[1]; w = torch.randn(C, device="cuda"); b = torch.randn(C, device="cuda")
    for _ in range(3):
        y, m, r = G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
    torch.cuda.synchronize()
    tr, p = T.TRACE
    tr = tr.clone()
    us = triton.testing.do_bench_cudagraph(lambda: G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None), rep=30) * 1e3
    tr = tr.cpu()
    valid = tr[..., 0] > 0                                  # [grid, PARTS, 64]
    t0 = tr[..., 0][valid].min()
    ph = tr[valid].double() - t0.double()                   # [rows, 8] ns since the first round start
    d = ph[:, 1:5] - ph[:, 0:4]                             # stats, spin, merge, normalize
    rounds = valid.sum(dim=(0, 1))
    line = (f"{vname:6s} {str(shape):18s} graph {us:6.1f} us {p} rounds/part {rounds.tolist()[:8]}  span {(ph[:, 4].max()) / 1e3:6.1f} us | "
            f"median us: stats {d[:, 0].median() / 1e3:5.2f} spin {d[:, 1].median() / 1e3:5.2f} merge "
            f"{d[:, 2].median() / 1e3:5.2f} norm {d[:, 3].median() / 1e3:5.2f} | max: stats {d[:, 0].max() / 1e3:5.2f} "
            f"spin {d[:, 1].max() / 1e3:5.2f} merge {d[:, 2].max() / 1e3:5.2f} norm {d[:, 3].max() / 1e3:5.2f}")
    print(line, flush=True)
    # timeline per round slot: median start / stats end / spin end / merge end / norm end across programs
    for part in range(2):
        for rr in range(int(valid[:, part].sum(0).gt(0).sum())):
            v = valid[:, part, rr]
            q = tr[:, part, rr][v].double() - t0.double()
            print(f"   part {part} round {rr}: start {q[:, 0].median()/1e3:6.1f} [{q[:, 0].min()/1e3:6.1f},{q[:, 0].max()/1e3:6.1f}]"
                  f" stats {q[:, 1].median()/1e3:6.1f} [max {q[:, 1].max()/1e3:6.1f}] spin {q[:, 2].median()/1e3:6.1f}"
                  f" merge {q[:, 3].median()/1e3:6.1f} norm {q[:, 4].median()/1e3:6.1f} [max {q[:, 4].max()/1e3:6.1f}]", flush=True)
    res[vname + str(shape)] = tr.tolist()
json.dump(res, open(f"{out}/cl_trace.json", "w"))
