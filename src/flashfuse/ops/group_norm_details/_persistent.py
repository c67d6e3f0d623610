"""PERSISTENT mode of ``flashfuse.ops.group_norm``: one launch per direction, x read from HBM once.

The work items are CHUNKED's slabs (``_chunked.py``: sample n, pixel chunk k, channel block cb, walked in
[BLOCK_C, BLOCK_HW] tiles, per-channel partials), but the three kernels of a direction become two phases of
one persistent kernel, and the second phase re-reads a slab from L2 shortly after the first read it:

    A (statistics)   slab item i: per-channel partial sums -> PA, PB [N, K, C]; arrive at the sample's counter.
                     The last of the sample's K x n_cblocks items to arrive *finalizes* the sample: it sums
                     the partials over chunks (fixed order: deterministic), folds channels into groups and
                     writes the per-(n, g) statistics, then marks the counter READY.
    B (apply)        slab item i - lag x P: wait until its sample is READY, re-read the slab, write the output.

Program p of the P-program grid runs rounds r = 0, 1, ...: A of item r P + p, then B of item (r - lag) P + p.
So between a slab's two reads the GPU reads about lag rounds of other slabs (lag x P slabs, a few MB: the
launcher sizes the slabs so that this stays well inside the 50 MB L2), and a sample's finalize runs while
the next round streams; a program waits only when its sample's last slab is still in flight.

Forward (d = s - K_g, K_g = s[n, first channel of c's group, pixel 0], one shift per group shared by every
slab: no cancellation in the squares)
    A: S1_c = sum d, S2_c = sum d^2 over the slab's pixels              -> PA, PB
    finalize: per group, M = CPG x HW: mean_d = sum_{k, c in g} S1 / M,
              var = sum S2 / M - mean_d^2, mu = K_g + mean_d, rstd = 1 / sqrt(var + eps)  -> OUT_A, OUT_B
    B: y = act((s - mu) rstd w + b)
Backward (g = dz w, dz = dy act'(z), x_hat = (s - mu) rstd)
    A: per channel sum(dz x_hat), sum(dz)  -> PA, PB (also the dw / db partials, summed by torch)
    finalize: c1 = sum_c w_c PA / M = mean(g x_hat), c2 = sum_c w_c PB / M = mean(g)  -> OUT_A, OUT_B
    B: dx = rstd (g - c2 - x_hat c1); (HAS_DRES) its per-channel sum -> DRES_PART [N, K, C]

Synchronisation. COUNTER[n] (int32, 0 between launches) counts arrivals; the finalizer adds READY; every B
adds 1 when done ("departs"), and the departure that brings it to READY + 2 x items_per_sample stores 0 for the
next launch (CUDA-graph safe, no host work). Stores are published with a CTA barrier then a release atomic
from one thread (the pattern of a cooperative grid sync); readers acquire, and read what other SMs wrote with
".cg" loads (L2; L1 is not coherent).

Deadlock freedom: all P programs are resident at once (the launcher sizes P from the compiled kernel's
occupancy) and a sample's items span at most lag + 1 rounds, so every item a B waits for belongs to a round
<= the waiting program's current one, whose A every program runs before its own B of the same iteration.
The spin is bounded anyway (``spin_limit`` polls): if residency were broken (an SM-limited MPS client), the
sample's output is NaN instead of a hung GPU. PHASE = 1 / 2 run A and B as two launches (the interpreter
runs programs one at a time, where a spin would never end): x is then read twice.
"""

import triton
import triton.language as tl

from ._kernels import _grad_tile, _load_affine, _load_s, _normalize_store

READY = tl.constexpr(1 << 24)   # added to a sample's counter by its finalizer (arrivals and departures stay below)


@triton.jit
def _slab_of(item, C, HW, chunk_hw, n_chunks, n_cblocks, BLOCK_C: tl.constexpr):
    """(sample, chunk, channels [BLOCK_C], channel mask, first pixel, end pixel) of a work item; items run
    channel block fastest, then chunk, then sample."""
    cb = item % n_cblocks
    k = (item // n_cblocks) % n_chunks
    i_n = (item // (n_cblocks * n_chunks)).to(tl.int64)
    o_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)                                # [BLOCK_C]
    hw_start = k * chunk_hw
    return i_n, k, o_c, o_c < C, hw_start, tl.minimum(hw_start + chunk_hw, HW)


@triton.jit
def _gather_group(STAT, i_n, o_c, m_c, CPG, num_groups):
    """A per-(n, g) statistic gathered per channel: STAT[n, c // CPG] as [BLOCK_C, 1] (written by another SM
    in this launch: ".cg" reads L2)."""
    return tl.load(STAT + i_n * num_groups + o_c // CPG, mask=m_c, other=0.0, cache_modifier=".cg")[:, None]


@triton.jit
def _arrive(COUNTER):
    """Publish this program's stores, then count it in; returns the count before (one atomic, acq_rel: the
    last arriver then sees every other arriver's partials)."""
    tl.debug_barrier()
    return tl.atomic_add(COUNTER, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _wait_ready(COUNTER, spin_limit):
    """Spin until the sample's statistics are published; False if spin_limit polls passed first."""
    seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
    tries = 0
    while (seen < READY) & (tries < spin_limit):
        seen = tl.atomic_add(COUNTER, 0, sem="acquire", scope="gpu")
        tries += 1
    return seen >= READY


@triton.jit
def _depart(COUNTER, per_sample):
    """The last of the sample's items to finish B resets its counter to 0 for the next launch."""
    tl.debug_barrier()
    old = tl.atomic_add(COUNTER, 1, sem="relaxed", scope="gpu")
    if old == READY + 2 * per_sample - 1:
        tl.atomic_xchg(COUNTER, 0, sem="relaxed", scope="gpu")


@triton.jit
def _finalize_sample(X, R, PA, PB, W, SCRATCH, OUT_A, OUT_B, COUNTER, i_n,
                     C, HW, CPG, num_groups, n_chunks, group_size, eps,
                     stride_x_n, stride_x_c, stride_r_n, stride_r_c,
                     FORWARD: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_CF: tl.constexpr, BLOCK_G: tl.constexpr,
                     BLOCK_CPG: tl.constexpr):
    """Per-group statistics of sample i_n from its [K, C] partials (see the module docstring), published
    with READY. Per-channel totals over the chunks go through SCRATCH [N, 2, C] (the fold of channels into
    groups of CPG, any CPG, is a gather there)."""
    PA += i_n * n_chunks * C
    PB += i_n * n_chunks * C
    SCRATCH += i_n * 2 * C
    for c0 in range(0, C, BLOCK_CF):
        o_c = c0 + tl.arange(0, BLOCK_CF)                                     # [BLOCK_CF]
        m_c = o_c < C
        ta = tl.zeros([BLOCK_K, BLOCK_CF], dtype=tl.float32)
        tb = tl.zeros([BLOCK_K, BLOCK_CF], dtype=tl.float32)
        for k0 in range(0, n_chunks, BLOCK_K):
            o_k = k0 + tl.arange(0, BLOCK_K)                                  # [BLOCK_K]
            mask = (o_k < n_chunks)[:, None] & m_c[None, :]
            p = o_k[:, None] * C + o_c[None, :]
            ta += tl.load(PA + p, mask=mask, other=0.0, cache_modifier=".cg")
            tb += tl.load(PB + p, mask=mask, other=0.0, cache_modifier=".cg")
        sa = tl.sum(ta, axis=0)                                               # [BLOCK_CF]
        sb = tl.sum(tb, axis=0)
        if not FORWARD:
            if HAS_WEIGHT:
                w = tl.load(W + o_c, mask=m_c, other=0.0).to(tl.float32)
                sa = sa * w
                sb = sb * w
        tl.store(SCRATCH + o_c, sa, mask=m_c)
        tl.store(SCRATCH + C + o_c, sb, mask=m_c)
    tl.debug_barrier()
    for g0 in range(0, num_groups, BLOCK_G):
        o_g = g0 + tl.arange(0, BLOCK_G)                                      # [BLOCK_G]
        m_g = o_g < num_groups
        ga = tl.zeros([BLOCK_G, BLOCK_CPG], dtype=tl.float32)
        gb = tl.zeros([BLOCK_G, BLOCK_CPG], dtype=tl.float32)
        for j0 in range(0, CPG, BLOCK_CPG):
            o_j = j0 + tl.arange(0, BLOCK_CPG)                                # [BLOCK_CPG]
            mask = m_g[:, None] & (o_j < CPG)[None, :]
            p = o_g[:, None] * CPG + o_j[None, :]
            ga += tl.load(SCRATCH + p, mask=mask, other=0.0)
            gb += tl.load(SCRATCH + C + p, mask=mask, other=0.0)
        a = tl.sum(ga, axis=1) / group_size                                   # [BLOCK_G]
        b = tl.sum(gb, axis=1) / group_size
        if FORWARD:
            # a = mean(d), b = mean(d^2): mu = K_g + a, var = b - a^2
            c_first = o_g * CPG
            shift = _load_s(X + i_n * stride_x_n, R + i_n * stride_r_n, c_first, tl.zeros([1], dtype=tl.int32),
                            m_g[:, None], stride_x_c, 0, stride_r_c, 0, HAS_RESIDUAL)   # [BLOCK_G, 1]: K_g
            a_out = tl.sum(shift, axis=1) + a
            b_out = tl.math.rsqrt(tl.maximum(b - a * a, 0.0) + eps)
        else:
            a_out = a
            b_out = b
        tl.store(OUT_A + i_n * num_groups + o_g, a_out, mask=m_g)
        tl.store(OUT_B + i_n * num_groups + o_g, b_out, mask=m_g)
    tl.debug_barrier()
    tl.atomic_add(COUNTER, READY, sem="release", scope="gpu")


@triton.jit(do_not_specialize=["n_rounds", "lag"])   # the launcher sizes the grid from this very compile
def _persistent_fwd_kernel(
    X, R, W, B, Y, PA, PB, SCRATCH, MEAN, RSTD, COUNTER,
    # X, R, Y: (N, C, HW) by strides; W, B: [C]; PA, PB: [N, K, C] fp32 partials; SCRATCH: [N, 2, C] fp32;
    # MEAN, RSTD: [N, G] fp32 (out); COUNTER: [>= N] int32, 0 between launches
    C, HW, CPG, num_groups, chunk_hw, n_chunks, n_cblocks, n_items, n_rounds, lag, spin_limit, group_size, eps,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_y_n, stride_y_c, stride_y_hw,
    PHASE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_CF: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_CPG: tl.constexpr,
):
    """y = act(GN(x + r)): PHASE 0 one launch (A and B per round), 1 only A, 2 only B (lag 0)."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    per_sample = n_chunks * n_cblocks
    for r in range(0, n_rounds + lag):
        item = r * n_progs + pid
        if (PHASE != 2) and (r < n_rounds) and (item < n_items):
            i_n, k, o_c, m_c, hw_start, hw_end = _slab_of(item, C, HW, chunk_hw, n_chunks, n_cblocks, BLOCK_C)
            Xn = X + i_n * stride_x_n
            Rn = R + i_n * stride_r_n
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
            o_part = (i_n * n_chunks + k) * C + o_c
            tl.store(PA + o_part, tl.sum(acc, axis=1), mask=m_c)
            tl.store(PB + o_part, tl.sum(acc2, axis=1), mask=m_c)
            if _arrive(COUNTER + i_n) == per_sample - 1:
                _finalize_sample(X, R, PA, PB, W, SCRATCH, MEAN, RSTD, COUNTER + i_n, i_n, C, HW, CPG,
                                 num_groups, n_chunks, group_size, eps, stride_x_n, stride_x_c, stride_r_n,
                                 stride_r_c, True, HAS_RESIDUAL, False, BLOCK_K, BLOCK_CF, BLOCK_G, BLOCK_CPG)
        item = (r - lag) * n_progs + pid
        if (PHASE != 1) and (r >= lag) and (item < n_items):
            i_n, k, o_c, m_c, hw_start, hw_end = _slab_of(item, C, HW, chunk_hw, n_chunks, n_cblocks, BLOCK_C)
            ok = True
            if PHASE == 0:
                ok = _wait_ready(COUNTER + i_n, spin_limit)
            mean = _gather_group(MEAN, i_n, o_c, m_c, CPG, num_groups)          # [BLOCK_C, 1]
            rstd = _gather_group(RSTD, i_n, o_c, m_c, CPG, num_groups)
            if not ok:
                mean = mean + float("nan")
            w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)         # [BLOCK_C]
            Xn = X + i_n * stride_x_n
            Rn = R + i_n * stride_r_n
            Yn = Y + i_n * stride_y_n
            for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
                o_hw = h0 + tl.arange(0, BLOCK_HW)
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(Xn, Rn, o_c, o_hw, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL)
                _normalize_store(s, mean, rstd, w, b, Yn, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                                 HAS_WEIGHT, HAS_BIAS, ACTIVATION)
            _depart(COUNTER + i_n, per_sample)


@triton.jit(do_not_specialize=["n_rounds", "lag"])
def _persistent_bwd_kernel(
    X, R, DY, W, B, MEAN, RSTD, PA, PB, SCRATCH, C1, C2, COUNTER, DX, DRES_PART,
    # X, R, DY, DX: (N, C, HW) by strides; MEAN, RSTD: [N, G]; PA, PB: [N, K, C] fp32 (out: the dw / db
    # partials); SCRATCH: [N, 2, C]; C1, C2: [N, G] fp32; DRES_PART: [N, K, C] fp32 (out)
    C, HW, CPG, num_groups, chunk_hw, n_chunks, n_cblocks, n_items, n_rounds, lag, spin_limit, group_size,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw, stride_dx_n, stride_dx_c, stride_dx_hw,
    PHASE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, HAS_DRES: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
    STAGES: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_CF: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_CPG: tl.constexpr,
):
    """dx of y = act(GN(x + r)) and the dw / db / dresidual partials; PHASE as the forward."""
    pid = tl.program_id(0)
    n_progs = tl.num_programs(0)
    per_sample = n_chunks * n_cblocks
    for r in range(0, n_rounds + lag):
        item = r * n_progs + pid
        if (PHASE != 2) and (r < n_rounds) and (item < n_items):
            i_n, k, o_c, m_c, hw_start, hw_end = _slab_of(item, C, HW, chunk_hw, n_chunks, n_cblocks, BLOCK_C)
            Xn = X + i_n * stride_x_n
            Rn = R + i_n * stride_r_n
            DYn = DY + i_n * stride_dy_n
            mean = tl.load(MEAN + i_n * num_groups + o_c // CPG, mask=m_c, other=0.0)[:, None]
            rstd = tl.load(RSTD + i_n * num_groups + o_c // CPG, mask=m_c, other=0.0)[:, None]
            w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
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
            o_part = (i_n * n_chunks + k) * C + o_c
            tl.store(PA + o_part, tl.sum(acc_dzx, axis=1), mask=m_c)
            tl.store(PB + o_part, tl.sum(acc_dz, axis=1), mask=m_c)
            if _arrive(COUNTER + i_n) == per_sample - 1:
                _finalize_sample(X, R, PA, PB, W, SCRATCH, C1, C2, COUNTER + i_n, i_n, C, HW, CPG, num_groups,
                                 n_chunks, group_size, 0.0, stride_x_n, stride_x_c, stride_r_n, stride_r_c,
                                 False, HAS_RESIDUAL, HAS_WEIGHT, BLOCK_K, BLOCK_CF, BLOCK_G, BLOCK_CPG)
        item = (r - lag) * n_progs + pid
        if (PHASE != 1) and (r >= lag) and (item < n_items):
            i_n, k, o_c, m_c, hw_start, hw_end = _slab_of(item, C, HW, chunk_hw, n_chunks, n_cblocks, BLOCK_C)
            ok = True
            if PHASE == 0:
                ok = _wait_ready(COUNTER + i_n, spin_limit)
            mean = tl.load(MEAN + i_n * num_groups + o_c // CPG, mask=m_c, other=0.0)[:, None]
            rstd = tl.load(RSTD + i_n * num_groups + o_c // CPG, mask=m_c, other=0.0)[:, None]
            c1 = _gather_group(C1, i_n, o_c, m_c, CPG, num_groups)                # [BLOCK_C, 1]
            c2 = _gather_group(C2, i_n, o_c, m_c, CPG, num_groups)
            if not ok:
                c1 = c1 + float("nan")
            w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
            Xn = X + i_n * stride_x_n
            Rn = R + i_n * stride_r_n
            DYn = DY + i_n * stride_dy_n
            DXn = DX + i_n * stride_dx_n
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
                tl.store(DRES_PART + (i_n * n_chunks + k) * C + o_c, tl.sum(acc, axis=1), mask=m_c)
            _depart(COUNTER + i_n, per_sample)
