"""The Triton kernels of ``flashfuse.ops.modulation`` (adaptive LayerNorm, optionally fed by the gated residual
that precedes it, and the gated residual alone).

One row x of D columns, token t of sample b; sc = scale[b], sh = shift[b] (D-vectors):

    mu = mean(x),  rstd = 1 / sqrt(mean((x - mu)^2) + eps),  x_hat = (x - mu) * rstd
    y = x_hat * (1 + sc) + sh

Backward with dy = dL/dy and g = dy * (1 + sc) (the gradient reaching x_hat), means over D:

    dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))       (the LayerNorm VJP)
    dscale[b] = sum over t of dy * x_hat,    dshift[b] = sum over t of dy

Gate: out = r + gate[b] * y;  dr = dout,  dy = dout * gate[b],  dgate[b] = sum over t of dout * y.

Residual form (ada_layer_norm(x, ..., residual=r, gate=gate)): the LayerNorm's input is the new residual
stream h = r + gate[b] * x (r + x without a gate), in fp32 and rounded once to h's dtype, exactly the gate
kernel's output; the forward kernel stores h (a second output) and normalizes the rounded h. With dh the
gradient reaching h as an output:

    dh_total = dh + LN_vjp(dy)       (the backward kernel with HAS_DH adds dh before its one rounding)
    dr = dh_total,  dx = gate[b] * dh_total,  dgate[b] = sum over t of dh_total * x   (the gate backward)

The sums over t are deterministic: a program owns a run of tokens of one sample, sums them in registers
and writes one fp32 partial row; torch sums the few partial rows afterwards (no atomics).
The forward saves only mu and rstd (8 bytes per row) and the backward recomputes x_hat from x (from h in
the residual form).
"""

import triton
import triton.language as tl

from ..norm_details._kernels import _chan_merge


@triton.jit
def _modulate_store(x_hat, P_SC, P_SH, P_Y, o_n, mask):
    """y = x_hat * (1 + sc) + sh for a [BLOCK_M, BLOCK_N] block; P_*: [BLOCK_M] row pointers."""
    sc = tl.load(P_SC[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    sh = tl.load(P_SH[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    y = x_hat * (1.0 + sc) + sh
    tl.store(P_Y[:, None] + o_n[None, :], y.to(P_Y.dtype.element_ty), mask=mask)


@triton.jit
def _ln_input(p_x, p_r, p_g, p_h, o_n, mask, HAS_RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr,
              STORE_H: tl.constexpr):
    """The [BLOCK_M, BLOCK_N] block the LayerNorm normalizes, fp32, 0 outside mask: x, or with HAS_RESIDUAL
    h = r + gate * x (r + x without HAS_GATE) rounded to h's dtype, stored to H when STORE_H. The same
    arithmetic as _gate_fwd_kernel, so h is bitwise its output. p_*: [BLOCK_M] row pointers."""
    x = tl.load(p_x[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(p_r[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            gate = tl.load(p_g[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
            h = (r + gate * x).to(p_h.dtype.element_ty)
        else:
            h = (r + x).to(p_h.dtype.element_ty)
        if STORE_H:
            tl.store(p_h[:, None] + o_n[None, :], h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit
def _ada_ln_fwd_kernel(
    X, R, GATE, SCALE, SHIFT, H, Y, MEAN, RSTD,  # X, R: [B, T, D]; GATE, SCALE, SHIFT: [B or 1, D];
    n_rows, seqlen, n_cols,                     # H, Y: [B*T, D]; MEAN, RSTD: [B*T] fp32
    stride_x_b, stride_x_t, stride_r_b, stride_r_t, stride_gate_b, stride_scale_b, stride_shift_b,
    stride_h_row, stride_y_row,
    eps,
    HAS_RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr,
    ONE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program modulates BLOCK_M rows (tokens, possibly of several samples). ONE_BLOCK (D <= BLOCK_N):
    one read of each input and one write of y (and h). Otherwise a statistics pass (which stores h) and a
    normalize pass over column blocks; the latter recomputes h from r, gate and x (the same arithmetic, the
    same values) rather than read back what other threads stored.
    Without HAS_RESIDUAL, R, GATE and H are not touched (the launcher passes X); without HAS_GATE, GATE."""
    i_m = tl.program_id(0).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M] flat rows
    m_m = o_m < n_rows
    o_b = o_m // seqlen                                                        # sample of each row
    o_t = o_m - o_b * seqlen                                                   # token of each row
    p_x = X + o_b * stride_x_b + o_t * stride_x_t                              # [BLOCK_M] row pointers
    p_r = R + o_b * stride_r_b + o_t * stride_r_t
    p_g = GATE + o_b * stride_gate_b
    p_h = H + o_m * stride_h_row
    p_sc = SCALE + o_b * stride_scale_b
    p_sh = SHIFT + o_b * stride_shift_b
    p_y = Y + o_m * stride_y_row
    o_n = tl.arange(0, BLOCK_N)                                                # [BLOCK_N]
    if ONE_BLOCK:
        mask = m_m[:, None] & (o_n < n_cols)[None, :]
        x = _ln_input(p_x, p_r, p_g, p_h, o_n, mask, HAS_RESIDUAL, HAS_GATE, True)
        mean = tl.sum(x, axis=1) / n_cols
        d = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.math.rsqrt(tl.sum(d * d, axis=1) / n_cols + eps)
        _modulate_store(d * rstd[:, None], p_sc, p_sh, p_y, o_n, mask)
    else:
        # Chan's pairwise update (norm_details' _chan_merge): no cancellation, unlike E[x^2] - mu^2.
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = m_m[:, None] & (start + o_n < n_cols)[None, :]
            x = _ln_input(p_x, p_r, p_g, p_h, start + o_n, mask, HAS_RESIDUAL, HAS_GATE, True)
            mean, m2 = _chan_merge(mean, m2, x, mask, start, n_cols, BLOCK_N)
        rstd = tl.math.rsqrt(m2 / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            mask = m_m[:, None] & (start + o_n < n_cols)[None, :]
            x = _ln_input(p_x, p_r, p_g, p_h, start + o_n, mask, HAS_RESIDUAL, HAS_GATE, False)
            x_hat = (x - mean[:, None]) * rstd[:, None]
            _modulate_store(x_hat, p_sc + start, p_sh + start, p_y + start, o_n, mask)
    tl.store(MEAN + o_m, mean, mask=m_m)
    tl.store(RSTD + o_m, rstd, mask=m_m)


@triton.jit
def _bwd_block(p_x, p_dy, p_sc, o_n, m_t, n_cols, mean, rstd):
    """One column block o_n of a row block of the backward's two passes (p_x, p_dy: [BLOCK_M] row pointers, m_t the
    rows that exist, p_sc the sample's scale): (x_hat, g = dy (1 + sc), dy, the columns' mask, the block's mask)."""
    m_n = o_n < n_cols
    mask = m_t[:, None] & m_n[None, :]
    x = tl.load(p_x[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(p_dy[:, None] + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    w = 1.0 + tl.load(p_sc + o_n, mask=m_n, other=0.0).to(tl.float32)
    x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    return x_hat, dy * w[None, :], dy, m_n, mask


@triton.jit
def _ada_ln_bwd_kernel(
    DY, DH, X, SCALE, MEAN, RSTD, DX, DSC_PART, DSH_PART,  # DY, DH, X: [B, T, D]; DX: [B*T, D];
    seqlen, n_cols, rows_per_program,                      # *_PART: [C, B, D] fp32
    stride_dy_b, stride_dy_t, stride_dh_b, stride_dh_t, stride_x_b, stride_x_t, stride_scale_b, stride_dx_row,
    stride_part_c, stride_part_b,
    HAS_DH: tl.constexpr, ONE_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (b, c) handles tokens [c * rows_per_program, ...) of sample b, BLOCK_M at a time, and writes
    row (c, b) of the dscale / dshift partials. Not ONE_BLOCK (D > BLOCK_N): per row block, a pass for the
    row sums mean(g), mean(g x_hat), then a pass writing dx and adding into the partial rows it owns.
    HAS_DH (the residual form, X = h): dx += dh, the gradient of h as an output, in fp32 before the one
    rounding (DH is not touched otherwise)."""
    i_b = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1).to(tl.int64)
    t_start = i_c * rows_per_program
    t_end = tl.minimum(t_start + rows_per_program, seqlen)
    o_n = tl.arange(0, BLOCK_N)                                                # [BLOCK_N]
    p_sc = SCALE + i_b * stride_scale_b
    p_dsc = DSC_PART + i_c * stride_part_c + i_b * stride_part_b
    p_dsh = DSH_PART + i_c * stride_part_c + i_b * stride_part_b
    if ONE_BLOCK:
        m_n = o_n < n_cols
        w = 1.0 + tl.load(p_sc + o_n, mask=m_n, other=0.0).to(tl.float32)    # [BLOCK_N]
        acc_sc = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_sh = tl.zeros([BLOCK_N], dtype=tl.float32)
        for t0 in range(t_start, t_end, BLOCK_M):
            o_t = t0 + tl.arange(0, BLOCK_M)                                   # [BLOCK_M]
            m_t = o_t < t_end
            mask = m_t[:, None] & m_n[None, :]
            x = tl.load(X + i_b * stride_x_b + o_t[:, None] * stride_x_t + o_n[None, :], mask=mask,
                        other=0.0).to(tl.float32)
            dy = tl.load(DY + i_b * stride_dy_b + o_t[:, None] * stride_dy_t + o_n[None, :], mask=mask,
                         other=0.0).to(tl.float32)
            mean = tl.load(MEAN + i_b * seqlen + o_t, mask=m_t, other=0.0)
            rstd = tl.load(RSTD + i_b * seqlen + o_t, mask=m_t, other=0.0)
            x_hat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            g = dy * w[None, :]
            c1 = tl.sum(g, axis=1) / n_cols
            c2 = tl.sum(g * x_hat, axis=1) / n_cols
            dx = rstd[:, None] * (g - c1[:, None] - x_hat * c2[:, None])
            if HAS_DH:
                dx += tl.load(DH + i_b * stride_dh_b + o_t[:, None] * stride_dh_t + o_n[None, :], mask=mask,
                              other=0.0).to(tl.float32)
            tl.store(DX + (i_b * seqlen + o_t[:, None]) * stride_dx_row + o_n[None, :],
                     dx.to(DX.dtype.element_ty), mask=mask)
            acc_sc += tl.sum(dy * x_hat, axis=0)
            acc_sh += tl.sum(dy, axis=0)
        tl.store(p_dsc + o_n, acc_sc, mask=m_n)
        tl.store(p_dsh + o_n, acc_sh, mask=m_n)
    else:
        for t0 in range(t_start, t_end, BLOCK_M):
            o_t = t0 + tl.arange(0, BLOCK_M)
            m_t = o_t < t_end
            p_x = X + i_b * stride_x_b + o_t * stride_x_t                      # [BLOCK_M]
            p_dy = DY + i_b * stride_dy_b + o_t * stride_dy_t
            p_dh = DH + i_b * stride_dh_b + o_t * stride_dh_t
            p_dx = DX + (i_b * seqlen + o_t) * stride_dx_row
            mean = tl.load(MEAN + i_b * seqlen + o_t, mask=m_t, other=0.0)
            rstd = tl.load(RSTD + i_b * seqlen + o_t, mask=m_t, other=0.0)
            c1 = tl.zeros([BLOCK_M], dtype=tl.float32)
            c2 = tl.zeros([BLOCK_M], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                x_hat, g, dy, m_n, mask = _bwd_block(p_x, p_dy, p_sc, start + o_n, m_t, n_cols, mean, rstd)
                c1 += tl.sum(g, axis=1)
                c2 += tl.sum(g * x_hat, axis=1)
            c1 = c1 / n_cols
            c2 = c2 / n_cols
            for start in range(0, n_cols, BLOCK_N):
                x_hat, g, dy, m_n, mask = _bwd_block(p_x, p_dy, p_sc, start + o_n, m_t, n_cols, mean, rstd)
                dx = rstd[:, None] * (g - c1[:, None] - x_hat * c2[:, None])
                if HAS_DH:
                    dx += tl.load(p_dh[:, None] + (start + o_n)[None, :], mask=mask, other=0.0).to(tl.float32)
                tl.store(p_dx[:, None] + (start + o_n)[None, :], dx.to(DX.dtype.element_ty), mask=mask)
                # The partial rows belong to this program: the first row block stores, later ones add.
                m_prev = start + o_n < tl.where(t0 > t_start, n_cols, 0)       # m_n, or none at first
                prev_sc = tl.load(p_dsc + start + o_n, mask=m_prev, other=0.0)
                prev_sh = tl.load(p_dsh + start + o_n, mask=m_prev, other=0.0)
                tl.store(p_dsc + start + o_n, prev_sc + tl.sum(dy * x_hat, axis=0), mask=m_n)
                tl.store(p_dsh + start + o_n, prev_sh + tl.sum(dy, axis=0), mask=m_n)
            # Threads holding replicas of one partial element must not read it for the next row block
            # before every replica of this one is stored.
            tl.debug_barrier()


@triton.jit
def _gate_fwd_kernel(
    R, GATE, Y, OUT,  # R, Y: [B, T, D]; GATE: [B or 1, D]; OUT: [B*T, D]
    n_rows, seqlen, n_cols,
    stride_r_b, stride_r_t, stride_gate_b, stride_y_b, stride_y_t, stride_out_row,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """out = r + gate[b] * y for a [BLOCK_M, BLOCK_N] tile (elementwise, fp32 arithmetic, one rounding)."""
    i_m = tl.program_id(0).to(tl.int64)
    i_n = tl.program_id(1).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                # [BLOCK_M]
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    o_b = o_m // seqlen
    o_t = o_m - o_b * seqlen
    mask = (o_m < n_rows)[:, None] & (o_n < n_cols)[None, :]
    r = tl.load(R + (o_b * stride_r_b + o_t * stride_r_t)[:, None] + o_n[None, :], mask=mask, other=0.0)
    y = tl.load(Y + (o_b * stride_y_b + o_t * stride_y_t)[:, None] + o_n[None, :], mask=mask, other=0.0)
    gate = tl.load(GATE + (o_b * stride_gate_b)[:, None] + o_n[None, :], mask=mask, other=0.0)
    out = r.to(tl.float32) + gate.to(tl.float32) * y.to(tl.float32)
    tl.store(OUT + o_m[:, None] * stride_out_row + o_n[None, :], out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _gate_bwd_kernel(
    DOUT, GATE, Y, DY, DGATE_PART,  # DOUT, Y: [B, T, D]; DY: [B*T, D]; DGATE_PART: [C, B, D] fp32
    seqlen, n_cols, rows_per_program,
    stride_dout_b, stride_dout_t, stride_gate_b, stride_y_b, stride_y_t, stride_dy_row,
    stride_part_c, stride_part_b,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Program (b, c, n): tokens [c * rows_per_program, ...) of sample b, columns block n: dy = dout * gate,
    and the partial row (c, b) of dgate = sum over those tokens of dout * y."""
    i_b = tl.program_id(0).to(tl.int64)
    i_c = tl.program_id(1).to(tl.int64)
    i_n = tl.program_id(2).to(tl.int64)
    t_start = i_c * rows_per_program
    t_end = tl.minimum(t_start + rows_per_program, seqlen)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                # [BLOCK_N]
    m_n = o_n < n_cols
    gate = tl.load(GATE + i_b * stride_gate_b + o_n, mask=m_n, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for t0 in range(t_start, t_end, BLOCK_M):
        o_t = t0 + tl.arange(0, BLOCK_M)                                       # [BLOCK_M]
        mask = (o_t < t_end)[:, None] & m_n[None, :]
        dout = tl.load(DOUT + i_b * stride_dout_b + o_t[:, None] * stride_dout_t + o_n[None, :], mask=mask,
                       other=0.0).to(tl.float32)
        y = tl.load(Y + i_b * stride_y_b + o_t[:, None] * stride_y_t + o_n[None, :], mask=mask,
                    other=0.0).to(tl.float32)
        tl.store(DY + (i_b * seqlen + o_t[:, None]) * stride_dy_row + o_n[None, :],
                 (dout * gate[None, :]).to(DY.dtype.element_ty), mask=mask)
        acc += tl.sum(dout * y, axis=0)
    tl.store(DGATE_PART + i_c * stride_part_c + i_b * stride_part_b + o_n, acc, mask=m_n)

