"""Gluon pieces shared by the Hopper attention kernels (flash_fwd_hopper, flash_bwd_hopper, flash_bwd_dq_hopper): the
softcap and its derivative, ALiBi's bias, TMA boxes seen as tiles, a varlen sequence's bounds, and the producers'
zeroing of rows past cu_seqlens[-1]; on the host, the shared-memory layouts and the 4-D descriptors' geometry."""

from __future__ import annotations

import functools

import torch

from .dropout import PHILOX_ROUNDS

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
except ImportError:  # a triton without Gluon: nothing here is defined or used
    gluon = None

if gluon is not None:
    @gluon.jit
    def _tma_box(buf, desc):
        """A [rows, HEAD_DIM] shared-memory tile seen as the descriptor's [1, rows, 1, HEAD_DIM] box: the unit
        dims change nothing in memory (same swizzle), only the rank TMA addresses."""
        return buf._reinterpret(buf.dtype, desc.block_type.shape, desc.layout)

    @gluon.jit
    def _softcap(x, softcap_scale, HAS_SOFTCAP: gl.constexpr):
        """HAS_SOFTCAP: tanh(x * softcap_scale), the raw scores x = Q K^T capped (the score is softcap * tanh(scale *
        x / softcap): the caller folds softcap * log2(e) into its qk_scale), else x. tanh.approx.f32 is one MUFU
        instruction (relative error ~2^-11), as flash-attn's CUDA kernels take it (cutlass::fast_tanh); libdevice's is
        ~20."""
        t = x
        if HAS_SOFTCAP:
            t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x * softcap_scale], dtype=gl.float32,
                                          is_pure=True, pack=1)
        return t

    @gluon.jit
    def _alibi_slope(alibi, i_b, i_h, qk_scale):
        """Query head i_h's ALiBi slope for batch entry (varlen: sequence) i_b in the units of the raw scores the
        kernels scale by qk_scale (log2 domain): slope * log2(e) / qk_scale. alibi = (p_alibi, fp32 slopes [batch or 1,
        nheads_q]; their batch stride, 0 for one slope per head)."""
        return gl.load(alibi[0] + i_b * alibi[1] + i_h) * (1.4426950408889634 / qk_scale)

    @gluon.jit
    def _alibi(s, slope, queries, keys):
        """s - slope * |queries - keys|: ALiBi's bias on raw scores s (slope from _alibi_slope, in their units, so the
        caller's scaling stays one FMA with its exponent's offset: a subtract and an FMA a score), queries / keys the
        tile's query and key indices as fp32, broadcastable to s ([M, 1] and [1, N], or transposed) and shifted alike
        (only their difference counts; exact below 2^24)."""
        return s - slope * gl.abs(queries - keys)

    @gluon.jit
    def _dropout_rng(p_rng, dropout_p):
        """(key low, key high, offset, threshold << 24, scale) of dropout.py's mask from rng_state = (seed, offset)
        int64 at p_rng: Philox's key is the seed's two 32-bit halves, threshold dropout.dropout_threshold's (shifted to
        the top byte, where _dropout_keep compares), scale 1 / (1 - p)."""
        seed = gl.load(p_rng)
        threshold = gl.minimum((dropout_p * 256.0 + 0.5).to(gl.int32), 255).to(gl.uint32)
        return ((seed & 0xFFFFFFFF).to(gl.uint32), (seed >> 32).to(gl.uint32), gl.load(p_rng + 1).to(gl.uint32),
                threshold << 24, 1.0 / (1.0 - dropout_p))

    @gluon.jit
    def _mul_wide_a(x):
        """(high, low) 32 bits of x * 0xD2511F53: one mul.wide.u32 (IMAD.WIDE.U32), where umulhi and a multiply
        are two instructions."""
        return gl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, 0xD2511F53; mov.b64 {$1, $0}, t; }",
                                         "=r,=r,r", [x], dtype=(gl.uint32, gl.uint32), is_pure=True, pack=1)

    @gluon.jit
    def _mul_wide_b(x):
        """_mul_wide_a for Philox's other constant, 0xCD9E8D57."""
        return gl.inline_asm_elementwise("{ .reg .b64 t; mul.wide.u32 t, $2, 0xCD9E8D57; mov.b64 {$1, $0}, t; }",
                                         "=r,=r,r", [x], dtype=(gl.uint32, gl.uint32), is_pure=True, pack=1)

    @gluon.jit
    def _philox(c0, c1, c2, c3, k0, k1, MUL_WIDE: gl.constexpr):
        """Philox4x32 on uint32 tensors, tl.philox's rounds (c: the counter, (k0, k1): the key), dropout.py's count.
        MUL_WIDE: each round's products as mul.wide.u32, else umulhi and a multiply (same bits). Measured (H100,
        session 51): the forward 1.03-1.21x with it (its spills went, 296 -> 32 bytes at hd128), the hd128 backward
        0.87-0.99x (its pairs of 32-bit registers spilled more, 116 -> 192)."""
        for _ in gl.static_range(PHILOX_ROUNDS):
            if MUL_WIDE:
                hi_b, lo_b = _mul_wide_b(c2)
                hi_a, lo_a = _mul_wide_a(c0)
            else:
                hi_b, lo_b = gl.umulhi(c2, gl.full_like(c2, 0xCD9E8D57)), c2 * 0xCD9E8D57
                hi_a, lo_a = gl.umulhi(c0, gl.full_like(c0, 0xD2511F53)), c0 * 0xD2511F53
            c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
            k0 = k0 + 0x9E3779B9
            k1 = k1 + 0xBB67AE85
        return c0, c1, c2, c3

    @gluon.jit
    def _to_groups(x, TRANSPOSED: gl.constexpr):
        """A [rows, cols] score tile (a wgmma accumulator layout, or any whose threads hold what those do) seen as
        dropout.py's groups: [rows / 4, cols / 4, 2 (lane), 2 (byte), 2 (key bit 3), 2 (query bit 3)], the group's
        (a, s, b, q) first (TRANSPOSED: (b, q, a, s)), then the bit two threads split it by (query bit 0 e; TRANSPOSED
        key bit 0 d), the other bit 0 (the byte's within-thread bit), g and f. Register renaming only: reshapes and
        permutes of the layout."""
        R: gl.constexpr = x.shape[0]
        C: gl.constexpr = x.shape[1]
        x = gl.reshape(x, [R // 16, 2, 4, 2, C // 16, 2, 4, 2])     # rows (a or b, f or g, s or q, e or d), cols alike
        if TRANSPOSED:
            x = gl.permute(x, (0, 2, 4, 6, 3, 7, 1, 5))             # [b, q, a, s, d, e, g, f]
        else:
            x = gl.permute(x, (0, 2, 4, 6, 3, 7, 5, 1))             # [a, s, b, q, e, d, g, f]
        return gl.reshape(x, [R // 4, C // 4, 2, 2, 2, 2])

    @gluon.jit
    def _from_groups(g, R: gl.constexpr, C: gl.constexpr, TRANSPOSED: gl.constexpr):
        """_to_groups undone: [R, C]."""
        x = gl.reshape(g, [R // 16, 4, C // 16, 4, 2, 2, 2, 2])
        if TRANSPOSED:
            x = gl.permute(x, (0, 6, 1, 4, 2, 7, 3, 5))
        else:
            x = gl.permute(x, (0, 7, 1, 4, 2, 6, 3, 5))
        return gl.reshape(x, [R, C])

    @gluon.jit
    def _first(g):
        """[..., 2] -> [...]: the values at index 0 of the last dimension."""
        lo, _ = gl.split(g)
        return lo

    @gluon.jit
    def _per_group(x, TRANSPOSED: gl.constexpr):
        """[rows, cols] -> [rows / 4, cols / 4, 2 (lane)]: x at each group's first score of each thread's half."""
        return _first(_first(_first(_to_groups(x, TRANSPOSED))))

    @gluon.jit
    def _dropout_keep(rng, bh, q0, k0, R: gl.constexpr, C: gl.constexpr, layout: gl.constexpr,
                      TRANSPOSED: gl.constexpr, MUL_WIDE: gl.constexpr = False):
        """dropout.py's keep-mask (bool, layout) of the [R, C] score tile whose first query is q0 and first key k0
        (multiples of 16, counted inside the sequence) for query head bh = batch * nheads_q + head (varlen: sequence
        * nheads_q + head); TRANSPOSED: rows are keys, columns queries (the backward's S^T). layout: a wgmma
        accumulator layout, in which each thread holds half a group (the 8 scores of one query bit 0; TRANSPOSED:
        of one key bit 0). One Philox call per half group a thread holds, R * C / 8 calls over the tile's threads; the
        counters are built per score and picked per group (the rest is dead code). MUL_WIDE: _philox's."""
        r_idx = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        c_idx = gl.arange(0, C, layout=gl.SliceLayout(0, layout))
        if TRANSPOSED:
            keys = gl.expand_dims(k0 + r_idx, 1)
            queries = gl.expand_dims(q0 + c_idx, 0)
        else:
            queries = gl.expand_dims(q0 + r_idx, 1)
            keys = gl.expand_dims(k0 + c_idx, 0)
        c0 = _per_group((keys >> 4) + queries * 0, TRANSPOSED).to(gl.uint32)
        c1 = _per_group((((queries >> 4) << 4) | (((queries >> 1) & 3) << 2)) + ((keys >> 1) & 3),
                        TRANSPOSED).to(gl.uint32)
        # the byte's bit a thread's half fixes: 16 e (TRANSPOSED: 8 d); the other, within the thread: 8 d (16 e)
        lane_bits = _per_group(16 * (queries & 1) + 8 * (keys & 1), TRANSPOSED).to(gl.uint32)
        INNER: gl.constexpr = 16 if TRANSPOSED else 8
        k_lo, k_hi, offset, threshold24, _ = rng
        w0, w1, w2, w3 = _philox(c0, c1, gl.full_like(c0, 0) + bh.to(gl.uint32), gl.full_like(c0, 0) + offset,
                                 k_lo, k_hi, MUL_WIDE)
        # word 2 f + g; byte b kept iff the word shifted left by 24 - 8 b is >= threshold << 24
        shift0 = 24 - lane_bits
        shift1 = shift0 - INNER
        k00 = gl.join((w0 << shift0) >= threshold24, (w0 << shift1) >= threshold24)   # [.., 2 (byte)]: f = 0, g = 0
        k01 = gl.join((w1 << shift0) >= threshold24, (w1 << shift1) >= threshold24)
        k10 = gl.join((w2 << shift0) >= threshold24, (w2 << shift1) >= threshold24)
        k11 = gl.join((w3 << shift0) >= threshold24, (w3 << shift1) >= threshold24)
        keep = gl.join(gl.join(k00, k01), gl.join(k10, k11))          # [.., 2 (lane), 2 (byte), 2 (g), 2 (f)]
        return gl.convert_layout(_from_groups(keep, R, C, TRANSPOSED), layout, assert_trivial=True)

    @gluon.jit
    def _dropped(p, rng, bh, q0, k0, layout: gl.constexpr, HAS_DROPOUT: gl.constexpr):
        """HAS_DROPOUT: the forward's p [R queries, C keys] (layout) with the scores that dropout.py's mask drops set to
        0 (_dropout_keep's arguments; mul.wide products), else p."""
        if HAS_DROPOUT:
            p = gl.where(_dropout_keep(rng, bh, q0, k0, p.shape[0], p.shape[1], layout, False, True), p, 0.0)
        return p

    @gluon.jit
    def _softcap_slope(t, HAS_SOFTCAP: gl.constexpr):
        """HAS_SOFTCAP: 1 - t^2 for _softcap's t, in fp16 (the callers keep it beside P across the masks: 16 bits there
        kept ptxas from spilling, and 1 - t^2 in [0, 1] keeps fp16's 11-bit precision down to 6e-5), else t (unused).
        d(softcap * tanh(scale * x / softcap)) / dx = scale * (1 - t^2): dS's factor beside P (the callers fold the
        scale into dS)."""
        g = t
        if HAS_SOFTCAP:
            g = (1.0 - t * t).to(gl.float16)
        return g

    @gluon.jit
    def _softcap_grad(p, g, HAS_SOFTCAP: gl.constexpr):
        """HAS_SOFTCAP: P times _softcap_slope's g (dS = P (1 - t^2) (dP - delta) scale), else P."""
        pg = p
        if HAS_SOFTCAP:
            pg = p * g.to(gl.float32)
        return pg

    @gluon.jit
    def _zero_rows(tile, first):
        """One warp (a producer): zero rows first.. of a [rows, cols] 16-bit shared-memory tile that TMA has filled
        (128-byte swizzle), and fence the stores for the wgmma that reads the tile next (the producer's arrival on the
        tile's ready barrier then publishes them). Varlen: a TMA box at the end of the packed tensors reaches past
        cu_seqlens[-1] into rows of no sequence (a buffer padded to a static shape: anything there, NaN included);
        the products weight those rows by zero, and 0 * NaN is NaN (sglang issue 18659: FlashAttention-3's kernels
        let such rows into the last sequence).
        The tile is walked as its swizzle atoms, [8 rows, 64 columns] = 1024 bytes each, column blocks outermost (the
        layout TMA writes: one box per 128-byte column block), in a loop (unrolled: ~1400 instructions of cold code)."""
        gl.static_assert(tile.layout.swizzle_byte_width == 128)
        ROWS: gl.constexpr = tile.shape[0]
        COLS: gl.constexpr = 64
        N_COLS: gl.constexpr = tile.shape[1] // COLS
        atoms = tile._reinterpret(tile.dtype, [N_COLS * ROWS // 8, 8, COLS],
                                  gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [1, 1], [1, 0])
        rows = gl.arange(0, 8, layout=gl.SliceLayout(1, layout))
        for r in range(first // 8, ROWS // 8):
            hidden = gl.expand_dims(r * 8 + rows >= first, 1)
            for c in gl.static_range(N_COLS):
                atom = atoms.index(c * (ROWS // 8) + r)
                x = atom.load(layout)
                atom.store(gl.where(hidden, gl.zeros_like(x), x))
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _load_zeroed(desc, coord, tile, ready, nbytes, zfill, zphase, first):
        """One warp: TMA-load tile (nbytes, desc at coord), zero its rows first.. (_zero_rows), then arrive on ready,
        the barrier its readers wait on: the load itself completes on zfill, the producer's own barrier (count 1,
        phase zphase). Returns zfill's next phase."""
        mbarrier.expect(zfill, nbytes)
        tma.async_copy_global_to_shared(desc, coord, zfill, _tma_box(tile, desc))
        mbarrier.wait(zfill, zphase)
        _zero_rows(tile, first)
        mbarrier.arrive(ready, count=1)
        return zphase ^ 1

    @gluon.jit
    def _packed_end(p_cu_seqlens, n_seqs, IS_VARLEN: gl.constexpr):
        """Varlen: cu_seqlens[-1], the first packed row of no sequence (_zero_rows); else 0 (unused)."""
        end = 0
        if IS_VARLEN:
            end = gl.load(p_cu_seqlens + n_seqs)
        return end

    @gluon.jit
    def _seq_bounds(i_b, cu_seqlens, seqlen_q, seqlen_k, IS_VARLEN: gl.constexpr):
        """(TMA batch coordinate, first query row, first key row, seqlen_q, seqlen_k) of batch entry i_b: varlen,
        sequence i_b of the packed [1, total, heads, head_dim] tensors (cu_seqlens: int32 pointers (q, k)); else
        batch i_b of the call's lengths."""
        if IS_VARLEN:
            p_cu_q, p_cu_k = cu_seqlens
            q_start = gl.load(p_cu_q + i_b)
            k_start = gl.load(p_cu_k + i_b)
            b, sq, sk = 0, gl.load(p_cu_q + i_b + 1) - q_start, gl.load(p_cu_k + i_b + 1) - k_start
        else:
            b, q_start, k_start, sq, sk = i_b, 0, 0, seqlen_q, seqlen_k
        return b, q_start, k_start, sq, sk


def _smem_layout(block_shape, dtype):
    return _smem_layout_cached(tuple(block_shape), dtype)


@functools.lru_cache(maxsize=None)
def _smem_layout_cached(block_shape, dtype):
    # ~11 us uncached, ten lookups per launch: measured as host time at short sequences (session 15)
    gl_dtype = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), gl_dtype)


def sequence_geometry(batch, seqlen, heads, head_dim, strides, box, dtype, box_dim):
    """(shape, strides, box, layout) of the 4-D host-side descriptor over a [batch, seqlen, heads, head_dim] tensor
    with [1, box, 1, box_dim] boxes (box_dim: kernel_head_dim, or a tail's width, its boxes loaded from column 64 /
    128 on) that both Gluon kernels use (rows past seqlen and columns past head_dim zero-filled on loads, dropped on
    stores): host_descriptor's arguments after the tensor."""
    return ([batch, seqlen, heads, head_dim], list(strides), [1, box, 1, box_dim],
            _smem_layout([1, box, 1, box_dim], dtype))


def packed_geometry(t, varlen):
    """(batch, seqlen, heads, strides) of the 4-D descriptors over t: as given, or, varlen (t packed (total, heads,
    head_dim)), one batch entry of all rows (the unit dimension's stride any nonzero multiple of 16 bytes)."""
    if not varlen:
        return (*t.shape[:3], t.stride())
    return 1, t.shape[0], t.shape[1], (t.stride(0) * t.shape[0], *t.stride())
