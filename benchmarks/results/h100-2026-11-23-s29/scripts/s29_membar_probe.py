"""Session 29 (offline, triton 3.6, sm_90): where triton 3.6 puts CTA barriers around Gluon mbarrier ops in a loop.
V3: two waits on different barriers; V4: one arrive; V5: arrives on two different barriers; V6: wait on one barrier;
V7: a predicated arrive. Output (bar.sync = the partition barrier Membar inserts): V3 one before the first wait, V4 one
per arrive, V5 one before each arrive, V6 one per wait, V7 one per arrive."""
import os, re
os.environ["TRITON_INTERPRET"] = "0"
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.experimental.gluon._runtime import GluonASTSource

@gluon.jit
def k_b(n, V: gl.constexpr):
    a = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    b = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(a.index(i), count=1)
        mbarrier.init(b.index(i), count=1)
    for j in range(n):
        if V == 3:
            mbarrier.wait(a.index(j % 2), (j // 2) & 1)
            mbarrier.wait(b.index(j % 2), (j // 2) & 1)
        if V == 4:
            mbarrier.arrive(a.index(j % 2), count=1)
        if V == 5:
            mbarrier.arrive(a.index(j % 2), count=1)
            mbarrier.arrive(b.index(j % 2), count=1)
        if V == 6:
            mbarrier.wait(a.index(0), j & 1)
        if V == 7:
            mbarrier.arrive(a.index(j % 2), count=1, pred=gl.program_id(0) >= 0)

for v in (3, 4, 5, 6, 7):
    k = triton.compile(GluonASTSource(k_b, {"n": "i32", "V": "constexpr"}, {"V": v}), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    ptx = k.asm["ptx"]
    body = [l.strip()[:40] for l in ptx.split("$L__BB0_2:")[1].splitlines() if re.search(r"bar\.sync|barrier\.sync|mbarrier\.(arrive|try_wait|init)|^\$L__BB", l)]
    print("V", v, body)
