"""Session 13 probe 3: s13_coop.py's read-once forward with x's chunks streamed through tensor-descriptor (TMA)
loads in a `tl.range(num_stages=...)` loop, so that the next items' chunks land in shared memory while this
item meets. x viewed as rows of 256 elements (L % CHUNK == 0 and HW % 256 == 0 here: the probe's shapes)."""
import torch
import triton
import triton.language as tl

from flashfuse.ops.glu import SILU, _activation


@triton.jit
def _coop_tma_fwd(X, W, B, Y, PART, CNT, FAIL, L, HW, CPG, G, K, n_items, total_rows, spin_limit, eps,
                  CHUNK: tl.constexpr, KP: tl.constexpr, MEET: tl.constexpr, STAGES: tl.constexpr,
                  POLLS: tl.constexpr = 0, FAST_SILU: tl.constexpr = False):
    R: tl.constexpr = CHUNK // 256
    desc = tl.make_tensor_descriptor(X, shape=[total_rows, 256], strides=[256, 1], block_shape=[R, 256])
    for item in tl.range(tl.program_id(0), n_items, tl.num_programs(0), num_stages=STAGES):
        g = item // K
        k = item % K
        base = g.to(tl.int64) * L
        rows = k * R + tl.arange(0, R)
        offs = rows[:, None] * 256 + tl.arange(0, 256)[None, :]       # [R, 256] group-local
        x = desc.load([g * (L // 256) + k * R, 0]).to(tl.float32)
        mean_k = tl.sum(tl.sum(x, axis=1), axis=0) / CHUNK
        d = x - mean_k
        m2_k = tl.sum(tl.sum(d * d, axis=1), axis=0)
        tl.store(PART + (g * KP + k) * 2, mean_k)
        tl.store(PART + (g * KP + k) * 2 + 1, m2_k)
        if MEET:
            tl.atomic_add(CNT + 2 * g, 1, sem="release", scope="gpu")
            seen = tl.atomic_add(CNT + 2 * g, 0, sem="acquire", scope="gpu")
            if POLLS > 0:   # a bounded, unrolled spin: a nested loop would stop the pipelining of x's loads
                for _ in tl.static_range(POLLS):
                    if seen < K:
                        seen = tl.atomic_add(CNT + 2 * g, 0, sem="acquire", scope="gpu")
                if seen < K:
                    tl.atomic_add(FAIL, 1, sem="relaxed", scope="gpu")
            else:
                tries = 0
                while (seen < K) & (tries < spin_limit):
                    seen = tl.atomic_add(CNT + 2 * g, 0, sem="acquire", scope="gpu")
                    tries += 1
        o_k = tl.arange(0, KP)
        mk = o_k < K
        # read through atomics: the pipeliner would hoist plain loads above the meeting
        means = tl.where(mk, tl.atomic_add(PART + (g * KP + o_k) * 2, 0.0, mask=mk, sem="relaxed", scope="gpu"), 0.0)
        m2s = tl.where(mk, tl.atomic_add(PART + (g * KP + o_k) * 2 + 1, 0.0, mask=mk, sem="relaxed", scope="gpu"), 0.0)
        Lf = L.to(tl.float32)
        mean = tl.sum(means, axis=0) / K
        dm = tl.where(mk, means - mean, 0.0)
        m2 = tl.sum(m2s, axis=0) + CHUNK * tl.sum(dm * dm, axis=0)
        if MEET:
            old = tl.atomic_add(CNT + 2 * g + 1, 1, sem="relaxed", scope="gpu")
            if old == K - 1:
                tl.atomic_xchg(CNT + 2 * g, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(CNT + 2 * g + 1, 0, sem="relaxed", scope="gpu")
        rstd = 1.0 / tl.sqrt(m2 / Lf + eps)
        ch = (g % G) * CPG + (rows * 256) // HW
        w = tl.load(W + ch)
        b = tl.load(B + ch)
        a = (w * rstd)[:, None]
        c = (b - mean * w * rstd)[:, None]
        z = x * a + c
        if FAST_SILU:
            y, _ = _activation(z, False, SILU)      # one MUFU ex2 + one MUFU rcp
        else:
            y = z / (1.0 + tl.exp(-z))
        tl.store(Y + base + offs, y.to(Y.dtype.element_ty))


_STATE = {}


def run_tma(x, w, b, num_groups, chunk, warps, stages, meet=1, spin_limit=1 << 22, polls=0, fast=False):
    N, C = x.shape[:2]
    HW = x[0, 0].numel()
    cpg = C // num_groups
    L = cpg * HW
    assert L % chunk == 0 and HW % 256 == 0
    K = L // chunk
    KP = triton.next_power_of_2(K)
    n_items = N * num_groups * K
    key = (x.shape, num_groups, chunk, warps, stages, meet, polls, fast)
    st = _STATE.get(key)
    y = torch.empty_like(x)
    if st is None:
        part = torch.zeros(N * num_groups * KP * 2, device=x.device, dtype=torch.float32)
        cnt = torch.zeros(2 * N * num_groups, device=x.device, dtype=torch.int32)
        consts = dict(CHUNK=chunk, KP=KP, MEET=meet, STAGES=stages, POLLS=polls, FAST_SILU=fast, num_warps=warps)
        fail = torch.zeros(1, device=x.device, dtype=torch.int32)
        args = (x, w, b, y, part, cnt, fail, L, HW, cpg, num_groups, K, n_items, x.numel() // 256, spin_limit, 1e-5)
        comp = _coop_tma_fwd.warmup(*args, grid=(1,), **consts)
        comp._init_handles()
        regs, smem = comp.n_regs, comp.metadata.shared
        per_warp = -(-regs * 32 // 256) * 256
        occ = min(65536 // (per_warp * warps), 64 // warps, 32, 232448 // max(smem + 1024, 1))
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        P = min(n_items, sms * occ // K * K)
        st = dict(part=part, cnt=cnt, fail=fail, L=L, HW=HW, cpg=cpg, K=K, n_items=n_items, P=P, consts=consts, occ=occ,
                  regs=regs, smem=smem)
        _STATE[key] = st
    _coop_tma_fwd[(st["P"],)](x, w, b, y, st["part"], st["cnt"], st["fail"], L, HW, cpg, num_groups, K, n_items,
                              x.numel() // 256, spin_limit, 1e-5, **st["consts"], launch_cooperative_grid=True)
    return y, st
