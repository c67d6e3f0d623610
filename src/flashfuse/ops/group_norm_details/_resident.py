"""RESIDENT mode of ``flashfuse.ops.group_norm``: x is read from HBM once, whatever the group size.

The math is that of ``_kernels.py`` (forward statistics, VJP). What changes is who holds the data:

Work is cut into *units* of GB consecutive groups of one sample (GB = 1 for NCHW, several groups for
channels_last, so that a unit's channels make one long contiguous run per pixel: 6 groups of 10 bf16
channels are a 120-byte run instead of 20 bytes), and each unit into K *chunks* of
[BLOCK_C channels, BLOCK_HW pixels] (channel block cb, pixel block pb), item = unit * K + chunk.
A program loads its chunk once into registers (one wide burst of loads: up to 64 KB in flight per SM),
publishes the chunk's partial statistics per group (count, mean, m2: exact two-pass over registers) to
PART, and then needs the K partials of its unit before it can normalize the chunk it still holds:

    PHASE 0 (one launch): the K programs of a unit meet at a per-unit arrival counter (atomic add, then
        spin until it reaches K), read the K partials from L2, normalize, store. x read once, y written
        once: the traffic of a copy.
    PHASE 1 + PHASE 2 (two launches, no spin): phase 1 publishes, phase 2 reloads its chunk and
        normalizes. Used when a unit has more chunks than can be resident at once, and in the
        interpreter (which runs programs one after another: a spin there would never end).

Deadlock freedom of PHASE 0. The grid is persistent: P programs, program p handles items p, p + P,
p + 2P, ... (round r = items [rP, rP + P)). The launcher guarantees (a) P <= SMs x programs per SM, with
the programs-per-SM bound enforced by ``maxnreg`` (registers: P_SM x warps x 32 x maxnreg <= 65536) and
tiny shared memory, so all P programs are resident together once earlier kernels of the stream finish,
and (b) P is a multiple of K, so the K items of a unit are in the same round. A program waits only for
units of its current round, whose K programs are all resident and reach that round after finishing the
previous one (whose waits are satisfied by induction). The spin is still bounded (``spin_limit`` polls,
seconds): if the guarantee were ever broken (e.g. an SM-limited MPS client), the unit's statistics
become NaN instead of hanging the GPU.

Counter reset without host work (CUDA-graph safe): after reading the partials every program adds 1 again
("departs"); the counter first reaches K through arrivals alone, so the program that takes it to 2K is
the last one that will ever look at it in this launch, and it stores 0 for the next launch.

Backward (PHASE as above): the chunk holds s and dy; partials per group are (sum g, sum g x_hat)
(g = dz w), plus per-channel dw / db partials (sum dz x_hat, sum dz over the chunk's pixels) stored to
[N, pixel blocks, C] for torch to sum (deterministic); dx = rstd (g - mean g - x_hat mean(g x_hat)).
"""

import triton
import triton.language as tl

from ._kernels import _grad_tile, _load_affine, _load_s, _normalize_store


@triton.jit
def _item(item, n_chunks, n_cblocks, units_per_sample, GB, CPG, num_groups, HW,
          BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr):
    """Coordinates of one work item: (unit, chunk, sample, first channel of the unit, groups in the unit,
    unit-local channels [BLOCK_C] and their mask, pixels [BLOCK_HW], the tile mask, group one-hot
    [BLOCK_C, BLOCK_G] (channel -> unit-local group), pixels in the chunk)."""
    u = item // n_chunks
    j = item % n_chunks
    cb = j % n_cblocks
    pb = j // n_cblocks
    i_n = (u // units_per_sample).to(tl.int64)
    g0 = (u % units_per_sample) * GB
    n_groups = tl.minimum(GB, num_groups - g0)
    o_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)                                # [BLOCK_C] unit-local
    m_c = o_c < n_groups * CPG
    o_hw = pb * BLOCK_HW + tl.arange(0, BLOCK_HW)                             # [BLOCK_HW]
    mask = m_c[:, None] & (o_hw < HW)[None, :]                                # [BLOCK_C, BLOCK_HW]
    o_g = tl.arange(0, BLOCK_G)                                               # [BLOCK_G]
    onehot = ((o_c // CPG)[:, None] == o_g[None, :]) & m_c[:, None]           # [BLOCK_C, BLOCK_G]
    n_hw = tl.minimum(HW - pb * BLOCK_HW, BLOCK_HW).to(tl.float32)
    return u.to(tl.int64), j, pb, i_n, g0, n_groups, o_c, m_c, o_hw, mask, o_g, onehot.to(tl.float32), n_hw


@triton.jit
def _per_channel(onehot, v_g):
    """Broadcast a per-group [BLOCK_G] vector to the chunk's channels [BLOCK_C]."""
    return tl.sum(onehot * v_g[None, :], axis=1)


@triton.jit
def _per_group(onehot, v_c):
    """Sum a per-channel [BLOCK_C] vector over each group's channels: [BLOCK_G]."""
    return tl.sum(onehot * v_c[:, None], axis=0)


@triton.jit
def _arrive_and_wait(COUNTER, target, spin_limit):
    """Arrive at the unit's counter and spin until all `target` chunks have arrived (acquire: their partials
    are then visible). Returns False if spin_limit polls passed first (see the module docstring)."""
    tl.atomic_add(COUNTER, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    tries = 0
    while (seen < target) & (tries < spin_limit):
        seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
        tries += 1
    return seen >= target


@triton.jit
def _depart(COUNTER, target):
    """The program that takes the counter from 2 target - 1 to 2 target is the last reader: reset to 0."""
    old = tl.atomic_add(COUNTER, 1, sem="relaxed", scope="gpu")
    if old == 2 * target - 1:
        tl.atomic_xchg(COUNTER, 0, sem="relaxed", scope="gpu")


@triton.jit
def _group_norm_fwd_resident_kernel(
    X, R, W, B, Y, PART, COUNTER, MEAN, RSTD,
    # X, R, Y: (N, C, HW) by strides; W, B: [C]; PART: [units, K, BLOCK_G, 3] fp32 (count, mean, m2);
    # COUNTER: [>= units] int32, zero between launches; MEAN, RSTD: [N * G] fp32 (out)
    HW, CPG, num_groups, GB, units_per_sample, n_chunks, n_cblocks, n_items, spin_limit,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_y_n, stride_y_c, stride_y_hw,
    eps,
    PHASE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Persistent: program p handles items p, p + P, ... (see the module docstring for PHASE)."""
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        u, j, pb, i_n, g0, n_groups, o_c, m_c, o_hw, mask, o_g, onehot, n_hw = _item(
            item, n_chunks, n_cblocks, units_per_sample, GB, CPG, num_groups, HW, BLOCK_C, BLOCK_HW, BLOCK_G)
        c0 = g0 * CPG
        s = _load_s(X + i_n * stride_x_n + c0 * stride_x_c, R + i_n * stride_r_n + c0 * stride_r_c, o_c, o_hw,
                    mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)  # [BLOCK_C, BLOCK_HW]
        if PHASE != 2:
            # the chunk's (count, mean, m2) per group from the registers: a first mean, corrected by the
            # mean of the deviations from it (a mean of 300 +- 2 in fp32 is otherwise off by ~1e-5 std),
            # then m2 over the deviations from the corrected mean (no E[s^2] - mean^2 cancellation)
            cnt_g = tl.maximum(tl.sum(onehot, axis=0) * n_hw, 1.0)                 # [BLOCK_G]
            mean_g = _per_group(onehot, tl.sum(s, axis=1)) / cnt_g
            d = tl.where(mask, s - _per_channel(onehot, mean_g)[:, None], 0.0)
            mean_g += _per_group(onehot, tl.sum(d, axis=1)) / cnt_g
            d = tl.where(mask, s - _per_channel(onehot, mean_g)[:, None], 0.0)
            m2_g = _per_group(onehot, tl.sum(d * d, axis=1))
            cnt_g = tl.sum(onehot, axis=0) * n_hw
            p = PART + ((u * n_chunks + j) * BLOCK_G + o_g) * 3
            tl.store(p, cnt_g)
            tl.store(p + 1, mean_g)
            tl.store(p + 2, m2_g)
        if PHASE != 1:
            ok = True
            if PHASE == 0:
                ok = _arrive_and_wait(COUNTER + u, n_chunks, spin_limit)
            # Chan's merge of the K chunk partials of each group (L2 reads: ".cg" skips a stale L1 line)
            o_k = tl.arange(0, BLOCK_K)                                           # [BLOCK_K]
            p = PART + ((u * n_chunks + o_k[:, None]) * BLOCK_G + o_g[None, :]) * 3  # [BLOCK_K, BLOCK_G]
            m_k = (o_k < n_chunks)[:, None]
            cnt_k = tl.load(p, mask=m_k, other=0.0, cache_modifier=".cg")
            mean_k = tl.load(p + 1, mask=m_k, other=0.0, cache_modifier=".cg")
            m2_k = tl.load(p + 2, mask=m_k, other=0.0, cache_modifier=".cg")
            if PHASE == 0:
                _depart(COUNTER + u, n_chunks)
            # relative to chunk 0's mean: the differences are small, so the merged mean keeps its digits
            cnt = tl.maximum(tl.sum(cnt_k, axis=0), 1.0)                          # [BLOCK_G]
            mean_0 = tl.sum(tl.where(o_k[:, None] == 0, mean_k, 0.0), axis=0)
            mean = mean_0 + tl.sum(cnt_k * (mean_k - mean_0[None, :]), axis=0) / cnt
            dk = mean_k - mean[None, :]
            rstd = tl.math.rsqrt((tl.sum(m2_k, axis=0) + tl.sum(cnt_k * dk * dk, axis=0)) / cnt + eps)
            if not ok:
                mean = mean + float("nan")
            w, b = _load_affine(W + c0, B + c0, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
            _normalize_store(s, _per_channel(onehot, mean)[:, None], _per_channel(onehot, rstd)[:, None], w, b,
                             Y + i_n * stride_y_n + c0 * stride_y_c, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                             HAS_WEIGHT, HAS_BIAS, ACTIVATION)
            if j == 0:
                m_g = o_g < n_groups
                tl.store(MEAN + i_n * num_groups + g0 + o_g, mean, mask=m_g)
                tl.store(RSTD + i_n * num_groups + g0 + o_g, rstd, mask=m_g)


@triton.jit
def _group_norm_bwd_resident_kernel(
    X, R, DY, W, B, MEAN, RSTD, PART, COUNTER, DX, DW_PART, DB_PART, DRES_PART,
    # X, R, DY, DX: (N, C, HW) by strides; MEAN, RSTD: [N * G]; PART: [units, K, BLOCK_G, 2] fp32
    # (sum g, sum g x_hat); DW_PART, DB_PART, DRES_PART: [N, pixel blocks, C] fp32 (out)
    C, HW, CPG, num_groups, GB, units_per_sample, n_chunks, n_cblocks, n_items, spin_limit, group_size,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw, stride_dx_n, stride_dx_c, stride_dx_hw,
    PHASE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, HAS_DRES: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """Persistent, as the forward: program p computes dx of items p, p + P, ..."""
    n_pblocks = n_chunks // n_cblocks
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        u, j, pb, i_n, g0, n_groups, o_c, m_c, o_hw, mask, o_g, onehot, n_hw = _item(
            item, n_chunks, n_cblocks, units_per_sample, GB, CPG, num_groups, HW, BLOCK_C, BLOCK_HW, BLOCK_G)
        c0 = g0 * CPG
        s = _load_s(X + i_n * stride_x_n + c0 * stride_x_c, R + i_n * stride_r_n + c0 * stride_r_c, o_c, o_hw,
                    mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)  # [BLOCK_C, BLOCK_HW]
        dy = tl.load(DY + i_n * stride_dy_n + c0 * stride_dy_c + o_c[:, None] * stride_dy_c
                     + o_hw[None, :] * stride_dy_hw, mask=mask, other=0.0)
        m_g = o_g < n_groups
        mean_c = _per_channel(onehot, tl.load(MEAN + i_n * num_groups + g0 + o_g, mask=m_g, other=0.0))
        rstd_c = _per_channel(onehot, tl.load(RSTD + i_n * num_groups + g0 + o_g, mask=m_g, other=0.0))
        w, b = _load_affine(W + c0, B + c0, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
        x_hat, dz, g = _grad_tile(s, dy, mean_c[:, None], rstd_c[:, None], w, b, mask, HAS_WEIGHT, HAS_BIAS,
                                  ACTIVATION)
        o_part = (i_n * n_pblocks + pb) * C + c0 + o_c                            # [BLOCK_C]
        if PHASE != 2:
            db_c = tl.sum(dz, axis=1)                                             # [BLOCK_C]
            dw_c = tl.sum(dz * x_hat, axis=1)
            if COMPUTE_DW:
                tl.store(DW_PART + o_part, dw_c, mask=m_c)
            if COMPUTE_DB:
                tl.store(DB_PART + o_part, db_c, mask=m_c)
            if HAS_WEIGHT:
                db_c = db_c * w
                dw_c = dw_c * w
            p = PART + ((u * n_chunks + j) * BLOCK_G + o_g) * 2
            tl.store(p, _per_group(onehot, db_c))                                 # sum g
            tl.store(p + 1, _per_group(onehot, dw_c))                             # sum g x_hat
        if PHASE != 1:
            ok = True
            if PHASE == 0:
                ok = _arrive_and_wait(COUNTER + u, n_chunks, spin_limit)
            o_k = tl.arange(0, BLOCK_K)
            p = PART + ((u * n_chunks + o_k[:, None]) * BLOCK_G + o_g[None, :]) * 2  # [BLOCK_K, BLOCK_G]
            m_k = (o_k < n_chunks)[:, None]
            sum_g = tl.sum(tl.load(p, mask=m_k, other=0.0, cache_modifier=".cg"), axis=0)      # [BLOCK_G]
            sum_gx = tl.sum(tl.load(p + 1, mask=m_k, other=0.0, cache_modifier=".cg"), axis=0)
            if PHASE == 0:
                _depart(COUNTER + u, n_chunks)
            if not ok:
                sum_g = sum_g + float("nan")
            c1 = _per_channel(onehot, sum_gx)[:, None] / group_size              # mean(g x_hat)
            c2 = _per_channel(onehot, sum_g)[:, None] / group_size               # mean(g)
            dx = (g - c2 - x_hat * c1) * rstd_c[:, None]
            tl.store(DX + i_n * stride_dx_n + c0 * stride_dx_c + o_c[:, None] * stride_dx_c
                     + o_hw[None, :] * stride_dx_hw, dx.to(DX.dtype.element_ty), mask=mask)
            if HAS_DRES:
                tl.store(DRES_PART + o_part, tl.sum(tl.where(mask, dx, 0.0), axis=1), mask=m_c)
