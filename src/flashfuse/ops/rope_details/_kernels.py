"""The Triton kernel of ``flashfuse.ops.rope`` (rotary position embedding, forward and its VJP)."""

import triton
import triton.language as tl

# ----------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------
#
# Forward. For one token at position p and each pair i < rotary_dim / 2 of features (a_i, b_i):
#     a'_i = a_i c1_i - b_i s1_i
#     b'_i = b_i c2_i + a_i s2_i
# with c1 = cos[p, :R/2], c2 = cos[p, R/2:] (HF's duplicated-halves table; flash-attn's half table has
# c2 = c1, reached by a half offset of 0), same for s. Pairs are (x[i], x[i + R/2]) in the GPT-NeoX
# layout and (x[2i], x[2i + 1]) in the GPT-J (interleaved) layout. Features >= R are copied.
#
# VJP. The map is linear in x with the 2x2 block M_i = [[c1, -s1], [s2, c2]] per pair, so
#     dx_i = M_i^T dy_i:   da = c1 da' + s2 db',   db = c2 db' - s1 da'
# which is the forward with (s1, s2) -> (-s2, -s1): CONJUGATE=True. With c1 = c2 and s1 = s2 that is
# the rotation by -theta. No gradient flows to cos / sin (tables are constants, as in flash-attn / HF).
#
# Tiling: a token's heads of x, then of y (q and k of a pair, GQA: any head counts), are cut into tiles
# of BLOCK_H heads. One program takes one token and tiles_per_program consecutive tiles of it (all of
# them by default): it reads the token's cos/sin row once, then loops over its tiles, loading tile t + 1
# before rotating and storing tile t (PREFETCH), so two tiles' loads are in flight at every step. Grid:
# (tokens x tile groups, batch), the groups of one token adjacent, so that a token's cos/sin row is read
# from HBM once even when it is split over several programs. Each element of x is read once and each of
# out written once, in fp32 arithmetic. A position outside the cos/sin table gives NaN (a visible error
# instead of flash-attn's silent identity rotation).


@triton.jit
def _tile_pointers(p_x, p_out, p_y, p_outy, t, t_end, tiles_x, nheads_x, nheads_y, headdim_x, headdim_y,
                   stride_x_head, stride_out_head, stride_y_head, stride_outy_head,
                   HAS_Y: tl.constexpr, BLOCK_H: tl.constexpr):
    """Tile t of a token (p_*: the token's row of x, out, y, out_y): heads [h0, h0 + BLOCK_H) of x, or of
    y for t >= tiles_x (x and y share a dtype, so a pointer select replaces a branch). Returns input and
    output pointers [BLOCK_H, 1], the head mask [BLOCK_H] (all False for t >= t_end), the headdim."""
    if HAS_Y:
        is_x = t < tiles_x
        p_x = tl.where(is_x, p_x, p_y)
        p_out = tl.where(is_x, p_out, p_outy)
        nheads = tl.where(is_x, nheads_x, nheads_y)
        headdim = tl.where(is_x, headdim_x, headdim_y)
        stride_in_h = tl.where(is_x, stride_x_head, stride_y_head)
        stride_o_h = tl.where(is_x, stride_out_head, stride_outy_head)
        h0 = tl.where(is_x, t, t - tiles_x) * BLOCK_H
    else:
        nheads, headdim, stride_in_h, stride_o_h, h0 = nheads_x, headdim_x, stride_x_head, stride_out_head, \
            t * BLOCK_H
    o_h = (h0 + tl.arange(0, BLOCK_H)).to(tl.int64)                       # [BLOCK_H]
    m_h = o_h < tl.where(t < t_end, nheads, 0)
    return p_x + o_h[:, None] * stride_in_h, p_out + o_h[:, None] * stride_o_h, m_h, headdim


@triton.jit
def _load_tile(p_xh, m_h, headdim, rotary_dim, INTERLEAVED: tl.constexpr, COPY_PASS: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr):
    """A tile in x's dtype: GPT-NeoX (first halves [BLOCK_H, BLOCK_K], second halves, pass-through
    [BLOCK_H, BLOCK_P]); GPT-J the rotary features [BLOCK_H, 2 BLOCK_K] twice (one contiguous load, split
    in registers: two stride-2 loads do not vectorize, 14x slower on an H200), pass-through."""
    rotary_half = rotary_dim // 2
    o_k = tl.arange(0, BLOCK_K)                                           # [BLOCK_K] pair index
    if INTERLEAVED:
        o_r = tl.arange(0, 2 * BLOCK_K)                                   # [2 BLOCK_K]
        b_a = tl.load(p_xh + o_r[None, :], mask=m_h[:, None] & (o_r < rotary_dim)[None, :], other=0.0)
        b_b = b_a
    else:
        m_r = m_h[:, None] & (o_k < rotary_half)[None, :]                 # [BLOCK_H, BLOCK_K]
        b_a = tl.load(p_xh + o_k[None, :], mask=m_r, other=0.0)
        b_b = tl.load(p_xh + rotary_half + o_k[None, :], mask=m_r, other=0.0)
    if COPY_PASS:                                                         # features past rotary_dim
        o_p = rotary_dim + tl.arange(0, BLOCK_P)                          # [BLOCK_P]
        b_p = tl.load(p_xh + o_p[None, :], mask=m_h[:, None] & (o_p < headdim)[None, :], other=0.0)
    else:
        b_p = tl.zeros([BLOCK_P], dtype=p_xh.dtype.element_ty)
    return b_a, b_b, b_p


@triton.jit
def _rotate_store(b_a, b_b, b_p, c1, c2, s1, s2, p_oh, m_h, headdim, rotary_dim, INTERLEAVED: tl.constexpr,
                  COPY_PASS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_P: tl.constexpr):
    """Rotate a tile loaded by _load_tile (c1, c2, s1, s2: [BLOCK_K] fp32) and store it through p_oh."""
    rotary_half = rotary_dim // 2
    o_k = tl.arange(0, BLOCK_K)
    if INTERLEAVED:
        b_a, b_b = tl.split(tl.reshape(b_a.to(tl.float32), (BLOCK_H, BLOCK_K, 2)))  # [BLOCK_H, BLOCK_K]
    else:
        b_a, b_b = b_a.to(tl.float32), b_b.to(tl.float32)
    b_a2 = b_a * c1[None, :] - b_b * s1[None, :]
    b_b2 = b_b * c2[None, :] + b_a * s2[None, :]
    if INTERLEAVED:
        o_r = tl.arange(0, 2 * BLOCK_K)
        b_y = tl.reshape(tl.join(b_a2, b_b2), (BLOCK_H, 2 * BLOCK_K))
        tl.store(p_oh + o_r[None, :], b_y.to(p_oh.dtype.element_ty),
                 mask=m_h[:, None] & (o_r < rotary_dim)[None, :])
    else:
        m_r = m_h[:, None] & (o_k < rotary_half)[None, :]
        tl.store(p_oh + o_k[None, :], b_a2.to(p_oh.dtype.element_ty), mask=m_r)
        tl.store(p_oh + rotary_half + o_k[None, :], b_b2.to(p_oh.dtype.element_ty), mask=m_r)
    if COPY_PASS:
        o_p = rotary_dim + tl.arange(0, BLOCK_P)
        tl.store(p_oh + o_p[None, :], b_p.to(p_oh.dtype.element_ty),
                 mask=m_h[:, None] & (o_p < headdim)[None, :])


@triton.jit(do_not_specialize=["seqlen_offset"])
def _rotary_kernel(
    X, OUT, Y, OUT_Y,                 # x, out: [batch, seqlen, nheads_x, headdim_x] (any strides, last dim 1)
    COS, SIN,                         # [batch or 1, seqlen_ro, table_width] (any strides, last dim 1)
    CU_SEQLENS, SEQLEN_OFFSETS, POSITION_IDS,   # [batch + 1] int32, [batch] int, [batch, seqlen] int
    seqlen, seqlen_ro, nheads_x, nheads_y, headdim_x, headdim_y, rotary_dim, seqlen_offset,
    cos_half_offset,                  # elements from c1 to c2 in a cos row: rotary_dim / 2 (HF) or 0
    tiles_x, n_tiles, n_groups, tiles_per_program,   # head tiles: of x, of x and y; groups per token
    stride_x_batch, stride_x_seq, stride_x_head,
    stride_out_batch, stride_out_seq, stride_out_head,
    stride_y_batch, stride_y_seq, stride_y_head,
    stride_outy_batch, stride_outy_seq, stride_outy_head,
    stride_cos_batch, stride_cos_seq, stride_sin_batch, stride_sin_seq,
    stride_pos_batch, stride_pos_seq,
    INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_Y: tl.constexpr,
    HAS_OFFSETS: tl.constexpr, HAS_POSITION_IDS: tl.constexpr, COPY_PASS: tl.constexpr,
    PREFETCH: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
):
    i_mg = tl.program_id(0).to(tl.int64)
    i_m = i_mg // n_groups                                                # token index in its sequence
    i_g = i_mg % n_groups                                                 # tile group of that token
    i_b = tl.program_id(1).to(tl.int64)                                   # batch / sequence index
    if IS_VARLEN:                                                         # packed rows; stride_*_batch = 0
        start = tl.load(CU_SEQLENS + i_b).to(tl.int64)
        seqlen = tl.load(CU_SEQLENS + i_b + 1).to(tl.int64) - start
    else:
        start = 0
    if i_m >= seqlen:
        return
    row = start + i_m
    t0 = (i_g * tiles_per_program).to(tl.int32)
    t_end = tl.minimum(t0 + tiles_per_program, n_tiles)

    p_x = X + i_b * stride_x_batch + row * stride_x_seq                    # the token's rows
    p_out = OUT + i_b * stride_out_batch + row * stride_out_seq
    p_y = Y + i_b * stride_y_batch + row * stride_y_seq
    p_outy = OUT_Y + i_b * stride_outy_batch + row * stride_outy_seq
    # The first tile's loads are issued before the cos/sin row's, so their latencies overlap.
    p_xh, p_oh, m_h, headdim = _tile_pointers(p_x, p_out, p_y, p_outy, t0, t_end, tiles_x, nheads_x, nheads_y,
                                              headdim_x, headdim_y, stride_x_head, stride_out_head,
                                              stride_y_head, stride_outy_head, HAS_Y, BLOCK_H)
    b_a, b_b, b_p = _load_tile(p_xh, m_h, headdim, rotary_dim, INTERLEAVED, COPY_PASS, BLOCK_K, BLOCK_P)

    if HAS_POSITION_IDS:
        pos = tl.load(POSITION_IDS + i_b * stride_pos_batch + row * stride_pos_seq).to(tl.int64)
    else:
        pos = i_m + seqlen_offset
        if HAS_OFFSETS:
            pos += tl.load(SEQLEN_OFFSETS + i_b).to(tl.int64)
    in_table = (pos >= 0) & (pos < seqlen_ro)
    pos_safe = tl.where(in_table, pos, 0)                                 # read row 0, then poison below
    p_cos = COS + i_b * stride_cos_batch + pos_safe * stride_cos_seq
    p_sin = SIN + i_b * stride_sin_batch + pos_safe * stride_sin_seq
    o_k = tl.arange(0, BLOCK_K)                                           # [BLOCK_K] pair index
    m_k = o_k < rotary_dim // 2
    c1 = tl.load(p_cos + o_k, mask=m_k, other=0.0).to(tl.float32)         # [BLOCK_K] each, fp32
    c2 = tl.load(p_cos + cos_half_offset + o_k, mask=m_k, other=0.0).to(tl.float32)
    s1 = tl.load(p_sin + o_k, mask=m_k, other=0.0).to(tl.float32)
    s2 = tl.load(p_sin + cos_half_offset + o_k, mask=m_k, other=0.0).to(tl.float32)
    c1 = tl.where(in_table, c1, float("nan"))                            # NaN reaches both outputs
    c2 = tl.where(in_table, c2, float("nan"))
    if CONJUGATE:                                                         # transpose of the 2x2 block
        s1, s2 = -s2, -s1

    for t in range(t0, t_end):
        # PREFETCH: tile t + 1's loads go out before tile t is rotated and stored (masked off at t_end).
        p_xh, p_on, m_hn, headdim_n = _tile_pointers(p_x, p_out, p_y, p_outy, t + 1, t_end, tiles_x, nheads_x,
                                                     nheads_y, headdim_x, headdim_y, stride_x_head,
                                                     stride_out_head, stride_y_head, stride_outy_head, HAS_Y,
                                                     BLOCK_H)
        if PREFETCH:
            b_an, b_bn, b_pn = _load_tile(p_xh, m_hn, headdim_n, rotary_dim, INTERLEAVED, COPY_PASS, BLOCK_K,
                                          BLOCK_P)
        _rotate_store(b_a, b_b, b_p, c1, c2, s1, s2, p_oh, m_h, headdim, rotary_dim, INTERLEAVED, COPY_PASS,
                      BLOCK_H, BLOCK_K, BLOCK_P)
        if not PREFETCH:
            b_an, b_bn, b_pn = _load_tile(p_xh, m_hn, headdim_n, rotary_dim, INTERLEAVED, COPY_PASS, BLOCK_K,
                                          BLOCK_P)
        b_a, b_b, b_p, p_oh, m_h, headdim = b_an, b_bn, b_pn, p_on, m_hn, headdim_n


