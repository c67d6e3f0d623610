"""PERSISTENT mode of ``flashfuse.ops.group_norm``: one launch per direction, x read from HBM once.

Work is cut into *units* of GB consecutive groups of one sample (GB = 1 in NCHW; in channels_last several
groups, so that a unit's channels make one contiguous run per pixel: 6 groups of 10 bf16 channels are a
120-byte run), and a unit into *items*: channel block cb (NCHW: BLOCK_C rows of one group's channels) x
pixel chunk k, item = unit x per_unit + cb x n_chunks + k. An item is walked in [BLOCK_C, BLOCK_HW] tiles
twice, in two phases of one persistent kernel:

    A (statistics)  per group of the unit, the item's shifted sums S1 = sum d, S2 = sum d^2 (forward,
                    d = s - K_g, K_g = s[n, first channel of g, pixel 0]: one shift per group shared by all
                    its items, so the squares do not cancel) -> PART[unit, item, g]; then arrive at the
                    unit's counter.
    B (apply)       wait until all per_unit items of the unit have arrived, sum their partials (fixed order:
                    deterministic), re-read the item's tiles and write the output.

Program p of the P-program grid runs rounds r = 0, 1, ...: A of item r P + p, then B of item (r - lag) P + p.
Between an item's two reads the GPU streams about lag rounds (lag x P items, a few MB: the launcher sizes
the items so that this stays inside the 50 MB L2), so the second read is an L2 hit, and a program waits only
when its unit's last item is still in flight.

Forward: mu = K_g + sum S1 / M, var = sum S2 / M - (sum S1 / M)^2 (M = CPG x HW), y = act((s - mu) rstd w + b).
Backward (g = dz w, dz = dy act'(z), x_hat = (s - mu) rstd): A sums per group sum(g x_hat), sum(g), and per
channel sum(dz x_hat), sum(dz) (the dw / db partials -> DW_PART, DB_PART [N, n_chunks, C], summed by torch);
B: dx = rstd (g - mean(g) - x_hat mean(g x_hat)), and (HAS_DRES) its per-channel sum.

Synchronisation, in SYNC (int32): [0] the launch generation, [1] the exit count, then two banks of unit
counters; a launch uses bank (generation & 1) and its programs zero the other bank for the next launch (the
launch before, which used it, is over). Arrivals add 1 after a CTA barrier with release semantics (the pattern
of a cooperative grid sync); waiters poll with acquire and read the partials with ".cg" loads (L2: L1 is not
coherent). The last program to exit resets the exit count and advances the generation. No host work: CUDA-graph
replays keep working (two graphs replayed concurrently on different streams would share the banks: not done).

Deadlock freedom: all P programs are resident at once (the launcher sizes P from the compiled kernel's
occupancy) and a unit's items span at most lag + 1 rounds, so every item a B waits for belongs to a round
<= its program's current one, whose A every program runs before its own B of that iteration. The spin is
bounded anyway (``spin_limit`` polls): if residency were broken (an SM-limited MPS client) the unit's output
is NaN instead of a hung GPU. PHASE = 1 / 2 run A and B as two launches (the interpreter runs programs one at
a time, where a spin would never end): x is then read twice.
"""

import triton
import triton.language as tl

from ._kernels import _grad_tile, _load_affine, _load_s, _normalize_store


@triton.jit
def _item_of(item, per_unit, n_chunks, units_per_sample, GB, CPG, num_groups, HW, chunk_hw,
             BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr):
    """(unit, sample, first channel of the unit, chunk, unit-local channels [BLOCK_C] and mask, first / end
    pixel, group one-hot [BLOCK_C, BLOCK_G] (fp32), group mask [BLOCK_G]) of a work item."""
    u = item // per_unit
    j = item % per_unit
    cb = j // n_chunks
    k = j % n_chunks
    i_n = (u // units_per_sample).to(tl.int64)
    g0 = (u % units_per_sample) * GB
    n_groups = tl.minimum(GB, num_groups - g0)
    o_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)                                # [BLOCK_C] unit-local
    m_c = o_c < n_groups * CPG
    o_g = tl.arange(0, BLOCK_G)                                               # [BLOCK_G] unit-local
    onehot = (((o_c // CPG)[:, None] == o_g[None, :]) & m_c[:, None]).to(tl.float32)
    hw_start = k * chunk_hw
    return (u.to(tl.int64), i_n, g0 * CPG, k, o_c, m_c, hw_start, tl.minimum(hw_start + chunk_hw, HW), onehot,
            o_g < n_groups)


@triton.jit
def _per_channel(onehot, v_g):
    """Broadcast a per-group [BLOCK_G] vector to the item's channels: [BLOCK_C, 1]."""
    return tl.sum(onehot * v_g[None, :], axis=1)[:, None]


@triton.jit
def _per_group(onehot, v_c):
    """Sum a per-channel [BLOCK_C] vector over each group's channels: [BLOCK_G]."""
    return tl.sum(onehot * v_c[:, None], axis=0)


@triton.jit
def _bank(SYNC, cap, PHASE: tl.constexpr):
    """This launch's unit counters; PHASE != 1 also zeroes this program's share of the other bank."""
    gen = tl.load(SYNC, cache_modifier=".cg")
    bank = SYNC + 2 + (gen & 1) * cap
    if PHASE != 1:
        other = SYNC + 2 + (1 - (gen & 1)) * cap
        for i in range(tl.program_id(0), cap, tl.num_programs(0)):
            tl.store(other + i, 0)
    return bank


@triton.jit
def _exit(SYNC, PHASE: tl.constexpr):
    """Count this program out; the last one resets the count and advances the generation."""
    if PHASE != 1:
        tl.debug_barrier()
        if tl.atomic_add(SYNC + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.atomic_xchg(SYNC + 1, 0, sem="relaxed", scope="gpu")
            tl.atomic_add(SYNC, 1, sem="release", scope="gpu")


@triton.jit
def _arrive(COUNTER):
    """Publish this program's partials (every thread's stores, then one release atomic)."""
    tl.debug_barrier()
    tl.atomic_add(COUNTER, 1, sem="release", scope="gpu")


@triton.jit
def _wait(COUNTER, target, spin_limit, PHASE: tl.constexpr):
    """Spin until `target` items have arrived (PHASE 2: they have); False if spin_limit polls passed first."""
    if PHASE == 2:
        return True
    seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    tries = 0
    while (seen < target) & (tries < spin_limit):
        seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
        tries += 1
    return seen >= target


@triton.jit
def _unit_sums(PART, u, per_unit, BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr):
    """(sum of PART[u, :, g, 0], sum of PART[u, :, g, 1]) over the unit's items, [BLOCK_G] each (L2 reads)."""
    o_g = tl.arange(0, BLOCK_G)
    a = tl.zeros([BLOCK_K, BLOCK_G], dtype=tl.float32)
    b = tl.zeros([BLOCK_K, BLOCK_G], dtype=tl.float32)
    for k0 in range(0, per_unit, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)                                      # [BLOCK_K]
        p = PART + ((u * per_unit + o_k[:, None]) * BLOCK_G + o_g[None, :]) * 2
        m = (o_k < per_unit)[:, None]
        a += tl.load(p, mask=m, other=0.0, cache_modifier=".cg")
        b += tl.load(p + 1, mask=m, other=0.0, cache_modifier=".cg")
    return tl.sum(a, axis=0), tl.sum(b, axis=0)


@triton.jit(do_not_specialize=["n_rounds", "lag"])   # the launcher sizes the grid from this very compile
def _persistent_fwd_kernel(
    X, R, W, B, Y, PART, MEAN, RSTD, SYNC,
    # X, R, Y: (N, C, HW) by strides; W, B: [C]; PART: [units, per_unit, BLOCK_G, 2] fp32;
    # MEAN, RSTD: [N, G] fp32 (out); SYNC: int32 [2 + 2 cap] (module docstring)
    HW, CPG, num_groups, GB, units_per_sample, per_unit, n_chunks, chunk_hw, n_items, cap, n_rounds, lag,
    spin_limit, group_size, eps,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_y_n, stride_y_c, stride_y_hw,
    PHASE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):
    """y = act(GN(x + r)): PHASE 0 one launch (A and B per round), 1 only A, 2 only B (lag 0)."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    COUNTERS = _bank(SYNC, cap, PHASE)
    for r in range(0, n_rounds + lag):
        item = r * n_progs + pid
        if (PHASE != 2) and (r < n_rounds) and (item < n_items):
            u, i_n, c0, k, o_c, m_c, hw_start, hw_end, onehot, m_g = _item_of(
                item, per_unit, n_chunks, units_per_sample, GB, CPG, num_groups, HW, chunk_hw, BLOCK_C, BLOCK_G)
            Xn = X + i_n * stride_x_n + c0 * stride_x_c
            Rn = R + i_n * stride_r_n + c0 * stride_r_c
            shift = _load_s(Xn, Rn, o_c // CPG * CPG, tl.zeros([1], dtype=tl.int32), m_c[:, None], stride_x_c,
                            stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)   # [BLOCK_C, 1]: K_g
            acc = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
            for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
                o_hw = h0 + tl.arange(0, BLOCK_HW)                            # [BLOCK_HW]
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(Xn, Rn, o_c, o_hw, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL)
                d = tl.where(mask, s - shift, 0.0)
                acc += d
                acc2 += d * d
            p = PART + (item * BLOCK_G + tl.arange(0, BLOCK_G)) * 2
            tl.store(p, _per_group(onehot, tl.sum(acc, axis=1)))
            tl.store(p + 1, _per_group(onehot, tl.sum(acc2, axis=1)))
            _arrive(COUNTERS + u)
        item = (r - lag) * n_progs + pid
        if (PHASE != 1) and (r >= lag) and (item < n_items):
            u, i_n, c0, k, o_c, m_c, hw_start, hw_end, onehot, m_g = _item_of(
                item, per_unit, n_chunks, units_per_sample, GB, CPG, num_groups, HW, chunk_hw, BLOCK_C, BLOCK_G)
            ok = _wait(COUNTERS + u, per_unit, spin_limit, PHASE)
            s1, s2 = _unit_sums(PART, u, per_unit, BLOCK_K, BLOCK_G)                # [BLOCK_G]
            Xn = X + i_n * stride_x_n + c0 * stride_x_c
            Rn = R + i_n * stride_r_n + c0 * stride_r_c
            o_g = tl.arange(0, BLOCK_G)
            shift_g = tl.sum(_load_s(Xn, Rn, o_g * CPG, tl.zeros([1], dtype=tl.int32), m_g[:, None], stride_x_c,
                                     stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL), axis=1)  # [BLOCK_G]
            mean_d = s1 / group_size
            mean_g = shift_g + mean_d
            rstd_g = tl.math.rsqrt(tl.maximum(s2 / group_size - mean_d * mean_d, 0.0) + eps)
            if not ok:
                mean_g = mean_g + float("nan")
            if item % per_unit == 0:
                g_first = i_n * num_groups + c0 // CPG
                tl.store(MEAN + g_first + o_g, mean_g, mask=m_g)
                tl.store(RSTD + g_first + o_g, rstd_g, mask=m_g)
            mean = _per_channel(onehot, mean_g)                               # [BLOCK_C, 1]
            rstd = _per_channel(onehot, rstd_g)
            w, b = _load_affine(W + c0, B + c0, o_c, m_c, HAS_WEIGHT, HAS_BIAS)    # [BLOCK_C]
            Yn = Y + i_n * stride_y_n + c0 * stride_y_c
            for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
                o_hw = h0 + tl.arange(0, BLOCK_HW)
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(Xn, Rn, o_c, o_hw, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL)
                _normalize_store(s, mean, rstd, w, b, Yn, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                                 HAS_WEIGHT, HAS_BIAS, ACTIVATION)
    _exit(SYNC, PHASE)


@triton.jit(do_not_specialize=["n_rounds", "lag"])
def _persistent_bwd_kernel(
    X, R, DY, W, B, MEAN, RSTD, PART, SYNC, DX, DW_PART, DB_PART, DRES_PART,
    # X, R, DY, DX: (N, C, HW) by strides; MEAN, RSTD: [N, G]; PART: [units, per_unit, BLOCK_G, 2] fp32;
    # DW_PART, DB_PART, DRES_PART: [N, n_chunks, C] fp32 (out)
    C, HW, CPG, num_groups, GB, units_per_sample, per_unit, n_chunks, chunk_hw, n_items, cap, n_rounds, lag,
    spin_limit, group_size,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw, stride_dx_n, stride_dx_c, stride_dx_hw,
    PHASE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, HAS_DRES: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):
    """dx of y = act(GN(x + r)) and the dw / db / dresidual partials; PHASE as the forward."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    COUNTERS = _bank(SYNC, cap, PHASE)
    for r in range(0, n_rounds + lag):
        item = r * n_progs + pid
        if (PHASE != 2) and (r < n_rounds) and (item < n_items):
            u, i_n, c0, k, o_c, m_c, hw_start, hw_end, onehot, m_g = _item_of(
                item, per_unit, n_chunks, units_per_sample, GB, CPG, num_groups, HW, chunk_hw, BLOCK_C, BLOCK_G)
            Xn = X + i_n * stride_x_n + c0 * stride_x_c
            Rn = R + i_n * stride_r_n + c0 * stride_r_c
            DYn = DY + i_n * stride_dy_n + c0 * stride_dy_c
            g_c = i_n * num_groups + (c0 + o_c) // CPG
            mean = tl.load(MEAN + g_c, mask=m_c, other=0.0)[:, None]             # [BLOCK_C, 1]
            rstd = tl.load(RSTD + g_c, mask=m_c, other=0.0)[:, None]
            w, b = _load_affine(W + c0, B + c0, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
            acc_dz = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
            acc_dzx = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
            for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
                o_hw = h0 + tl.arange(0, BLOCK_HW)                            # [BLOCK_HW]
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(Xn, Rn, o_c, o_hw, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL)
                dy = tl.load(DYn + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask,
                             other=0.0)
                x_hat, dz, _g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
                acc_dz += dz                                # 0 outside the mask (dy loads 0 there)
                acc_dzx += dz * x_hat
            db_c = tl.sum(acc_dz, axis=1)                                     # [BLOCK_C]
            dw_c = tl.sum(acc_dzx, axis=1)
            o_part = (i_n * n_chunks + k) * C + c0 + o_c
            if COMPUTE_DW:
                tl.store(DW_PART + o_part, dw_c, mask=m_c)
            if COMPUTE_DB:
                tl.store(DB_PART + o_part, db_c, mask=m_c)
            p = PART + (item * BLOCK_G + tl.arange(0, BLOCK_G)) * 2
            tl.store(p, _per_group(onehot, dw_c * w))                         # sum g x_hat
            tl.store(p + 1, _per_group(onehot, db_c * w))                     # sum g
            _arrive(COUNTERS + u)
        item = (r - lag) * n_progs + pid
        if (PHASE != 1) and (r >= lag) and (item < n_items):
            u, i_n, c0, k, o_c, m_c, hw_start, hw_end, onehot, m_g = _item_of(
                item, per_unit, n_chunks, units_per_sample, GB, CPG, num_groups, HW, chunk_hw, BLOCK_C, BLOCK_G)
            ok = _wait(COUNTERS + u, per_unit, spin_limit, PHASE)
            sum_gx, sum_g = _unit_sums(PART, u, per_unit, BLOCK_K, BLOCK_G)          # [BLOCK_G]
            if not ok:
                sum_g = sum_g + float("nan")
            c1 = _per_channel(onehot, sum_gx) / group_size                    # mean(g x_hat), [BLOCK_C, 1]
            c2 = _per_channel(onehot, sum_g) / group_size                     # mean(g)
            g_c = i_n * num_groups + (c0 + o_c) // CPG
            mean = tl.load(MEAN + g_c, mask=m_c, other=0.0)[:, None]
            rstd = tl.load(RSTD + g_c, mask=m_c, other=0.0)[:, None]
            w, b = _load_affine(W + c0, B + c0, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
            Xn = X + i_n * stride_x_n + c0 * stride_x_c
            Rn = R + i_n * stride_r_n + c0 * stride_r_c
            DYn = DY + i_n * stride_dy_n + c0 * stride_dy_c
            DXn = DX + i_n * stride_dx_n + c0 * stride_dx_c
            acc = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
            for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
                o_hw = h0 + tl.arange(0, BLOCK_HW)
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(Xn, Rn, o_c, o_hw, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL)
                dy = tl.load(DYn + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask,
                             other=0.0)
                x_hat, _dz, g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
                dx = (g - c2 - x_hat * c1) * rstd
                tl.store(DXn + o_c[:, None] * stride_dx_c + o_hw[None, :] * stride_dx_hw,
                         dx.to(DX.dtype.element_ty), mask=mask)
                if HAS_DRES:
                    acc += tl.where(mask, dx, 0.0)
            if HAS_DRES:
                tl.store(DRES_PART + (i_n * n_chunks + k) * C + c0 + o_c, tl.sum(acc, axis=1), mask=m_c)
    _exit(SYNC, PHASE)
