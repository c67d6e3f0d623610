"""CHUNKED mode of ``flashfuse.ops.group_norm``: per-channel partials over pixel chunks, for both layouts.

The math is that of ``_kernels.py`` (forward statistics, VJP); what changes is the unit of work. A program
owns a *slab* (sample n, pixel chunk k of CHUNK_HW pixels, channel block cb of BLOCK_C channels) and
walks it in [BLOCK_C, BLOCK_HW] tiles, whatever the groups are:

    channels_last (stride_c = 1): a tile is BLOCK_HW rows of BLOCK_C contiguous channels (BLOCK_C * 2 bytes
        of bf16 per row: 128 / 256 / 512 bytes at C = 320 / 640 / 1280, whole 128-byte lines), instead of
        the 20..80-byte runs at a C-element stride that a program per group touches.
    NCHW (stride_hw = 1): a tile is BLOCK_C channel rows of BLOCK_HW contiguous pixels.

Reductions are per *channel* ([BLOCK_C] vectors: per-lane sums over the tile loop, one reduction over the
pixel axis at the end), so a channel block need not align with the groups (C / G = 10 channels and
BLOCK_C = 64 straddle). A tiny finalize kernel, one program per (n, g), merges the CPG x K per-channel
partials of its group. Four launches per direction and wave (kernels 1-3; 2 is tiny):

Forward
    1 stats    (n, k, cb): per channel c of the slab, over the chunk's P_k pixels, the shifted sums of
               d = s - K_g, K_g = s[n, first channel of c's group, pixel 0] (one value per group shared by
               all its chunks: it removes the common offset, so neither the squares nor the merge cancel):
               delta_ck = sum(d) / P_k (the chunk's mean minus K_g), m2_ck = sum(d^2) - sum(d)^2 / P_k.
    2 finalize (n, g): Chan's merge of the K x CPG (P_k, delta_ck, m2_ck) of the group, M = CPG * HW:
               dmu = sum P_k delta_ck / M,  mu = K_g + dmu,  m2 = sum m2_ck + sum P_k (delta_ck - dmu)^2,
               rstd = 1 / sqrt(m2 / M + eps)      -> MEAN, RSTD [N, G] (also saved for the backward)
    3 apply    (n, k, cb): mu, rstd gathered per channel (MEAN[n, c // CPG]), y = act((s - mu) rstd w + b).
Backward (g = dz w, dz = dy act'(z), x_hat = (s - mu) rstd)
    1 sums     (n, k, cb): per channel sum(dz x_hat) and sum(dz) over the chunk -> DW_PART, DB_PART [N, K, C]
               (these are the dw / db partials, summed afterwards by _channel_sums_kernel, and the group sums' inputs).
    2 finalize (n, g): c1 = sum_c w_c DW_PART / M = mean(g x_hat), c2 = sum_c w_c DB_PART / M = mean(g).
    3 dx       (n, k, cb): dx = rstd (g - c2 - x_hat c1); per channel sum of dx (broadcast residual).

x is read twice per direction (kernels 1 and 3); the launcher runs the kernels in *waves* of samples whose
bytes fit in L2 (see ``_chunked_launch.py``) so that the second read is an L2 hit.
"""

import triton
import triton.language as tl

from ._kernels import _grad_tile, _load_affine, _load_s, _normalize_store, _tile_start


@triton.jit
def _slab(C, HW, chunk_hw, BLOCK_C: tl.constexpr):
    """(sample, chunk index, channels [BLOCK_C], channel mask, first pixel, end pixel) of this program."""
    i_n = tl.program_id(0).to(tl.int64)
    i_k = tl.program_id(1)
    o_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)                  # [BLOCK_C]
    hw_start = i_k * chunk_hw
    return i_n, i_k, o_c, o_c < C, hw_start, tl.minimum(hw_start + chunk_hw, HW)


@triton.jit
def _chunked_fwd_stats_kernel(
    X, R, DELTA_PART, M2_PART,
    # X, R: (N, C, HW) by strides; DELTA_PART, M2_PART: [N, n_chunks, C] fp32 (out)
    C, HW, CPG, chunk_hw, n_chunks,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr,
):
    """Kernel 1 forward: per-channel (mean - K_g, m2) of s over the slab's pixels."""
    i_n, i_k, o_c, m_c, hw_start, hw_end = _slab(C, HW, chunk_hw, BLOCK_C)
    X += i_n * stride_x_n
    R += i_n * stride_r_n
    shift = _load_s(X, R, o_c // CPG * CPG, tl.zeros([1], dtype=tl.int32), m_c, m_c[:, None], stride_x_c,
                    stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)       # [BLOCK_C, 1]: K_g
    acc = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
        o_hw = h0 + tl.arange(0, BLOCK_HW)                                    # [BLOCK_HW]
        mask = m_c[:, None] & (o_hw < hw_end)[None, :]
        s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
        d = tl.where(mask, s - shift, 0.0)
        acc += d
        acc2 += d * d
    count = (hw_end - hw_start).to(tl.float32)
    sum_d = tl.sum(acc, axis=1)                                               # [BLOCK_C]
    m2 = tl.maximum(tl.sum(acc2, axis=1) - sum_d * (sum_d / count), 0.0)
    o_part = (i_n * n_chunks + i_k) * C + o_c
    tl.store(DELTA_PART + o_part, sum_d / count, mask=m_c)
    tl.store(M2_PART + o_part, m2, mask=m_c)


@triton.jit
def _chunked_finalize_kernel(
    X, R, PA, PB, W, OUT_A, OUT_B,
    # X, R: (N, C, HW) by strides (FORWARD: K_g); PA, PB: [N, n_chunks, C] fp32 partials; W: [C];
    # OUT_A, OUT_B: [N * G] fp32 (out)
    C, HW, CPG, num_groups, chunk_hw, n_chunks, group_size, eps,
    stride_x_n, stride_x_c, stride_r_n, stride_r_c,
    FORWARD: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_CPG: tl.constexpr,
):
    """Kernel 2, program n * G + g. FORWARD: PA, PB = per-channel mean - K_g, m2 -> OUT_A = mu, OUT_B = rstd.
    Backward: PA, PB = per-channel sum(dz x_hat), sum(dz) -> OUT_A = mean(g x_hat), OUT_B = mean(g)."""
    i_ng = tl.program_id(0).to(tl.int64)
    i_n = i_ng // num_groups
    c_first = (i_ng % num_groups) * CPG
    o_j = tl.arange(0, BLOCK_CPG)                                             # [BLOCK_CPG]
    m_j = o_j < CPG
    PA += i_n * n_chunks * C + c_first
    PB += i_n * n_chunks * C + c_first
    if FORWARD:
        # two passes over the partials (L2-resident, K x CPG values): the mean, then the deviations
        tot = tl.zeros([BLOCK_K, BLOCK_CPG], dtype=tl.float32)
        for k0 in range(0, n_chunks, BLOCK_K):
            o_k = k0 + tl.arange(0, BLOCK_K)                                  # [BLOCK_K]
            mask = (o_k < n_chunks)[:, None] & m_j[None, :]
            cnt = tl.minimum(tl.maximum(HW - o_k * chunk_hw, 0), chunk_hw).to(tl.float32)
            mean_k = tl.load(PA + o_k[:, None] * C + o_j[None, :], mask=mask, other=0.0)
            tot += cnt[:, None] * mean_k
        dmu = tl.sum(tl.sum(tot, axis=1), axis=0) / group_size
        m2 = tl.zeros([BLOCK_K, BLOCK_CPG], dtype=tl.float32)
        for k0 in range(0, n_chunks, BLOCK_K):
            o_k = k0 + tl.arange(0, BLOCK_K)
            mask = (o_k < n_chunks)[:, None] & m_j[None, :]
            cnt = tl.minimum(tl.maximum(HW - o_k * chunk_hw, 0), chunk_hw).to(tl.float32)
            p = o_k[:, None] * C + o_j[None, :]
            dev = tl.load(PA + p, mask=mask, other=0.0) - dmu
            m2 += tl.where(mask, tl.load(PB + p, mask=mask, other=0.0) + cnt[:, None] * dev * dev, 0.0)
        o_g = c_first + tl.zeros([1], dtype=tl.int64)                         # [1]
        shift = _load_s(X + i_n * stride_x_n, R + i_n * stride_r_n, o_g, o_g * 0, o_g >= 0, o_g[:, None] >= 0,
                        stride_x_c, 0, stride_r_c, 0, HAS_RESIDUAL)           # [1, 1]: K_g
        tl.store(OUT_A + i_ng + tl.zeros([1], dtype=tl.int64), tl.sum(shift, axis=1) + dmu)
        tl.store(OUT_B + i_ng, tl.math.rsqrt(tl.sum(tl.sum(m2, axis=1), axis=0) / group_size + eps))
    else:
        if HAS_WEIGHT:
            w = tl.load(W + c_first + o_j, mask=m_j, other=0.0).to(tl.float32)
        else:
            w = tl.full([BLOCK_CPG], 1.0, tl.float32)
        sum_gx = tl.zeros([BLOCK_K, BLOCK_CPG], dtype=tl.float32)
        sum_g = tl.zeros([BLOCK_K, BLOCK_CPG], dtype=tl.float32)
        for k0 in range(0, n_chunks, BLOCK_K):
            o_k = k0 + tl.arange(0, BLOCK_K)
            mask = (o_k < n_chunks)[:, None] & m_j[None, :]
            p = o_k[:, None] * C + o_j[None, :]
            sum_gx += tl.load(PA + p, mask=mask, other=0.0) * w[None, :]
            sum_g += tl.load(PB + p, mask=mask, other=0.0) * w[None, :]
        tl.store(OUT_A + i_ng, tl.sum(tl.sum(sum_gx, axis=1), axis=0) / group_size)
        tl.store(OUT_B + i_ng, tl.sum(tl.sum(sum_g, axis=1), axis=0) / group_size)


@triton.jit
def _per_channel(STAT, i_n, o_c, m_c, CPG, num_groups):
    """A per-(n, g) statistic gathered per channel: STAT[n, c // CPG] as [BLOCK_C, 1] (32 floats, L1)."""
    return tl.load(STAT + i_n * num_groups + o_c // CPG, mask=m_c, other=0.0)[:, None]


@triton.jit
def _chunked_fwd_apply_kernel(
    X, R, W, B, Y, MEAN, RSTD,
    # X, R, Y: (N, C, HW) by strides; W, B: [C]; MEAN, RSTD: [N, G] fp32
    C, HW, CPG, num_groups, chunk_hw,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_y_n, stride_y_c, stride_y_hw,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr, REVERSE: tl.constexpr,
    EVICT: tl.constexpr,
):
    """Kernel 3 forward: y = act((s - mu) rstd w + b) over the slab (tiles backwards when REVERSE: the
    ones kernel 1 read last first, see _tile_start; loads and stores with L2 eviction policy EVICT)."""
    i_n, i_k, o_c, m_c, hw_start, hw_end = _slab(C, HW, chunk_hw, BLOCK_C)
    X += i_n * stride_x_n
    R += i_n * stride_r_n
    Y += i_n * stride_y_n
    mean = _per_channel(MEAN, i_n, o_c, m_c, CPG, num_groups)                 # [BLOCK_C, 1]
    rstd = _per_channel(RSTD, i_n, o_c, m_c, CPG, num_groups)
    w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)                 # [BLOCK_C]
    n_t = tl.cdiv(hw_end - hw_start, BLOCK_HW)
    for i_t in tl.range(0, n_t, num_stages=STAGES):
        o_hw = _tile_start(hw_start, i_t, n_t, BLOCK_HW, REVERSE) + tl.arange(0, BLOCK_HW)   # [BLOCK_HW]
        mask = m_c[:, None] & (o_hw < hw_end)[None, :]
        s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL,
                    EVICT)
        _normalize_store(s, mean, rstd, w, b, Y, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                         HAS_WEIGHT, HAS_BIAS, ACTIVATION, EVICT)


@triton.jit
def _chunked_bwd_sums_kernel(
    X, R, DY, W, B, MEAN, RSTD, DW_PART, DB_PART,
    # X, R, DY: (N, C, HW) by strides; MEAN, RSTD: [N, G]; DW_PART, DB_PART: [N, n_chunks, C] fp32 (out)
    C, HW, CPG, num_groups, chunk_hw, n_chunks,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr,
):
    """Kernel 1 backward: per channel sum(dz x_hat) and sum(dz) over the slab's pixels."""
    i_n, i_k, o_c, m_c, hw_start, hw_end = _slab(C, HW, chunk_hw, BLOCK_C)
    X += i_n * stride_x_n
    R += i_n * stride_r_n
    DY += i_n * stride_dy_n
    mean = _per_channel(MEAN, i_n, o_c, m_c, CPG, num_groups)                 # [BLOCK_C, 1]
    rstd = _per_channel(RSTD, i_n, o_c, m_c, CPG, num_groups)
    w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
    acc_dz = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc_dzx = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    for h0 in tl.range(hw_start, hw_end, BLOCK_HW, num_stages=STAGES):
        o_hw = h0 + tl.arange(0, BLOCK_HW)                                    # [BLOCK_HW]
        mask = m_c[:, None] & (o_hw < hw_end)[None, :]
        s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
        dy = tl.load(DY + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask, other=0.0)
        x_hat, dz, _g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
        acc_dz += dz                                    # 0 outside the mask (dy loads 0 there)
        acc_dzx += dz * x_hat
    o_part = (i_n * n_chunks + i_k) * C + o_c
    tl.store(DW_PART + o_part, tl.sum(acc_dzx, axis=1), mask=m_c)
    tl.store(DB_PART + o_part, tl.sum(acc_dz, axis=1), mask=m_c)


@triton.jit
def _chunked_bwd_dx_kernel(
    X, R, DY, W, B, MEAN, RSTD, C1, C2, DX, DRES_PART,
    # X, R, DY, DX: (N, C, HW) by strides; MEAN, RSTD, C1, C2: [N, G] fp32; DRES_PART: [N, n_chunks, C] (out)
    C, HW, CPG, num_groups, chunk_hw, n_chunks,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw, stride_dx_n, stride_dx_c, stride_dx_hw,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    HAS_DRES: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, STAGES: tl.constexpr,
    REVERSE: tl.constexpr, EVICT: tl.constexpr,
):
    """Kernel 3 backward: dx = rstd (g - c2 - x_hat c1) over the slab, and (HAS_DRES) its per-channel sum
    (REVERSE, EVICT as in the forward's kernel 3)."""
    i_n, i_k, o_c, m_c, hw_start, hw_end = _slab(C, HW, chunk_hw, BLOCK_C)
    X += i_n * stride_x_n
    R += i_n * stride_r_n
    DY += i_n * stride_dy_n
    DX += i_n * stride_dx_n
    mean = _per_channel(MEAN, i_n, o_c, m_c, CPG, num_groups)                 # [BLOCK_C, 1]
    rstd = _per_channel(RSTD, i_n, o_c, m_c, CPG, num_groups)
    c1 = _per_channel(C1, i_n, o_c, m_c, CPG, num_groups)
    c2 = _per_channel(C2, i_n, o_c, m_c, CPG, num_groups)
    w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
    acc = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    n_t = tl.cdiv(hw_end - hw_start, BLOCK_HW)
    for i_t in tl.range(0, n_t, num_stages=STAGES):
        o_hw = _tile_start(hw_start, i_t, n_t, BLOCK_HW, REVERSE) + tl.arange(0, BLOCK_HW)   # [BLOCK_HW]
        mask = m_c[:, None] & (o_hw < hw_end)[None, :]
        s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL,
                    EVICT)
        dy = tl.load(DY + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask, other=0.0,
                     eviction_policy=EVICT)
        x_hat, _dz, g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
        dx = (g - c2 - x_hat * c1) * rstd
        tl.store(DX + o_c[:, None] * stride_dx_c + o_hw[None, :] * stride_dx_hw, dx.to(DX.dtype.element_ty),
                 mask=mask, eviction_policy=EVICT)
        if HAS_DRES:
            acc += tl.where(mask, dx, 0.0)
    if HAS_DRES:
        tl.store(DRES_PART + (i_n * n_chunks + i_k) * C + o_c, tl.sum(acc, axis=1), mask=m_c)
