"""Session 28: %clock64 stamps per thread around each pass-3 iteration of the NCHW Gluon forward (programs 0-3,
their first two groups; (16, 640, 64, 64) bf16 SiLU): before the slot's load, after the partition barrier and the
release, after the stores are issued. Prints per-tile cycle counts (median over threads) and the warps' skew."""
import importlib
import torch
D = "src/flashfuse/ops/group_norm_details"
s = open(f"{D}/_hopper_fwd.py").read()


def sub(a, b, count=1):
    global s
    assert s.count(a) == count, (a, s.count(a))
    s = s.replace(a, b)


sub("    @gluon.jit\n    def _store_rows(", '''    @gluon.jit
    def _stw(p, j, on, WARPS: gl.constexpr):
        idx = gl.arange(0, WARPS * 32, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
        t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [idx], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(p + j * (WARPS * 32) + idx, t, mask=(idx >= 0) & on)

    @gluon.jit
    def _store_rows(''')
sub("""                slot = (k + t) % SLOTS
                s = ring.index(slot).load(tile).to(gl.float32)
""", """                slot = (k + t) % SLOTS
                on = (pid < 4) & (i < 2) & (t < 20)
                p_tr = p_part.to(gl.pointer_type(gl.int64), bitcast=True) + ((pid * 2 + i) * 20 + t) * 3 * (WARPS * 32)
                _stw(p_tr, 0, on, WARPS)
                s = ring.index(slot).load(tile).to(gl.float32)
""")
sub("""                mbarrier.arrive(empty.index(slot), count=1)
                row = t * TILE_ROWS + rows
""", """                mbarrier.arrive(empty.index(slot), count=1)
                _stw(p_tr, 1, on, WARPS)
                row = t * TILE_ROWS + rows
""")
sub("""                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
""", """                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)
                _stw(p_tr, 2, on, WARPS)
""")
sub("""    part = torch.empty(units * 2, dtype=torch.float32, device=x.device) if meet else mean""",
    """    global TRACE
    part = torch.zeros(4 * 2 * 20 * 3 * 256 * 2, dtype=torch.float32, device=x.device)
    TRACE = part.view(torch.int64).view(4, 2, 20, 3, 256)""")
open(f"{D}/_fv_p3.py", "w").write(s)
if __name__ == "__main__":
    T = importlib.import_module("flashfuse.ops.group_norm_details._fv_p3")
    import flashfuse.ops.group_norm as G
    G.hopper_fwd = T
    x = torch.randn(16, 640, 64, 64, device="cuda", dtype=torch.bfloat16) * 2 + 1
    w = torch.randn(640, device="cuda").bfloat16(); b = torch.randn(640, device="cuda").bfloat16()
    for _ in range(3):
        G.group_norm_forward(x, 32, w, b, 1e-5, "silu", None)
    torch.cuda.synchronize()
    tr = T.TRACE.cpu().double()
    for pid in range(2):
        for i in range(2):
            g = tr[pid, i]                                   # [20 tiles, 3 stamps, 256 threads]
            load_bar = (g[:, 1] - g[:, 0]).median(dim=1).values
            work = (g[:, 2] - g[:, 1]).median(dim=1).values
            nxt = (g[1:, 0] - g[:-1, 2]).median(dim=1).values
            skew = (g[:, 0].max(dim=1).values - g[:, 0].min(dim=1).values)
            total = (g[-1, 2] - g[0, 0]).median().item()
            print(f"pid {pid} group {i}: pass 3 {total:.0f} cycles for 20 tiles ({total / 20:.0f} per tile)")
            print("  load+barrier+release: " + " ".join(f"{v:.0f}" for v in load_bar.tolist()))
            print("  arithmetic+stores:    " + " ".join(f"{v:.0f}" for v in work.tolist()))
            print("  to next iteration:    " + " ".join(f"{v:.0f}" for v in nxt.tolist()))
            print("  warps' skew at start: " + " ".join(f"{v:.0f}" for v in skew.tolist()))
