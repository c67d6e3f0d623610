"""Session 28: a globaltimer timeline of the NCHW Gluon forward (an instrumented copy of _hopper_fwd.py, K = 1 shapes).
Per program, per partition and group ordinal i: stamps at the group's start, each tile's arrival (statistics pass),
statistics done, pass 3 start / end; the loader: each tile's issue (after its slot came free). Prints, for a few
programs, the timeline, and averages over programs: the loader's wait for slots, tile latency, pass-3 length."""
import importlib, sys
import torch
src_dir = "src/flashfuse/ops/group_norm_details"
s = open(f"{src_dir}/_hopper_fwd.py").read()
NOSTORE = "--nostore" in sys.argv


def sub(a, b, count=1):
    global s
    assert s.count(a) == count, (a, s.count(a))
    s = s.replace(a, b)


sub("    @gluon.jit\n    def _store_rows(", '''    @gluon.jit
    def _st(p, idx):
        t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(p + idx, t)

    @gluon.jit
    def _store_rows(''')
# stats: each tile's arrival
sub("def _stats(ring, ready, k,", "def _stats(p_tr, ring, ready, k,")
sub("""        c = _stage_s(ring, ready, k, r, HAS_RESIDUAL, SLOTS, tile)
""", """        c = _stage_s(ring, ready, k, r, HAS_RESIDUAL, SLOTS, tile)
        _st(p_tr, 1)
""")
sub("""            d = _stage_s(ring, ready, k + t, r, HAS_RESIDUAL, SLOTS, tile) - c
""", """            d = _stage_s(ring, ready, k + t, r, HAS_RESIDUAL, SLOTS, tile) - c
            _st(p_tr, 1 + t)
""")
sub("""            mean, m2 = _stats(ring, ready, k,""", """            p_tr = p_part.to(gl.pointer_type(gl.int64), bitcast=True) + ((pid * 3 + PART) * 16 + i) * 64
            _st(p_tr, 0)
            mean, m2 = _stats(p_tr, ring, ready, k,""")
sub("""            rstd = gl.rsqrt(gl.maximum(m2, 0.0) * (inv_numel / n_chunks) + eps)
""", """            rstd = gl.rsqrt(gl.maximum(m2, 0.0) * (inv_numel / n_chunks) + eps)
            _st(p_tr, 50)
""")
sub("""                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
""", """                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
            _st(p_tr, 51)
""")
if NOSTORE:
    sub("_store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)",
        "gl.store(p_y + offs, z.to(dtype), mask=z == 1.2345e30)")
# loader: each tile's issue
sub("def _loader(x_desc, ring,", "def _loader(p_part, x_desc, ring,")
sub("""        k = 0
        for grp in range(pid // n_chunks, n_groups, per_round):
            u = grp * n_chunks + pid % n_chunks
            for t in range(n_tiles):
                slot = k % SLOTS
                mbarrier.wait(empty.index(slot), ((k // SLOTS) & 1) ^ 1)
""", """        k = 0
        gi = 0
        for grp in range(pid // n_chunks, n_groups, per_round):
            u = grp * n_chunks + pid % n_chunks
            p_tr = p_part.to(gl.pointer_type(gl.int64), bitcast=True) + ((pid * 3 + 2) * 16 + gi) * 64
            gi += 1
            for t in range(n_tiles):
                slot = k % SLOTS
                mbarrier.wait(empty.index(slot), ((k // SLOTS) & 1) ^ 1)
                _st(p_tr, t)
""")
sub("(_loader, (x_desc, ring,", "(_loader, (p_part, x_desc, ring,", 2)
sub("""    part = torch.empty(units * 2, dtype=torch.float32, device=x.device) if meet else mean""",
    """    global TRACE
    part = torch.zeros(sm_count(x.device) * 3 * 16 * 64 * 2, dtype=torch.float32, device=x.device)
    TRACE = part.view(torch.int64).view(-1, 3, 16, 64)""")
name = "_tr_nostore" if NOSTORE else "_tr"
open(f"{src_dir}/{name}.py", "w").write(s)
T = importlib.import_module(f"flashfuse.ops.group_norm_details.{name}")
import flashfuse.ops.group_norm as G
G.hopper_fwd = T
for shape in [(16, 640, 64, 64), (16, 1280, 32, 32)]:
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    C = shape[1]; w = torch.randn(C, device="cuda").bfloat16(); b = torch.randn(C, device="cuda").bfloat16()
    for _ in range(3):
        G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
    torch.cuda.synchronize()
    tr = T.TRACE.cpu()
    p = T.plan(shape[0], C, shape[2] * shape[3], 32, 2, 132)
    nt = (p.chunk_rows + 15) // 16
    t0 = tr[tr > 0].min().item()
    tr = torch.where(tr > 0, tr - t0, torch.zeros_like(tr)).double() / 1000.0   # us since the first stamp
    end = tr.max().item()
    print(f"== {shape} {'nostore' if NOSTORE else 'base'}: tiles/group {nt}, kernel span {end:.1f} us")
    ngroups = [len(range(pid, shape[0] * 32, p.per_round)) for pid in range(p.per_round)]
    sums = {}
    for pid in range(p.per_round):
        for i in range(ngroups[pid]):
            part = i % 2
            g = tr[pid, part, i]
            ld = tr[pid, 2, i]
            row = dict(start=g[0].item(), first=g[1].item(), last=g[nt].item(), stats=g[50].item(), p3end=g[51].item(),
                       iss0=ld[0].item(), issN=ld[nt - 1].item())
            lat = [(g[1 + t] - ld[t]).item() for t in range(nt)]
            row["lat_mean"] = sum(lat) / nt
            row["lat_last"] = lat[-1]
            if pid in (0, 1, 77):
                print(f"  pid {pid:3d} grp {i} part {part}: issue {row['iss0']:6.2f}..{row['issN']:6.2f}  arrive "
                      f"{row['first']:6.2f}..{row['last']:6.2f}  stats {row['stats']:6.2f}  pass3 end {row['p3end']:6.2f}  "
                      f"lat mean {row['lat_mean']:.2f} last {row['lat_last']:.2f}")
            for kk in ("lat_mean", "lat_last"):
                sums.setdefault(kk, []).append(row[kk])
            sums.setdefault("pass3", []).append(row["p3end"] - row["stats"])
            sums.setdefault("issue_span", []).append(row["issN"] - row["iss0"])
            sums.setdefault("arrive_span", []).append(row["last"] - row["first"])
            sums.setdefault(f"p3end_i{i}", []).append(row["p3end"])
    print("  averages: " + "  ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in sums.items()))
