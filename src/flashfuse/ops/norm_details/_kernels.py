"""The Triton kernels of ``flashfuse.ops.norm`` (RMSNorm / LayerNorm, optionally fused with the residual add).

One row x of N columns (rows = every leading dim of the input flattened; s = x + residual rounded to
x's dtype, exactly torch's add, when a residual is fused; otherwise s = x):

    RMSNorm:    rstd = 1 / sqrt(mean(s^2) + eps)                 x_hat = s * rstd
    LayerNorm:  mu = mean(s),  rstd = 1 / sqrt(mean((s - mu)^2) + eps),  x_hat = (s - mu) * rstd
    y = x_hat * w' + b,   w' = offset + w   (offset = 1 is Gemma's (1 + weight); w, b optional)

Casting (RMSNorm): "llama" rounds x_hat to x's dtype before the weight multiply (HF Llama, Mistral, Qwen,
Phi-3: ``weight * x_hat.to(input_dtype)``, output dtype promote(x, weight)); "gemma" keeps everything in
fp32 and rounds once at the end (output dtype = x's). LayerNorm computes in fp32, output dtype = x's.

Backward, with g = dy * w' (fp32) and row means over the N columns. For RMSNorm, d rstd / d s_i =
-rstd^3 s_i / N, so dL/ds_i = g_i rstd - sum_j g_j s_j rstd^3 s_i / N:

    RMSNorm:    ds = rstd * (g - x_hat * mean(g * x_hat))
    LayerNorm:  ds = rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (mu's path adds the mean(g) term)
    ds += d(returned sum)   when a residual is fused;   dx = dresidual = ds   (as for torch's add)
    dw = sum over rows of dy * x_hat   (x_hat rounded as in the forward),   db = sum over rows of dy

The backward recomputes x_hat from s and the saved rstd (and mu): the forward saves only s (or x), rstd
and mu. dw/db are deterministic: each backward program sums its rows into registers and writes one fp32
partial row; a second small kernel sums the partial rows (no atomics).
"""

import triton
import triton.language as tl


@triton.jit
def _load_sum(X, R, S, o_m, o_n, mask, stride_x_row, stride_r_row, stride_s_row,
              HAS_RESIDUAL: tl.constexpr):
    """s = x (+ residual, rounded to x's dtype and stored to S) as fp32, 0 outside mask. [BLOCK_M, BLOCK_N]"""
    s = tl.load(X + o_m[:, None] * stride_x_row + o_n[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + o_m[:, None] * stride_r_row + o_n[None, :], mask=mask, other=0.0)
        s = (s.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(S + o_m[:, None] * stride_s_row + o_n[None, :], s, mask=mask)
    return s.to(tl.float32)


@triton.jit
def _chan_merge(mean, m2, s, mask, start, n_cols, BLOCK_N: tl.constexpr):
    """Rows' running (mean, m2) over columns [0, start) merged with the block s [BLOCK_M, BLOCK_N] of columns start..
    (mask: which of them exist): Chan's pairwise update, delta = mean_b - mean, mean += delta n_b / (start + n_b),
    m2 += m2_b + delta^2 start n_b / (start + n_b) (no cancellation, unlike E[s^2] - mu^2). Also the adaptive
    LayerNorm's (modulation_details)."""
    n_b = tl.minimum(n_cols - start, BLOCK_N).to(tl.float32)
    mean_b = tl.sum(s, axis=1) / n_b
    d = tl.where(mask, s - mean_b[:, None], 0.0)
    frac = n_b / (start + n_b)
    delta = mean_b - mean
    return mean + delta * frac, m2 + tl.sum(d * d, axis=1) + delta * delta * start * frac


@triton.jit
def _normalize_store(s, mean, rstd, X, W, B, Y, o_m, o_n, m_n, mask, stride_y_row, offset,
                     IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                     LLAMA_CASTING: tl.constexpr):
    """y = x_hat * (offset + w) + b for one [BLOCK_M, BLOCK_N] block, stored in Y's dtype (X only gives
    the dtype x_hat is rounded to in llama casting)."""
    if IS_RMS:
        x_hat = s * rstd[:, None]
    else:
        x_hat = (s - mean[:, None]) * rstd[:, None]
    if LLAMA_CASTING:
        x_hat = x_hat.to(X.dtype.element_ty).to(tl.float32)
    y = x_hat
    if HAS_WEIGHT:
        w = tl.load(W + o_n, mask=m_n, other=0.0).to(tl.float32) + offset      # [BLOCK_N]
        y = y * w[None, :]
    if HAS_BIAS:
        y = y + tl.load(B + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + o_m[:, None] * stride_y_row + o_n[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_fwd_kernel(
    X, R, W, B, Y, S, MEAN, RSTD,  # X, R, Y, S: [n_rows, n_cols]; W, B: [n_cols]; MEAN, RSTD: [n_rows] fp32
    n_rows, n_cols,
    stride_x_row, stride_r_row, stride_y_row, stride_s_row,
    eps, offset,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    LLAMA_CASTING: tl.constexpr, ONE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program normalizes BLOCK_M rows. ONE_BLOCK (n_cols <= BLOCK_N): one read of each input and one
    write of each output. Otherwise two passes over column blocks: statistics (the residual sum is
    written here), then normalize (reading the sum back)."""
    i_m = tl.program_id(0).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M]
    m_m = o_m < n_rows
    o_n = tl.arange(0, BLOCK_N)                                                # [BLOCK_N]
    if ONE_BLOCK:
        m_n = o_n < n_cols
        mask = m_m[:, None] & m_n[None, :]
        s = _load_sum(X, R, S, o_m, o_n, mask, stride_x_row, stride_r_row, stride_s_row, HAS_RESIDUAL)
        if IS_RMS:
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            var = tl.sum(s * s, axis=1) / n_cols                               # mean square
        else:
            mean = tl.sum(s, axis=1) / n_cols
            d = tl.where(mask, s - mean[:, None], 0.0)
            var = tl.sum(d * d, axis=1) / n_cols
        rstd = tl.math.rsqrt(var + eps)
        _normalize_store(s, mean, rstd, X, W, B, Y, o_m, o_n, m_n, mask, stride_y_row, offset,
                         IS_RMS, HAS_WEIGHT, HAS_BIAS, LLAMA_CASTING)
    else:
        # Pass 1. RMSNorm: m2 = sum of squares. LayerNorm: Chan's pairwise update (_chan_merge) merges each
        # block's (count, mean, sum of squared deviations) into the running (mean, m2).
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            m_n = start + o_n < n_cols
            mask = m_m[:, None] & m_n[None, :]
            s = _load_sum(X, R, S, o_m, start + o_n, mask, stride_x_row, stride_r_row, stride_s_row,
                          HAS_RESIDUAL)
            if IS_RMS:
                m2 += tl.sum(s * s, axis=1)
            else:
                mean, m2 = _chan_merge(mean, m2, s, mask, start, n_cols, BLOCK_N)
        rstd = tl.math.rsqrt(m2 / n_cols + eps)
        if HAS_RESIDUAL:
            # Pass 2 reads the sum back from S; other threads of this program wrote parts of it.
            tl.debug_barrier()
        for start in range(0, n_cols, BLOCK_N):
            m_n = start + o_n < n_cols
            mask = m_m[:, None] & m_n[None, :]
            if HAS_RESIDUAL:
                s = tl.load(S + o_m[:, None] * stride_s_row + (start + o_n)[None, :], mask=mask, other=0.0)
            else:
                s = tl.load(X + o_m[:, None] * stride_x_row + (start + o_n)[None, :], mask=mask, other=0.0)
            _normalize_store(s.to(tl.float32), mean, rstd, X, W, B, Y, o_m, start + o_n, m_n, mask,
                             stride_y_row, offset, IS_RMS, HAS_WEIGHT, HAS_BIAS, LLAMA_CASTING)
    if not IS_RMS:
        tl.store(MEAN + o_m, mean, mask=m_m)
    tl.store(RSTD + o_m, rstd, mask=m_m)


@triton.jit
def _x_hat_g(s, dy, w, MEAN, RSTD, o_m, m_m, mask, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """Recompute x_hat from the loaded s and the saved rstd (and mu); g = dy * (offset + w). fp32
    [BLOCK_M, BLOCK_N], 0 outside the mask; rstd [BLOCK_M]."""
    rstd = tl.load(RSTD + o_m, mask=m_m, other=0.0)
    s = s.to(tl.float32)
    if IS_RMS:
        x_hat = s * rstd[:, None]
    else:
        mean = tl.load(MEAN + o_m, mask=m_m, other=0.0)
        x_hat = tl.where(mask, (s - mean[:, None]) * rstd[:, None], 0.0)
    dy = dy.to(tl.float32)
    g = dy * w[None, :] if HAS_WEIGHT else dy
    return x_hat, g, dy, rstd


@triton.jit
def _load_weight(W, o_n, m_n, offset, HAS_WEIGHT: tl.constexpr):
    """offset + w as fp32 [BLOCK_N] (0 when there is no weight: then it is never used)."""
    if HAS_WEIGHT:
        return tl.load(W + o_n, mask=m_n, other=0.0).to(tl.float32) + offset
    else:
        return tl.zeros(o_n.shape, dtype=tl.float32)


@triton.jit
def _norm_bwd_row_sums_kernel(
    DY, S, W, MEAN, RSTD, ROW_SUMS,  # DY, S: [n_rows, n_cols]; ROW_SUMS: [n_rows, 2] fp32 (out)
    n_rows, n_cols,
    stride_dy_row, stride_s_row,
    offset,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Only for rows wider than one block: mean(g * x_hat) and mean(g) per row, looping over columns."""
    i_m = tl.program_id(0).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M]
    m_m = o_m < n_rows
    o_n = tl.arange(0, BLOCK_N)
    c1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    c2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        m_n = start + o_n < n_cols
        mask = m_m[:, None] & m_n[None, :]
        s = tl.load(S + o_m[:, None] * stride_s_row + (start + o_n)[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + o_m[:, None] * stride_dy_row + (start + o_n)[None, :], mask=mask, other=0.0)
        w = _load_weight(W, start + o_n, m_n, offset, HAS_WEIGHT)
        x_hat, g, dy, rstd = _x_hat_g(s, dy, w, MEAN, RSTD, o_m, m_m, mask, IS_RMS, HAS_WEIGHT)
        c1 += tl.sum(g * x_hat, axis=1)
        c2 += tl.sum(g, axis=1)
    tl.store(ROW_SUMS + 2 * o_m, c1 / n_cols, mask=m_m)
    tl.store(ROW_SUMS + 2 * o_m + 1, c2 / n_cols, mask=m_m)


@triton.jit
def _add_pair(a0, a1, b0, b1):
    """Combine function of a reduction over two tensors at once."""
    return a0 + b0, a1 + b1


@triton.jit
def _norm_bwd_kernel(
    DY, DSUM, S, W, MEAN, RSTD, ROW_SUMS, DX, DW_PART, DB_PART,
    # DY, DSUM, S, DX: [n_rows, n_cols]; W: [n_cols]; MEAN, RSTD: [n_rows]; ROW_SUMS: [n_rows, 2];
    # DW_PART, DB_PART: [num_programs(0), n_cols] fp32 (out)
    n_rows, n_cols, n_programs,
    stride_dy_row, stride_dsum_row, stride_s_row, stride_dx_row,
    offset,
    IS_RMS: tl.constexpr, HAS_DSUM: tl.constexpr, HAS_WEIGHT: tl.constexpr, COMPUTE_DW: tl.constexpr,
    COMPUTE_DB: tl.constexpr, LLAMA_CASTING: tl.constexpr, ONE_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_STAGES: tl.constexpr, REG_PREFETCH: tl.constexpr,
):
    """Program (i_p, i_n) owns a contiguous run of rows (1/n_programs of them) x column block i_n: writes
    their dx and one partial row of dw / db (summed in registers over its rows, written once at the end;
    _norm_param_grad_kernel adds the partial rows). ONE_BLOCK: the row sums are computed here; otherwise
    they come from _norm_bwd_row_sums_kernel (ROW_SUMS)."""
    i_p = tl.program_id(0)
    i_n = tl.program_id(1)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    m_n = o_n < n_cols
    w = _load_weight(W, o_n, m_n, offset, HAS_WEIGHT)                         # [BLOCK_N], loaded once
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    # Balanced runs: program i_p owns row blocks [i_p nb / P, (i_p + 1) nb / P) of the nb blocks.
    n_row_blocks = tl.cdiv(n_rows, BLOCK_M)
    row_start = (i_p.to(tl.int64) * n_row_blocks // n_programs) * BLOCK_M
    row_end = tl.minimum(((i_p.to(tl.int64) + 1) * n_row_blocks // n_programs) * BLOCK_M, n_rows)
    # The loads of later row blocks must be in flight while this one is computed (two programs per SM at
    # 4096 columns, each waiting on one row of s and dy, 16 KB bf16, are too few bytes in flight for HBM).
    # NUM_STAGES > 1: Triton's pipeliner copies the next NUM_STAGES - 1 row blocks into shared memory
    # asynchronously (cp.async; no registers held). REG_PREFETCH: the next row block is loaded into
    # registers by hand before this one is computed (one block ahead, at a register cost).
    o_m = (row_start + tl.arange(0, BLOCK_M)).to(tl.int64)                      # [BLOCK_M]
    if REG_PREFETCH:
        mask = (o_m < row_end)[:, None] & m_n[None, :]
        s_next = tl.load(S + o_m[:, None] * stride_s_row + o_n[None, :], mask=mask, other=0.0)
        dy_next = tl.load(DY + o_m[:, None] * stride_dy_row + o_n[None, :], mask=mask, other=0.0)
    for r0 in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):
        o_m = (r0 + tl.arange(0, BLOCK_M)).to(tl.int64)                        # [BLOCK_M]
        m_m = o_m < row_end
        mask = m_m[:, None] & m_n[None, :]
        if REG_PREFETCH:
            s, dy = s_next, dy_next
            o_next = o_m + BLOCK_M
            m_next = (o_next < row_end)[:, None] & m_n[None, :]
            s_next = tl.load(S + o_next[:, None] * stride_s_row + o_n[None, :], mask=m_next, other=0.0)
            dy_next = tl.load(DY + o_next[:, None] * stride_dy_row + o_n[None, :], mask=m_next, other=0.0)
        else:
            s = tl.load(S + o_m[:, None] * stride_s_row + o_n[None, :], mask=mask, other=0.0)
            dy = tl.load(DY + o_m[:, None] * stride_dy_row + o_n[None, :], mask=mask, other=0.0)
        x_hat, g, dy, rstd = _x_hat_g(s, dy, w, MEAN, RSTD, o_m, m_m, mask, IS_RMS, HAS_WEIGHT)
        if ONE_BLOCK:
            if IS_RMS:
                c1 = tl.sum(g * x_hat, axis=1) / n_cols                        # mean(g x_hat) [BLOCK_M]
                c2 = c1                                                        # unused
            else:
                # Both row sums in one reduction (one exchange through shared memory, not two).
                c1, c2 = tl.reduce((g * x_hat, g), 1, _add_pair)
                c1, c2 = c1 / n_cols, c2 / n_cols                              # mean(g x_hat), mean(g)
        else:
            c1 = tl.load(ROW_SUMS + 2 * o_m, mask=m_m, other=0.0)
            c2 = tl.load(ROW_SUMS + 2 * o_m + 1, mask=m_m, other=0.0)
        dx = g - x_hat * c1[:, None]
        if not IS_RMS:
            dx -= c2[:, None]
        dx *= rstd[:, None]
        if HAS_DSUM:
            dx += tl.load(DSUM + o_m[:, None] * stride_dsum_row + o_n[None, :], mask=mask,
                          other=0.0).to(tl.float32)
        tl.store(DX + o_m[:, None] * stride_dx_row + o_n[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if COMPUTE_DW:
            if LLAMA_CASTING:
                x_hat = x_hat.to(S.dtype.element_ty).to(tl.float32)
            dw += tl.sum(dy * x_hat, axis=0)
        if COMPUTE_DB:
            db += tl.sum(dy, axis=0)
    o_part = i_p.to(tl.int64) * n_cols + o_n
    if COMPUTE_DW:
        tl.store(DW_PART + o_part, dw, mask=m_n)
    if COMPUTE_DB:
        tl.store(DB_PART + o_part, db, mask=m_n)


@triton.jit
def _norm_param_grad_kernel(
    DW_PART, DB_PART, DW, DB,  # DW_PART, DB_PART: [n_parts, n_cols] fp32; DW, DB: [n_cols] (out)
    n_parts, n_cols,
    COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """dw = sum of the backward programs' partial rows (and db), in fp32, stored in the parameter's dtype:
    one launch for both sums and both casts. Program i_n owns BLOCK_N columns and loops over the partial
    rows BLOCK_P at a time, summing per lane and across lanes once at the end."""
    i_n = tl.program_id(0).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    m_n = o_n < n_cols
    acc_w = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in tl.range(0, n_parts, BLOCK_P, num_stages=NUM_STAGES):      # NUM_STAGES - 1 tiles in flight
        o_p = (p0 + tl.arange(0, BLOCK_P)).to(tl.int64)                        # [BLOCK_P]
        mask = (o_p < n_parts)[:, None] & m_n[None, :]
        offs = o_p[:, None] * n_cols + o_n[None, :]                            # [BLOCK_P, BLOCK_N]
        if COMPUTE_DW:
            acc_w += tl.load(DW_PART + offs, mask=mask, other=0.0)
        if COMPUTE_DB:
            acc_b += tl.load(DB_PART + offs, mask=mask, other=0.0)
    if COMPUTE_DW:
        tl.store(DW + o_n, tl.sum(acc_w, axis=0).to(DW.dtype.element_ty), mask=m_n)
    if COMPUTE_DB:
        tl.store(DB + o_n, tl.sum(acc_b, axis=0).to(DB.dtype.element_ty), mask=m_n)
