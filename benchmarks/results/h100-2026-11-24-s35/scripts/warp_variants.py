"""Session 35: the Gluon GroupNorm kernels with per-warp slot releases (lane 0 of each warp arrives on the slot's
`empty` mbarrier, initialised with count WARPS, after a warp barrier) instead of triton 3.6's partition-wide bar.sync
+ one elected arrive. Gluon 3.6 cannot arrive per warp, so the arrive is inline asm at global_smem + EMPTY_OFF; the
offset is read per constexpr variant from a warmup compile's PTX (the loader's wait on `empty` before its TMA)."""
import importlib, re
from flashfuse.ops._triton import LaunchCache

D = "src/flashfuse/ops/group_norm_details"
HELPER = '''    @gluon.jit
    def _warp_arrive(slot, EMPTY_OFF: gl.constexpr, WARPS: gl.constexpr):
        """Lane 0 of each warp arrives at the empty mbarrier of slot (global_smem + EMPTY_OFF + 8 slot) once the warp's
        lanes have passed a warp barrier (their reads of the slot, fenced, ordered before the arrive)."""
        lay: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        idx = gl.arange(0, 32 * WARPS, layout=lay)
        addr = idx * 0 + (EMPTY_OFF + slot * 8)
        gl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .u32 a; setp.eq.u32 p, $1, 0; mov.u32 a, global_smem; add.u32 a, a, $2; "
            "bar.warp.sync -1; @p mbarrier.arrive.shared::cta.b64 _, [a]; mov.u32 $0, 0; }",
            "=r,r,r", [idx % 32, addr], dtype=gl.int32, is_pure=False, pack=1)

'''


def _sub(src, old, new, count=1):
    assert src.count(old) == count, (old, src.count(old))
    return src.replace(old, new)


def make(name, out, barrier_block, kernel_def, compute_tails):
    src = open(f"{D}/{name}.py").read()
    ind = barrier_block.split("fence_async_shared()")[0]
    new_block = barrier_block.replace(f"{ind}gl.thread_barrier()\n{ind}mbarrier.arrive(empty.index(slot), count=1)\n",
                                      f"{ind}_warp_arrive(slot, EMPTY_OFF, WARPS)\n")
    assert new_block != barrier_block
    src = _sub(src, barrier_block, new_block)
    src = _sub(src, f"    @gluon.jit\n    def {kernel_def}(", HELPER + f"    @gluon.jit\n    def {kernel_def}(")
    i = src.index("    def _compute(")
    j = src.index("):\n", i)
    src = src[:j] + ", EMPTY_OFF: gl.constexpr" + src[j:]
    src = _sub(src, "LOADER_REGS: gl.constexpr):", "LOADER_REGS: gl.constexpr, EMPTY_OFF: gl.constexpr = 0):")
    for tail in compute_tails:
        src = _sub(src, tail + "))", tail + ", EMPTY_OFF))")
    src = _sub(src, "mbarrier.init(empty.index(i), count=1)", "mbarrier.init(empty.index(i), count=WARPS)")
    open(f"{D}/{out}.py", "w").write(src)
    return importlib.import_module(f"flashfuse.ops.group_norm_details.{out}")


def empty_offset(ptx):
    """The loader's `empty` wait address: the try_wait just before its expect_tx, its register's add constant."""
    lines = ptx.splitlines()
    i = next(i for i, l in enumerate(lines) if "mbarrier.arrive.expect_tx" in l)
    j = max(k for k in range(i) if "mbarrier.try_wait" in lines[k])
    reg = re.search(r"\[(%r\d+)\]", lines[j]).group(1)
    k = max(k for k in range(j) if re.match(rf"\s*add\.s32\s+{re.escape(reg)},", lines[k]))
    return int(lines[k].split(",")[-1].strip(" ;"))


class OffsetLaunch:
    """LaunchCache that passes EMPTY_OFF, found once per constexpr variant by a warmup compile."""
    def __init__(self, kernel):
        self.kernel, self.inner, self.offs = kernel, LaunchCache(kernel), {}

    def __call__(self, grid, *args, **cx):
        key = tuple((k, repr(v)) for k, v in sorted(cx.items()))
        if key not in self.offs:
            ptx = self.kernel.warmup(*args, grid=grid, **cx, EMPTY_OFF=0).asm["ptx"]
            self.offs[key] = empty_offset(ptx)
            print("EMPTY_OFF", self.kernel.__name__, dict(cx).get("HAS_RESIDUAL"), dict(cx).get("MEET"), self.offs[key], flush=True)
        return self.inner(grid, *args, **cx, EMPTY_OFF=self.offs[key])


def fwd_variant():
    m = make("_hopper_fwd", "_fv_warp",
             "                fence_async_shared()      # these generic reads (and the write-back) before the next TMA write\n"
             "                gl.thread_barrier()\n                mbarrier.arrive(empty.index(slot), count=1)\n",
             "_group_norm_fwd_hopper_kernel", ["TILE_COLS, SLOTS, WARPS, 0, 1", "TILE_COLS, SLOTS, WARPS, 0, 2",
                                                "TILE_COLS, SLOTS, WARPS, 1, 2"])
    m._launch = OffsetLaunch(m._group_norm_fwd_hopper_kernel)
    return m


def bwd_variant():
    m = make("_hopper_bwd", "_bv_warp",
             "                fence_async_shared()      # these generic reads (and the write-backs) before the next TMA write\n"
             "                gl.thread_barrier()\n                mbarrier.arrive(empty.index(slot), count=1)\n",
             "_group_norm_bwd_hopper_kernel", ["SLOTS, WARPS, 0, 2", "SLOTS, WARPS, 1, 2"])
    m._launch = OffsetLaunch(m._group_norm_bwd_hopper_kernel)
    return m


def cl_variant():
    ind = " " * 20
    m = make("_hopper_fwd_cl", "_cv_warp",
             f"{ind}fence_async_shared()\n{ind}gl.thread_barrier()\n{ind}mbarrier.arrive(empty.index(slot), count=1)\n",
             "_group_norm_fwd_hopper_cl_kernel", [" " * 24 + "WARPS, 0, 2", " " * 24 + "WARPS, 1, 2"])
    m._launch = OffsetLaunch(m._group_norm_fwd_hopper_cl_kernel)
    return m
