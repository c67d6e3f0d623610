"""The Triton kernels of ``flashfuse.ops.group_norm`` (GroupNorm fused with a residual add and an activation).

x: (N, C, *spatial) seen as (N, C, HW) through three strides (stride_n, stride_c, stride_hw): NCHW
contiguous (stride_hw = 1, a group is one contiguous run of C/G * HW elements), channels_last (stride_c = 1,
stride_hw = C: a group is C/G contiguous channels per pixel) and (N, C, L) alike, with no layout copy. The
residual is read through its own strides after broadcasting (the (N, C, 1, 1) time embedding has
stride_hw = 0). Group (n, g) holds channels [g * CPG, (g + 1) * CPG), CPG = C / G, over all HW pixels:
M = CPG * HW elements.

Forward, per group (statistics in fp32; s rounded to x's dtype like torch's add):

    s = x + residual                      (s = x without a residual)
    mu = mean(s),  rstd = 1 / sqrt(mean((s - mu)^2) + eps)        (biased variance over the M elements)
    z = (s - mu) * rstd * w_c + b_c,       y = act(z)             (act: identity, silu, mish or exact gelu)

Variance without cancellation: every tile of the group gives (count n_b, mean mu_b, m2_b = sum of squared
deviations), merged by Chan's pairwise update (delta = mu_b - mu, mu += delta n_b / n, m2 += m2_b +
delta^2 n_a n_b / n); split chunks merge their (mu_k, m2_k) the same way, all at once:
mu = sum_k n_k mu_k / M, m2 = sum_k m2_k + sum_k n_k (mu_k - mu)^2.

Backward (VJP), with x_hat = (s - mu) * rstd recomputed from s and the saved mu, rstd:

    dz = dy * act'(z)                     (z recomputed from x_hat)
    g = dz * w_c
    ds = rstd * (g - mean(g) - x_hat * mean(g * x_hat))           (means over the group's M elements)
    dx = ds,   dresidual = ds summed over the residual's broadcast dims
    dw_c = sum over (n, hw) of dz * x_hat,   db_c = sum over (n, hw) of dz

(d rstd / d s_i = -rstd^3 (s_i - mu) / M and d mu / d s_i = 1 / M give the two mean terms.) Two sums per
group, sum(g) and sum(g * x_hat), come before ds: a group held in registers (ONE_TILE) needs one read of
s and dy, a larger group a first pass for the sums. dw / db / the residual's per-channel sums are written
as fp32 partials per (sample, chunk, channel) and summed per channel afterwards by _channel_sums_kernel (end of this
file), in a fixed order: deterministic, no atomics.

Modes (a constexpr; the launcher picks one, see ``group_norm.py``):
    ONE_TILE  the whole group is one [BLOCK_C, BLOCK_HW] tile in registers: one read, one write.
    LOOP      one program per group loops over it twice (statistics / sums, then normalize / dx); the
              second pass re-reads what this program has just read, mostly from L2.
    SPLIT     too few groups to fill the GPU: K programs per group, each on a chunk of HW. A stats kernel
              writes per-chunk partials, the main kernel combines the K partials of its group (tiny) and
              normalizes its chunk.
"""

import triton
import triton.language as tl

from ..glu import GELU as GLU_GELU
from ..glu import SILU as GLU_SILU
from ..glu import _activation, _exp2, _rcp

ONE_TILE: tl.constexpr = tl.constexpr(0)
LOOP: tl.constexpr = tl.constexpr(1)
SPLIT: tl.constexpr = tl.constexpr(2)

# Residual codes (HAS_RESIDUAL): none, read through its strides, one value per channel (stride_hw = 0).
RES_NONE: tl.constexpr = tl.constexpr(0)
RES_STRIDED: tl.constexpr = tl.constexpr(1)
RES_PER_CHANNEL: tl.constexpr = tl.constexpr(2)

# Activation codes (ints: string constexpr defaults fail to compile on triton 3.6).
ACT_NONE: tl.constexpr = tl.constexpr(0)
ACT_SILU: tl.constexpr = tl.constexpr(1)
ACT_MISH: tl.constexpr = tl.constexpr(2)
ACT_GELU: tl.constexpr = tl.constexpr(3)

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
# Mish: tanh(softplus(z)) = n / (n + 2), n = e (e + 2), e = exp(z). Above z = 20 it is 1 in fp32 (1 - t is
# ~8e-18) and e is clamped there so that (n + 2)^2 (~5.5e34 at z = 20) stays finite in fp32.
MISH_CLAMP: tl.constexpr = tl.constexpr(20.0)


@triton.jit
def _act(z, BACKWARD: tl.constexpr, ACTIVATION: tl.constexpr):
    """act(z), and act'(z) when BACKWARD (else 0), fp32. silu and exact gelu are glu.py's (one MUFU exp, a
    branch-free erfc); mish:

        mish(z)  = z t,   t = tanh(softplus(z)) = n / (n + 2),   n = e (e + 2),  e = exp(z)
        mish'(z) = t + z (1 - t^2) sigmoid(z) = t + z * 4 e (e + 1) / (n + 2)^2
    """
    if ACTIVATION == ACT_SILU:
        act, act_grad = _activation(z, BACKWARD, GLU_SILU)
    elif ACTIVATION == ACT_GELU:
        act, act_grad = _activation(z, BACKWARD, GLU_GELU)
    else:
        e = _exp2(tl.minimum(z, MISH_CLAMP) * LOG2E)
        n = e * (e + 2.0)
        r = _rcp(n + 2.0)
        t = n * r
        act = z * t
        act_grad = 0.0
        if BACKWARD:
            act_grad = tl.where(z > MISH_CLAMP, 1.0, t + z * (4.0 * e * (e + 1.0)) * r * r)
    return act, act_grad


@triton.jit
def _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
            HAS_RESIDUAL: tl.constexpr, EVICT: tl.constexpr = tl.constexpr("")):
    """s = x (+ residual, rounded to x's dtype) as fp32, 0 outside the mask. [BLOCK_C, BLOCK_HW]
    m_c: [BLOCK_C] the valid channels, mask: [BLOCK_C, BLOCK_HW] the valid elements. HAS_RESIDUAL: RES_NONE,
    RES_STRIDED (read through its strides) or RES_PER_CHANNEL (stride_r_hw = 0, the (N, C, 1, 1) time
    embedding: one value per channel, loaded as [BLOCK_C, 1] and broadcast; read through a runtime zero
    stride it would be gathered per element, without vector loads). EVICT: the L2 eviction policy of the
    loads of x and of a strided residual ("evict_first" on a last read)."""
    s = tl.load(X + o_c[:, None] * stride_x_c + o_hw[None, :] * stride_x_hw, mask=mask, other=0.0,
                eviction_policy=EVICT)
    if HAS_RESIDUAL == RES_PER_CHANNEL:
        r = tl.load(R + o_c[:, None] * stride_r_c, mask=m_c[:, None], other=0.0)        # [BLOCK_C, 1]
        s = tl.where(mask, (s.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty), 0.0)
    elif HAS_RESIDUAL == RES_STRIDED:
        r = tl.load(R + o_c[:, None] * stride_r_c + o_hw[None, :] * stride_r_hw, mask=mask, other=0.0,
                    eviction_policy=EVICT)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
    return s.to(tl.float32)


@triton.jit
def _load_affine(W, B, o_c, m_c, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """w_c, b_c as fp32 [BLOCK_C] (1 and 0 when absent)."""
    if HAS_WEIGHT:
        w = tl.load(W + o_c, mask=m_c, other=0.0).to(tl.float32)
    else:
        w = tl.full(o_c.shape, 1.0, tl.float32)
    if HAS_BIAS:
        b = tl.load(B + o_c, mask=m_c, other=0.0).to(tl.float32)
    else:
        b = tl.zeros(o_c.shape, dtype=tl.float32)
    return w, b


@triton.jit
def _tile_start(start, i, n_tiles, BLOCK: tl.constexpr, REVERSE: tl.constexpr):
    """First index of tile i of n_tiles tiles of BLOCK from start, walked backwards when REVERSE.

    The second pass over x (normalize, dx) walks its tiles in the reverse order of the first (statistics)
    pass: the tiles the first pass read last are still in L2, so the second pass takes them before the
    writes and its own reads push them out (an 84 MB activation does not fit the 50 MB L2 of an H100/H200)."""
    if REVERSE:
        return start + (n_tiles - 1 - i) * BLOCK
    return start + i * BLOCK


@triton.jit
def _normalize_store(s, mean, rstd, w, b, Y, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                     HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                     EVICT: tl.constexpr = tl.constexpr("")):
    """y = act((s - mu) * rstd * w + b) for one [BLOCK_C, BLOCK_HW] tile, stored in Y's dtype."""
    z = (s - mean) * rstd
    if HAS_WEIGHT:
        z = z * w[:, None]
    if HAS_BIAS:
        z = z + b[:, None]
    if ACTIVATION != ACT_NONE:
        z, _ = _act(z, False, ACTIVATION)
    tl.store(Y + o_c[:, None] * stride_y_c + o_hw[None, :] * stride_y_hw, z.to(Y.dtype.element_ty), mask=mask,
             eviction_policy=EVICT)


@triton.jit
def _chunk_stats(X, R, CPG, hw_start, hw_end, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                 HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """(mean, m2 = sum of squared deviations) of s over channels [0, CPG) x pixels [hw_start, hw_end).

    Shifted sums, accumulated per lane: with K the mean of the first tile (it removes any common offset,
    so the squares do not cancel), every lane adds d = s - K and d^2 to its own registers; one block
    reduction at the end gives sum(d), sum(d^2), then mean = K + sum(d) / n and m2 = sum(d^2) - sum(d)^2 / n.
    A reduction per tile (a cross-warp barrier every BLOCK_C x BLOCK_HW elements) would stall the loads
    of the next tile behind it."""
    o_c = tl.arange(0, BLOCK_C)                                               # [BLOCK_C]
    m_c = o_c < CPG
    o_hw = hw_start + tl.arange(0, BLOCK_HW)                                  # [BLOCK_HW]
    mask = m_c[:, None] & (o_hw < hw_end)[None, :]
    s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
    n_first = (tl.minimum(CPG, BLOCK_C) * tl.minimum(hw_end - hw_start, BLOCK_HW)).to(tl.float32)
    shift = tl.sum(tl.sum(s, axis=1), axis=0) / n_first
    acc = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
    for c0 in range(0, CPG, BLOCK_C):
        o_c = c0 + tl.arange(0, BLOCK_C)                                      # [BLOCK_C]
        m_c = o_c < CPG
        for h0 in range(hw_start, hw_end, BLOCK_HW):
            o_hw = h0 + tl.arange(0, BLOCK_HW)                                # [BLOCK_HW]
            mask = m_c[:, None] & (o_hw < hw_end)[None, :]
            s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
            d = tl.where(mask, s - shift, 0.0)
            acc += d
            acc2 += d * d
    count = (CPG * (hw_end - hw_start)).to(tl.float32)
    sum_d = tl.sum(tl.sum(acc, axis=1), axis=0)
    m2 = tl.maximum(tl.sum(tl.sum(acc2, axis=1), axis=0) - sum_d * (sum_d / count), 0.0)
    return shift + sum_d / count, m2


@triton.jit
def _group_norm_fwd_stats_kernel(
    X, R, PART,          # X, R: (N, C, HW) by strides; PART: [N * G, n_chunks, 2] fp32 (mean, m2) (out)
    HW, CPG, num_groups, chunk_hw, n_chunks,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    HAS_RESIDUAL: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):
    """SPLIT only: program (n * G + g, k) writes the (mean, m2) of its chunk of pixels."""
    i_ng = tl.program_id(0).to(tl.int64)
    i_k = tl.program_id(1)
    i_n = i_ng // num_groups
    c_first = (i_ng % num_groups) * CPG
    X += i_n * stride_x_n + c_first * stride_x_c
    R += i_n * stride_r_n + c_first * stride_r_c
    hw_start = i_k * chunk_hw
    hw_end = tl.minimum(hw_start + chunk_hw, HW)
    mean, m2 = _chunk_stats(X, R, CPG, hw_start, hw_end, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL, BLOCK_C, BLOCK_HW)
    p = PART + (i_ng * n_chunks + i_k) * 2
    tl.store(p, mean)
    tl.store(p + 1, m2)


@triton.jit
def _group_norm_fwd_kernel(
    X, R, W, B, Y, PART, MEAN, RSTD,
    # X, R, Y: (N, C, HW) by strides; W, B: [C]; PART: [N * G, n_chunks, 2] fp32 (SPLIT);
    # MEAN, RSTD: [N * G] fp32 (out)
    HW, CPG, num_groups, chunk_hw, n_chunks, group_size,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_y_n, stride_y_c, stride_y_hw,
    eps,
    MODE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_K: tl.constexpr,
    REVERSE: tl.constexpr, EVICT: tl.constexpr,
):
    """Program (n * G + g, k) normalizes chunk k of group (n, g) (the whole group unless SPLIT); LOOP's
    second pass walks the tiles backwards (REVERSE, see _tile_start) with L2 eviction policy EVICT."""
    i_ng = tl.program_id(0).to(tl.int64)
    i_k = tl.program_id(1)
    i_n = i_ng // num_groups
    c_first = (i_ng % num_groups) * CPG
    X += i_n * stride_x_n + c_first * stride_x_c
    R += i_n * stride_r_n + c_first * stride_r_c
    Y += i_n * stride_y_n + c_first * stride_y_c
    W += c_first
    B += c_first
    if MODE == ONE_TILE:
        o_c = tl.arange(0, BLOCK_C)                                           # [BLOCK_C]
        m_c = o_c < CPG
        o_hw = tl.arange(0, BLOCK_HW)                                         # [BLOCK_HW]
        mask = m_c[:, None] & (o_hw < HW)[None, :]
        s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
        mean = tl.sum(tl.sum(s, axis=1), axis=0) / group_size
        d = tl.where(mask, s - mean, 0.0)
        rstd = tl.math.rsqrt(tl.sum(tl.sum(d * d, axis=1), axis=0) / group_size + eps)
        w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
        _normalize_store(s, mean, rstd, w, b, Y, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                         HAS_WEIGHT, HAS_BIAS, ACTIVATION)
    else:
        if MODE == LOOP:
            mean, m2 = _chunk_stats(X, R, CPG, 0, HW, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                                    HAS_RESIDUAL, BLOCK_C, BLOCK_HW)
        else:
            o_k = tl.arange(0, BLOCK_K)                                       # [BLOCK_K]
            m_k = o_k < n_chunks
            p = PART + (i_ng * n_chunks + o_k) * 2
            mean_k = tl.load(p, mask=m_k, other=0.0)
            m2_k = tl.load(p + 1, mask=m_k, other=0.0)
            n_k = (tl.minimum(tl.maximum(HW - o_k * chunk_hw, 0), chunk_hw) * CPG).to(tl.float32)
            mean = tl.sum(n_k * mean_k, axis=0) / group_size
            d_k = mean_k - mean
            m2 = tl.sum(m2_k, axis=0) + tl.sum(n_k * d_k * d_k, axis=0)
        rstd = tl.math.rsqrt(m2 / group_size + eps)
        hw_start = i_k * chunk_hw
        hw_end = tl.minimum(hw_start + chunk_hw, HW)
        n_cb = tl.cdiv(CPG, BLOCK_C)
        n_t = tl.cdiv(hw_end - hw_start, BLOCK_HW)
        for i_c in range(0, n_cb):
            o_c = _tile_start(0, i_c, n_cb, BLOCK_C, REVERSE) + tl.arange(0, BLOCK_C)
            m_c = o_c < CPG
            w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
            for i_t in range(0, n_t):
                o_hw = _tile_start(hw_start, i_t, n_t, BLOCK_HW, REVERSE) + tl.arange(0, BLOCK_HW)
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL, EVICT)
                _normalize_store(s, mean, rstd, w, b, Y, o_c, o_hw, mask, stride_y_c, stride_y_hw,
                                 HAS_WEIGHT, HAS_BIAS, ACTIVATION, EVICT)
    if i_k == 0:
        tl.store(MEAN + i_ng, mean)
        tl.store(RSTD + i_ng, rstd)


@triton.jit
def _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
               ACTIVATION: tl.constexpr):
    """x_hat, dz = dy * act'(z), g = dz * w for one tile (fp32 [BLOCK_C, BLOCK_HW], 0 outside the mask)."""
    x_hat = tl.where(mask, (s - mean) * rstd, 0.0)
    dz = dy.to(tl.float32)
    if ACTIVATION != ACT_NONE:
        z = x_hat
        if HAS_WEIGHT:
            z = z * w[:, None]
        if HAS_BIAS:
            z = z + b[:, None]
        _, act_grad = _act(z, True, ACTIVATION)
        dz = tl.where(mask, dz * act_grad, 0.0)
    g = dz * w[:, None] if HAS_WEIGHT else dz
    return x_hat, dz, g


@triton.jit
def _chunk_grad_sums(X, R, DY, W, B, DW_PART, DB_PART, mean, rstd, CPG, hw_start, hw_end,
                     stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, stride_dy_c, stride_dy_hw,
                     HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                     ACTIVATION: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                     BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    """(sum(g), sum(g * x_hat)) over channels [0, CPG) x pixels [hw_start, hw_end); stores the per-channel
    partials sum(dz * x_hat), sum(dz) of this chunk to DW_PART / DB_PART (offset to the chunk's row).
    Two sums per lane, dz and dz * x_hat, reduced once per channel block (no cross-warp reduction inside
    the pixel loop, see _chunk_stats); the group sums follow from them since g = dz * w_c:
    sum(g) = sum_c w_c sum(dz)_c and sum(g * x_hat) = sum_c w_c sum(dz * x_hat)_c."""
    sum_g = 0.0
    sum_gx = 0.0
    for c0 in range(0, CPG, BLOCK_C):
        o_c = c0 + tl.arange(0, BLOCK_C)                                      # [BLOCK_C]
        m_c = o_c < CPG
        w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
        acc_dz = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        acc_dzx = tl.zeros([BLOCK_C, BLOCK_HW], dtype=tl.float32)
        for h0 in range(hw_start, hw_end, BLOCK_HW):
            o_hw = h0 + tl.arange(0, BLOCK_HW)                                # [BLOCK_HW]
            mask = m_c[:, None] & (o_hw < hw_end)[None, :]
            s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
            dy = tl.load(DY + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask, other=0.0)
            x_hat, dz, _g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
            acc_dz += dz
            acc_dzx += dz * x_hat
        db = tl.sum(acc_dz, axis=1)                                           # [BLOCK_C]
        dw = tl.sum(acc_dzx, axis=1)
        if COMPUTE_DW:
            tl.store(DW_PART + o_c, dw, mask=m_c)
        if COMPUTE_DB:
            tl.store(DB_PART + o_c, db, mask=m_c)
        if HAS_WEIGHT:
            db = db * w
            dw = dw * w
        sum_g += tl.sum(db, axis=0)
        sum_gx += tl.sum(dw, axis=0)
    return sum_g, sum_gx


@triton.jit
def _group_norm_bwd_sums_kernel(
    X, R, DY, W, B, MEAN, RSTD, SUMS, DW_PART, DB_PART,
    # SUMS: [N * G, n_chunks, 2] fp32 (sum g, sum g x_hat) (out); DW_PART, DB_PART: [N, n_chunks, C] (out)
    C, HW, CPG, num_groups, chunk_hw, n_chunks,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr,
):
    """SPLIT only: program (n * G + g, k) writes its chunk's two sums and per-channel dw / db partials."""
    i_ng = tl.program_id(0).to(tl.int64)
    i_k = tl.program_id(1)
    i_n = i_ng // num_groups
    c_first = (i_ng % num_groups) * CPG
    mean = tl.load(MEAN + i_ng)
    rstd = tl.load(RSTD + i_ng)
    o_part = (i_n * n_chunks + i_k) * C + c_first
    hw_start = i_k * chunk_hw
    hw_end = tl.minimum(hw_start + chunk_hw, HW)
    sum_g, sum_gx = _chunk_grad_sums(
        X + i_n * stride_x_n + c_first * stride_x_c, R + i_n * stride_r_n + c_first * stride_r_c,
        DY + i_n * stride_dy_n + c_first * stride_dy_c, W + c_first, B + c_first,
        DW_PART + o_part, DB_PART + o_part, mean, rstd, CPG, hw_start, hw_end,
        stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, stride_dy_c, stride_dy_hw,
        HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, COMPUTE_DW, COMPUTE_DB, BLOCK_C, BLOCK_HW)
    p = SUMS + (i_ng * n_chunks + i_k) * 2
    tl.store(p, sum_g)
    tl.store(p + 1, sum_gx)


@triton.jit
def _group_norm_bwd_kernel(
    X, R, DY, W, B, MEAN, RSTD, SUMS, DX, DW_PART, DB_PART, DRES_PART,
    # X, R, DY, DX: (N, C, HW) by strides; W, B: [C]; MEAN, RSTD: [N * G]; SUMS: [N * G, n_chunks, 2]
    # (SPLIT); DW_PART, DB_PART, DRES_PART: [N, n_chunks, C] fp32 (out)
    C, HW, CPG, num_groups, chunk_hw, n_chunks, group_size,
    stride_x_n, stride_x_c, stride_x_hw, stride_r_n, stride_r_c, stride_r_hw,
    stride_dy_n, stride_dy_c, stride_dy_hw, stride_dx_n, stride_dx_c, stride_dx_hw,
    MODE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, HAS_DRES: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCK_K: tl.constexpr, REVERSE: tl.constexpr,
    EVICT: tl.constexpr,
):
    """Program (n * G + g, k) writes dx of chunk k of group (n, g) (the whole group unless SPLIT), its
    per-channel sum of dx over the chunk's pixels (HAS_DRES: a residual broadcast over HW) and, unless SPLIT
    (where the sums kernel does it), the per-channel dw / db partials."""
    i_ng = tl.program_id(0).to(tl.int64)
    i_k = tl.program_id(1)
    i_n = i_ng // num_groups
    c_first = (i_ng % num_groups) * CPG
    X += i_n * stride_x_n + c_first * stride_x_c
    R += i_n * stride_r_n + c_first * stride_r_c
    DY += i_n * stride_dy_n + c_first * stride_dy_c
    DX += i_n * stride_dx_n + c_first * stride_dx_c
    W += c_first
    B += c_first
    o_part = (i_n * n_chunks + i_k) * C + c_first
    DW_PART += o_part
    DB_PART += o_part
    DRES_PART += o_part
    mean = tl.load(MEAN + i_ng)
    rstd = tl.load(RSTD + i_ng)
    if MODE == ONE_TILE:
        o_c = tl.arange(0, BLOCK_C)                                           # [BLOCK_C]
        m_c = o_c < CPG
        o_hw = tl.arange(0, BLOCK_HW)                                         # [BLOCK_HW]
        mask = m_c[:, None] & (o_hw < HW)[None, :]
        s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, HAS_RESIDUAL)
        dy = tl.load(DY + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask, other=0.0)
        w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
        x_hat, dz, g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
        c1 = tl.sum(tl.sum(g * x_hat, axis=1), axis=0) / group_size          # mean(g x_hat)
        c2 = tl.sum(tl.sum(g, axis=1), axis=0) / group_size                  # mean(g)
        dx = (g - c2 - x_hat * c1) * rstd
        tl.store(DX + o_c[:, None] * stride_dx_c + o_hw[None, :] * stride_dx_hw, dx.to(DX.dtype.element_ty),
                 mask=mask)
        if COMPUTE_DW:
            tl.store(DW_PART + o_c, tl.sum(dz * x_hat, axis=1), mask=m_c)
        if COMPUTE_DB:
            tl.store(DB_PART + o_c, tl.sum(dz, axis=1), mask=m_c)
        if HAS_DRES:
            tl.store(DRES_PART + o_c, tl.sum(tl.where(mask, dx, 0.0), axis=1), mask=m_c)
    else:
        if MODE == LOOP:
            sum_g, sum_gx = _chunk_grad_sums(
                X, R, DY, W, B, DW_PART, DB_PART, mean, rstd, CPG, 0, HW,
                stride_x_c, stride_x_hw, stride_r_c, stride_r_hw, stride_dy_c, stride_dy_hw,
                HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, COMPUTE_DW, COMPUTE_DB, BLOCK_C, BLOCK_HW)
        else:
            o_k = tl.arange(0, BLOCK_K)                                       # [BLOCK_K]
            m_k = o_k < n_chunks
            p = SUMS + (i_ng * n_chunks + o_k) * 2
            sum_g = tl.sum(tl.load(p, mask=m_k, other=0.0), axis=0)
            sum_gx = tl.sum(tl.load(p + 1, mask=m_k, other=0.0), axis=0)
        c1 = sum_gx / group_size
        c2 = sum_g / group_size
        hw_start = i_k * chunk_hw
        hw_end = tl.minimum(hw_start + chunk_hw, HW)
        n_cb = tl.cdiv(CPG, BLOCK_C)
        n_t = tl.cdiv(hw_end - hw_start, BLOCK_HW)
        for i_c in range(0, n_cb):
            o_c = _tile_start(0, i_c, n_cb, BLOCK_C, REVERSE) + tl.arange(0, BLOCK_C)
            m_c = o_c < CPG
            w, b = _load_affine(W, B, o_c, m_c, HAS_WEIGHT, HAS_BIAS)
            dres = tl.zeros([BLOCK_C], dtype=tl.float32)
            for i_t in range(0, n_t):
                o_hw = _tile_start(hw_start, i_t, n_t, BLOCK_HW, REVERSE) + tl.arange(0, BLOCK_HW)
                mask = m_c[:, None] & (o_hw < hw_end)[None, :]
                s = _load_s(X, R, o_c, o_hw, m_c, mask, stride_x_c, stride_x_hw, stride_r_c, stride_r_hw,
                            HAS_RESIDUAL, EVICT)
                dy = tl.load(DY + o_c[:, None] * stride_dy_c + o_hw[None, :] * stride_dy_hw, mask=mask,
                             other=0.0, eviction_policy=EVICT)
                x_hat, dz, g = _grad_tile(s, dy, mean, rstd, w, b, mask, HAS_WEIGHT, HAS_BIAS, ACTIVATION)
                dx = (g - c2 - x_hat * c1) * rstd
                tl.store(DX + o_c[:, None] * stride_dx_c + o_hw[None, :] * stride_dx_hw,
                         dx.to(DX.dtype.element_ty), mask=mask, eviction_policy=EVICT)
                if HAS_DRES:
                    dres += tl.sum(tl.where(mask, dx, 0.0), axis=1)
            if HAS_DRES:
                tl.store(DRES_PART + o_c, dres, mask=m_c)


@triton.jit
def _channel_sums_kernel(A, B, OUT_A, OUT_B, N, C, R, stride_n, stride_c, stride_r, HAS_B: tl.constexpr,
                         SUM_N: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr):
    """The backward's fp32 partials [N, C, R] (any strides; R: chunks or rows per channel) summed per channel:
    OUT[c] = sum over n < N, r < R of A[n, c, r] (SUM_N), else OUT[n, c] = sum over r < R (sample n =
    program_id(1)), in a fixed order (deterministic) and stored in OUT's dtype; the same for B. Programs over
    channel blocks of BLOCK_C, each step a [BLOCK_N, BLOCK_C, BLOCK_R] tile."""
    o_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)       # [BLOCK_C]
    m_c = o_c < C
    if SUM_N:
        n_lo, n_hi = 0, N
    else:
        n_lo = tl.program_id(1)
        n_hi = n_lo + 1
    acc_a = tl.zeros([BLOCK_C], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_C], dtype=tl.float32)
    for n0 in range(n_lo, n_hi, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)                            # [BLOCK_N]
        for r0 in range(0, R, BLOCK_R):
            o_r = r0 + tl.arange(0, BLOCK_R)                        # [BLOCK_R]
            offs = (o_n[:, None, None] * stride_n + o_c[None, :, None] * stride_c
                    + o_r[None, None, :] * stride_r)                # [BLOCK_N, BLOCK_C, BLOCK_R]
            mask = (o_n < n_hi)[:, None, None] & m_c[None, :, None] & (o_r < R)[None, None, :]
            acc_a += tl.sum(tl.sum(tl.load(A + offs, mask=mask, other=0.0), axis=2), axis=0)
            if HAS_B:
                acc_b += tl.sum(tl.sum(tl.load(B + offs, mask=mask, other=0.0), axis=2), axis=0)
    if SUM_N:
        o_out = o_c
    else:
        o_out = n_lo * C + o_c
    tl.store(OUT_A + o_out, acc_a.to(OUT_A.dtype.element_ty), mask=m_c)
    if HAS_B:
        tl.store(OUT_B + o_out, acc_b.to(OUT_B.dtype.element_ty), mask=m_c)
