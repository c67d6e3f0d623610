"""GroupNorm forward for Hopper in Gluon, channels_last: each sample read from HBM once, split over programs that meet.

channels_last x (N, C, H, W) is [N, HW, C] in memory: a group is cpg channels of every pixel of its sample, so no
program can hold a group of SD's shapes alone (a sample is 2.6-10 MB). Here the sample is cut into K chunks of
pixels (all C channels), and the K programs holding one sample's chunks meet once through global memory:

    loader (1 warp)        the chunk's [TILE_P pixels, BOX_C channels] tiles by TMA into the ring (channel block
                           by channel block), as in _hopper_fwd.py
    compute (2 x WARPS)    per round (partitions take rounds in turn; a chunk fills at most half the ring, so the
                           loader streams one partition's next chunk while the other meets and normalizes):
        statistics   per channel block and pixel tile, the exact (mean, M2) per channel from the tile's registers
                     (sum, then squared deviations), merged over the chunk's tiles (Chan), then per group:
                         mean_g = sum_c mean_c / cpg,   M2_g = sum_c M2_c + P sum_c (mean_c - mean_g)^2
        meet         (mean_g, M2_g) stored, one release atomic on the sample's counter, spin (acquire) until the
                     K chunks are in; merged exactly over the chunks, K_BLOCK at a time (counts P_k cpg, Chan)
        normalize    y = act(s a_c + b_c) per column (a channel), a_c = w_c rstd_g, b_c = bias_c - mean_g a_c from
                     the partition's table in shared memory, built once per round (one row per channel block);
                     each slot released as read, after a proxy fence (the loader's next TMA write to it is an
                     async-proxy access: without the fence, a few outputs of later rounds were wrong at times)

No global load waits inside the per-channel-block loops (session 19's first version fetched the affine terms and the
residual per channel block from global memory, ~20 dependent L2 round trips per round, and ran slower than the
Triton plans): the (N, C, 1, 1) time embedding of the round's sample is fetched in one load into a shared-memory
table, added per column (rounded to x's dtype like torch's add) and written back to the slot. Statistics sum a
tile's pixels within the thread but for 3 shuffles (no cross-warp reduction per channel block).

Program pid holds chunk pid % K of the samples pid // K, pid // K + S, ... (S = SMs // K samples per round): all K
programs of a sample are in the same round, and the grid (S K <= SMs, one program per SM by its shared memory) is
resident at once, so the spin cannot wait on a program that is not running. Chunk size: plan().
Statistics in fp32; SiLU as _hopper_fwd (MUFU ex2, rcp).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._triton import LaunchCache, cdiv, next_power_of_2, sm_count
from .._triton import bind_cuda_context, host_descriptor
from ..attention.flash_fwd_hopper import available, gluon
from ._hopper_fwd import ACTIVATIONS, COMPUTE_REGS, COMPUTE_WARPS, LOADER_REGS, PARTS, slot_barrier_offset

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    from ._hopper_fwd import _NEG_LOG2E, _arrive_and_wait, _ex2, _rcp, _release_slot, _store_rows

BOX_BYTES = 128                   # a tile row: BOX_C = 128 / element size channels of one pixel (8 lanes x 16 B)
TILE_P = 64                       # pixels per tile (32-pixel tiles, for C = 1280 in 16 bits where two 64-pixel
                                  # chunks overflow the ring, ran 35% slower than the Triton plans: session 21)
SMEM_BYTES = 232448               # the sm_90 limit per block (227 KB)
SCRATCH_BYTES = 8192              # beside the ring and the tables: barriers and the reductions' scratch
K_BLOCK_MAX = 64                  # chunks merged per step of the meeting
MIN_FILL = 0.9                    # least share of the SMs' rounds x chunk pixels holding pixels (session 21: at
                                  # (2, 640, 32, 32), 32 programs, 0.24, and (12, 640, 40, 40), a partial last
                                  # round, 0.76, the Triton plans were 1.1-1.8x faster)

if gluon is not None:
    @gluon.jit
    def _channel_index(N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr, WARPS: gl.constexpr):
        """The channel of each entry of a [N_CB_PAD, BOX_C] table (one row per channel block)."""
        two: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [WARPS, 1], [1, 0])
        return gl.expand_dims(gl.arange(0, N_CB_PAD, layout=gl.SliceLayout(1, two)), 1) * BOX_C + \
            gl.expand_dims(gl.arange(0, BOX_C, layout=gl.SliceLayout(0, two)), 0)

    @gluon.jit
    def _channel_rows(ptr, stride, c, other, N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr, WARPS: gl.constexpr):
        """ptr[ch * stride] for the channels ch < c (other past c) as [N_CB_PAD, BOX_C] fp32, one row per channel
        block: one load for all channel blocks."""
        ch = _channel_index(N_CB_PAD, BOX_C, WARPS)
        return gl.load(ptr + ch * stride, mask=ch < c, other=other).to(gl.float32)

    @gluon.jit
    def _affine_table(ab, p_w, p_b, p_grp, c, cpg, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                      N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr, WARPS: gl.constexpr):
        """ab [2 N_CB_PAD, BOX_C] fp32 (one row per channel block): rows [0, N_CB_PAD) a_c = w_c rstd_g, rows
        [N_CB_PAD, 2 N_CB_PAD) b_c = bias_c - mean_g a_c; p_grp: (mean, rstd) per group, just stored by this
        partition (read past L1)."""
        ch = _channel_index(N_CB_PAD, BOX_C, WARPS)                                     # [N_CB_PAD, BOX_C]
        m = ch < c
        g = ch // cpg
        a = gl.load(p_grp + g * 2 + 1, mask=m, other=0.0, cache_modifier=".cg")
        if HAS_WEIGHT:
            a = a * _channel_rows(p_w, 1, c, 0.0, N_CB_PAD, BOX_C, WARPS)
        b = -gl.load(p_grp + g * 2, mask=m, other=0.0, cache_modifier=".cg") * a
        if HAS_BIAS:
            b += _channel_rows(p_b, 1, c, 0.0, N_CB_PAD, BOX_C, WARPS)
        ab.slice(0, N_CB_PAD).store(a)
        ab.slice(N_CB_PAD, N_CB_PAD).store(b)

    @gluon.jit
    def _rows(table):
        """table [R, BOX_C] seen as [R, 1, BOX_C], so that table_rows.index(i) loads row i as [1, BOX_C] (a
        dynamic index; slices need constant starts)."""
        return table._reinterpret(table.dtype, [table.shape[0], 1, table.shape[1]], table.layout)

    @gluon.jit
    def _stage_s(ring, ready, k, r, HAS_RESIDUAL: gl.constexpr, SLOTS: gl.constexpr, tile: gl.constexpr):
        """Waits for the program's tile k; s = x (+ r [1, BOX_C] per column, rounded to x's dtype and written back to
        the slot for the normalize pass) as fp32 [TILE_P, BOX_C]."""
        slot = k % SLOTS
        mbarrier.wait(ready.index(slot), (k // SLOTS) & 1)
        s = ring.index(slot).load(tile)
        if HAS_RESIDUAL:
            s = (s.to(gl.float32) + r).to(ring.dtype)
            ring.index(slot).store(s)
        return s.to(gl.float32)

    @gluon.jit
    def _chunk_stats(ring, ready, res, res_row0, k, p_scr, p_part, n_pt, n_px, n_cb, cpg, groups,
                     HAS_RESIDUAL: gl.constexpr, HAS_PAD: gl.constexpr, TILE_P: gl.constexpr, BOX_C: gl.constexpr,
                     G_PAD: gl.constexpr, CPG_PAD: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr,
                     tile: gl.constexpr):
        """(mean, M2) per group of this chunk (n_px pixels) -> p_part[g * 2 + {0, 1}]; p_scr [>= 2 C] fp32 holds
        the per-channel (mean, M2) in between; res [R, 1, BOX_C]: rows res_row0 + cb, the round's residual per
        channel block."""
        rows = gl.arange(0, TILE_P, layout=gl.SliceLayout(1, tile))                     # [TILE_P]
        cols = gl.arange(0, BOX_C, layout=gl.SliceLayout(0, tile))                      # [BOX_C]
        r = gl.zeros([1, BOX_C], gl.float32, tile)
        for cb in range(n_cb):
            if HAS_RESIDUAL:
                r = res.index(res_row0 + cb).load(tile).to(gl.float32)
            kk = k + cb * n_pt
            mean_c = gl.zeros([BOX_C], gl.float32, gl.SliceLayout(0, tile))
            m2_c = gl.zeros([BOX_C], gl.float32, gl.SliceLayout(0, tile))
            for t in range(n_pt):
                # the tile's exact (mean, M2) per channel from registers, then merged into the chunk's (Chan)
                s = _stage_s(ring, ready, kk + t, r, HAS_RESIDUAL, SLOTS, tile)         # [TILE_P, BOX_C]
                n_t = gl.minimum(n_px - t * TILE_P, TILE_P).to(gl.float32)
                if HAS_PAD:
                    valid = gl.expand_dims(t * TILE_P + rows < n_px, 1)
                    s = gl.where(valid, s, 0.0)
                mean_t = gl.sum(s, axis=0) / n_t                                        # [BOX_C]
                e = s - gl.expand_dims(mean_t, 0)
                if HAS_PAD:
                    e = gl.where(valid, e, 0.0)
                m2_t = gl.sum(e * e, axis=0)
                n_seen = (t * TILE_P).to(gl.float32)
                delta = mean_t - mean_c
                mean_c += delta * (n_t / (n_seen + n_t))
                m2_c += m2_t + delta * delta * (n_seen * n_t / (n_seen + n_t))
            gl.store(p_scr + (cb * BOX_C + cols) * 2, mean_c)
            gl.store(p_scr + (cb * BOX_C + cols) * 2 + 1, m2_c)
        gl.thread_barrier()
        grp: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])
        og = gl.arange(0, G_PAD, layout=gl.SliceLayout(1, grp))                         # [G_PAD]
        oj = gl.arange(0, CPG_PAD, layout=gl.SliceLayout(0, grp))                       # [CPG_PAD]
        m = gl.expand_dims(og < groups, 1) & gl.expand_dims(oj < cpg, 0)
        ch = gl.expand_dims(og * cpg, 1) + gl.expand_dims(oj, 0)
        mean_c = gl.load(p_scr + ch * 2, mask=m, other=0.0)
        m2_c = gl.load(p_scr + ch * 2 + 1, mask=m, other=0.0)
        mean_g = gl.sum(mean_c, axis=1) / (cpg * 1.0)
        dev = gl.where(m, mean_c - gl.expand_dims(mean_g, 1), 0.0)
        m2_g = gl.sum(m2_c, axis=1) + n_px.to(gl.float32) * gl.sum(dev * dev, axis=1)
        gl.store(p_part + og * 2, mean_g, mask=og < groups)
        gl.store(p_part + og * 2 + 1, m2_g, mask=og < groups)

    @gluon.jit
    def _meet(p_part_n, p_count_n, n_chunks, chunk_px, hw, cpg, groups, eps,
              G_PAD: gl.constexpr, K_BLOCK: gl.constexpr, WARPS: gl.constexpr):
        """Publishes this chunk (its stores, then a release increment of the sample's counter), waits until all
        n_chunks are in and merges their (mean, M2) per group (chunk k: P_k cpg values), K_BLOCK chunks per step
        (Chan's pairwise formula between steps); returns (mean, rstd) [G_PAD]."""
        _arrive_and_wait(p_count_n, n_chunks)
        kl: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])
        og = gl.arange(0, G_PAD, layout=gl.SliceLayout(0, kl))                          # [G_PAD]
        m_g = og < groups
        mean = gl.zeros([G_PAD], gl.float32, gl.SliceLayout(0, kl))
        m2 = gl.zeros([G_PAD], gl.float32, gl.SliceLayout(0, kl))
        n_seen = 0.0                                                     # pixels merged so far
        for k0 in range(0, n_chunks, K_BLOCK):
            ok = k0 + gl.arange(0, K_BLOCK, layout=gl.SliceLayout(1, kl))               # [K_BLOCK]
            m = gl.expand_dims(ok < n_chunks, 1) & gl.expand_dims(m_g, 0)
            px = gl.minimum(gl.maximum(hw - ok * chunk_px, 0), chunk_px).to(gl.float32)  # 0 past the last chunk
            p = p_part_n + (gl.expand_dims(ok * groups, 1) + gl.expand_dims(og, 0)) * 2
            mk = gl.load(p, mask=m, other=0.0, cache_modifier=".cg")
            m2k = gl.load(p + 1, mask=m, other=0.0, cache_modifier=".cg")
            n_b = gl.sum(px, axis=0)
            mean_b = gl.sum(gl.expand_dims(px, 1) * mk, axis=0) / n_b
            dev = gl.where(m, mk - gl.expand_dims(mean_b, 0), 0.0)
            m2_b = gl.sum(m2k + gl.expand_dims(px, 1) * (cpg * 1.0) * dev * dev, axis=0)
            n_all = n_seen + n_b
            delta = mean_b - mean
            mean += delta * (n_b / n_all)
            m2 += m2_b + delta * delta * (n_seen * n_b / n_all * cpg)
            n_seen = n_all
        rstd = gl.rsqrt(gl.maximum(m2, 0.0) / ((hw * 1.0) * cpg) + eps)
        return mean, rstd, og, m_g

    @gluon.jit
    def _loader(x_desc, ring, ready, empty, n_samples, hw, n_chunks, chunk_px, per_round, c,
                TILE_P: gl.constexpr, BOX_C: gl.constexpr, SLOTS: gl.constexpr):
        """Streams this program's chunk of each of its samples, channel block by channel block, into the ring."""
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        p0 = j * chunk_px
        n_pt = gl.cdiv(gl.minimum(chunk_px, hw - p0), TILE_P)
        k = 0
        for n in range(first, n_samples, per_round):
            for cb in range(c // BOX_C):
                for t in range(n_pt):
                    slot = k % SLOTS
                    mbarrier.wait(empty.index(slot), ((k // SLOTS) & 1) ^ 1)
                    mbarrier.expect(ready.index(slot), x_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(x_desc, [n * hw + p0 + t * TILE_P, cb * BOX_C], ready.index(slot),
                                                    ring.index(slot))
                    k += 1

    @gluon.jit
    def _compute(ring, ready, empty, ab, res, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count, n_samples, hw,
                 c, groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps,
                 HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                 ACTIVATION: gl.constexpr, HAS_PAD: gl.constexpr, TILE_P: gl.constexpr,
                 BOX_C: gl.constexpr, N_CB_PAD: gl.constexpr, G_PAD: gl.constexpr, CPG_PAD: gl.constexpr,
                 K_BLOCK: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr, PART: gl.constexpr,
                 PARTS: gl.constexpr, empty_off):
        """Statistics, meeting and normalize pass of the rounds i = PART, PART + PARTS, ... of this program."""
        VEC: gl.constexpr = 128 // ring.dtype.primitive_bitwidth                        # 16 bytes per lane
        # normalize: a warp on 4 pixel rows (coalesced stores); statistics: a warp on 4 bytes x 4 lanes of channels
        # and 8 pixel rows, so the sums over a tile's pixels are within the thread but for 3 shuffles (no barrier per
        # channel block; session 20: 8 channels x 32 rows per warp spent ~0.5 us per block on 40 shuffles per
        # sum). Both read the 128-byte-swizzled slots without bank conflicts.
        tile: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // BOX_C, BOX_C // VEC], [WARPS, 1], [1, 0])
        SV: gl.constexpr = 32 // ring.dtype.primitive_bitwidth                          # 4 bytes per lane
        stat: gl.constexpr = gl.BlockedLayout([1, SV], [32 * SV * WARPS // BOX_C, BOX_C // (SV * WARPS)], [1, WARPS],
                                              [1, 0])
        rows = gl.arange(0, TILE_P, layout=gl.SliceLayout(1, tile))                     # [TILE_P]
        cols = gl.arange(0, BOX_C, layout=gl.SliceLayout(0, tile))                      # [BOX_C]
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        p0 = j * chunk_px
        n_px = gl.minimum(chunk_px, hw - p0)
        n_pt = gl.cdiv(n_px, TILE_P)
        n_cb = c // BOX_C
        ab_rows = _rows(ab)                                      # this partition's: rows [2 PART N_CB_PAD, + 2 N_CB_PAD)
        res_rows = _rows(res)                                    # this partition's: rows [PART N_CB_PAD, + n_cb)
        p_scr = p_scr + (pid * PARTS + PART) * (2 * c + 2 * G_PAD)                       # this partition's scratch
        p_grp = p_scr + 2 * c
        for i in range(PART, gl.cdiv(n_samples - first, per_round), PARTS):
            n = first + i * per_round
            k = i * n_cb * n_pt
            if HAS_RESIDUAL:      # the sample's residual row, one load for all channel blocks
                gl.thread_barrier()
                res.slice(PART * N_CB_PAD, N_CB_PAD).store(
                    _channel_rows(p_res + n * stride_rn, stride_rc, c, 0.0, N_CB_PAD, BOX_C, WARPS).to(res.dtype))
                gl.thread_barrier()
            _chunk_stats(ring, ready, res_rows, PART * N_CB_PAD, k, p_scr, p_part + (n * n_chunks + j) * groups * 2,
                         n_pt, n_px, n_cb, cpg, groups, HAS_RESIDUAL, HAS_PAD, TILE_P, BOX_C, G_PAD, CPG_PAD, SLOTS,
                         WARPS, stat)
            mean, rstd, og, m_g = _meet(p_part + n * n_chunks * groups * 2, p_count + n, n_chunks, chunk_px, hw, cpg,
                                        groups, eps, G_PAD, K_BLOCK, WARPS)
            gl.store(p_mean + n * groups + og, mean, mask=m_g & (j == 0))
            gl.store(p_rstd + n * groups + og, rstd, mask=m_g & (j == 0))
            # a_c = w_c rstd_g, b_c = bias_c - mean_g a_c for all channels: one gather through global memory
            gl.store(p_grp + og * 2, mean, mask=m_g)
            gl.store(p_grp + og * 2 + 1, rstd, mask=m_g)
            gl.thread_barrier()
            _affine_table(ab.slice(2 * PART * N_CB_PAD, 2 * N_CB_PAD), p_w, p_b, p_grp, c, cpg, HAS_WEIGHT, HAS_BIAS,
                          N_CB_PAD, BOX_C, WARPS)
            gl.thread_barrier()
            row_base = (n * hw + p0).to(gl.int64) * c
            for cb in range(n_cb):
                ch = cb * BOX_C + cols                                                  # [BOX_C]
                a2 = ab_rows.index(2 * PART * N_CB_PAD + cb).load(tile)                 # [1, BOX_C]
                b2 = ab_rows.index((2 * PART + 1) * N_CB_PAD + cb).load(tile)
                for t in range(n_pt):
                    slot = (k + cb * n_pt + t) % SLOTS
                    s = ring.index(slot).load(tile).to(gl.float32)
                    # this thread's reads of the slot (and the stats pass's write-back of x + r) are generic-proxy
                    # accesses; the loader's next TMA write to it is async-proxy: the fence orders them (session 21:
                    # without it, a few outputs of later rounds were wrong now and then)
                    fence_async_shared()
                    _release_slot(slot, empty_off, WARPS)      # each warp, once it has read its rows
                    z = s * a2 + b2
                    if ACTIVATION == 1:   # z sigmoid(z) = z / (1 + 2^(-z log2 e))
                        z = z * _rcp(1.0 + _ex2(z * _NEG_LOG2E))
                    row = t * TILE_P + rows
                    offs = row_base + gl.expand_dims(row.to(gl.int64) * c, 1) + gl.expand_dims(ch, 0)
                    _store_rows(p_y + offs, z.to(ring.dtype), row, n_px, cols, HAS_PAD)

    @gluon.jit
    def _group_norm_fwd_hopper_cl_kernel(
            x_desc, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count, n_samples, hw, c, groups, cpg,
            n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps, empty_off,
            HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
            HAS_PAD: gl.constexpr, TILE_P: gl.constexpr, BOX_C: gl.constexpr, N_CB_PAD: gl.constexpr,
            G_PAD: gl.constexpr, CPG_PAD: gl.constexpr, K_BLOCK: gl.constexpr, SLOTS: gl.constexpr,
            SMEM: gl.constexpr, WARPS: gl.constexpr, PARTS: gl.constexpr, COMPUTE_REGS: gl.constexpr,
            LOADER_REGS: gl.constexpr):
        ring = gl.allocate_shared_memory(x_desc.dtype, [SLOTS, TILE_P, BOX_C], SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=WARPS)      # one arrive per compute warp (_release_slot)
        # Tables of one [1, BOX_C] row per channel block, per partition: a_c and b_c of the round's sample (fp32), the
        # residual of the round's sample
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        ab = gl.allocate_shared_memory(gl.float32, [PARTS * 2 * N_CB_PAD, BOX_C], flat)
        res = gl.allocate_shared_memory(x_desc.dtype, [PARTS * N_CB_PAD if HAS_RESIDUAL else 1, BOX_C], flat)
        gl.warp_specialize([   # two compute partitions take the rounds in turn, one's meeting beside the other's work
            (_compute, (ring, ready, empty, ab, res, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count,
                        n_samples, hw, c, groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps,
                        HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, TILE_P, BOX_C, N_CB_PAD, G_PAD, CPG_PAD, K_BLOCK, SLOTS,
                        WARPS, 0, 2, empty_off)),
            (_compute, (ring, ready, empty, ab, res, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count,
                        n_samples, hw, c, groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps,
                        HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, TILE_P, BOX_C, N_CB_PAD, G_PAD, CPG_PAD, K_BLOCK, SLOTS,
                        WARPS, 1, 2, empty_off)),
            (_loader, (x_desc, ring, ready, empty, n_samples, hw, n_chunks, chunk_px, per_round, c, TILE_P, BOX_C,
                       SLOTS)),
        ], [WARPS, 1], [COMPUTE_REGS, LOADER_REGS])

    _launch = LaunchCache(_group_norm_fwd_hopper_cl_kernel,
                          ptx_args=lambda ptx, cx: (slot_barrier_offset(ptx, cx["WARPS"], cx["SLOTS"]), ))


_GL_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}


class Plan(NamedTuple):
    tile_p: int         # pixels per TMA box (its other side: BOX_C channels)
    slots: int          # ring slots of one box
    chunk_px: int       # pixels per chunk (a multiple of tile_p)
    n_chunks: int       # K programs per sample
    per_round: int      # samples per round: the grid is per_round * n_chunks <= SMs


def _tables_bytes(c: int, element_size: int) -> int:
    """Shared memory beside the ring: both partitions' a / b tables (fp32) and residual rows."""
    box_c = BOX_BYTES // element_size
    return next_power_of_2(c // box_c) * box_c * PARTS * (2 * 4 + element_size)


def plan(n: int, c: int, hw: int, element_size: int, sms: int) -> Optional[Plan]:
    """The chunking that minimises rounds x chunk pixels (the busiest program's share), ties to fewer rounds;
    chunks of at most half the ring so both partitions' rounds are in flight. None when
    C is not a multiple of a 128-byte channel block, one pixel row of tiles overflows half the ring, a sample
    needs more programs than there are SMs, or the plan would leave more than 1 - MIN_FILL of the SMs' time idle."""
    box_c = BOX_BYTES // element_size
    if c % box_c:
        return None
    n_cb = c // box_c
    ring = SMEM_BYTES - SCRATCH_BYTES - _tables_bytes(c, element_size)
    slots = ring // (TILE_P * BOX_BYTES + 16)              # + the slot's two mbarriers
    n_pt = cdiv(hw, TILE_P)
    best = None
    for t in range(1, slots // PARTS // n_cb + 1):
        k = cdiv(n_pt, t)
        if k > sms:
            continue
        per_round = min(sms // k, n)
        rounds = cdiv(n, per_round)
        cost = (rounds * t * TILE_P, rounds)
        if best is None or cost < best[0]:
            best = (cost, Plan(TILE_P, slots, t * TILE_P, k, per_round))
    if best is None or n * hw < MIN_FILL * best[0][0] * sms:
        return None
    return best[1]


def eligible(x: torch.Tensor, num_groups: int, activation: str, residual_strides, y: torch.Tensor) -> bool:
    """Whether this kernel runs the forward of x into y: 4-D channels_last x and y (dense), 16-byte aligned, fp16 /
    bf16 / fp32, C a multiple of 128 bytes of channels, two chunks of a pixel tile of all C channels within the
    ring, no residual or one broadcast over the pixels, activation None / SiLU, on sm_90 with triton 3.6."""
    if activation not in ACTIVATIONS or x.dtype not in _GL_BITS or x.dim() != 4 or not available(x.device):
        return False
    cl = torch.channels_last
    if not x.is_contiguous(memory_format=cl) or not y.is_contiguous(memory_format=cl) or x.is_contiguous():
        return False
    if residual_strides is not None and residual_strides[2] != 0:
        return False
    if x.data_ptr() % 16 or y.data_ptr() % 16 or x.numel() == 0:
        return False
    n, c = x.shape[0], x.shape[1]
    return plan(n, c, x.numel() // (n * c), x.element_size(), sm_count(x.device)) is not None


def forward(x, num_groups, weight, bias, eps, activation, residual, residual_strides, y, mean, rstd):
    """y, mean, rstd of act(GN(x + residual)) for an eligible x (see eligible); residual: the residual expanded to
    x's shape (a strided view), or None."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg = c // num_groups
    box_c = BOX_BYTES // x.element_size()
    p = plan(n, c, hw, x.element_size(), sm_count(x.device))
    grid = p.per_round * p.n_chunks
    bits = _GL_BITS[x.dtype]
    layout = gl.NVMMASharedLayout(swizzle_byte_width=BOX_BYTES, element_bitwidth=bits, rank=2)
    g_pad = next_power_of_2(num_groups)
    part = torch.empty(n * p.n_chunks * num_groups * 2 + grid * PARTS * (2 * c + 2 * g_pad), dtype=torch.float32,
                       device=x.device)
    scratch = part[n * p.n_chunks * num_groups * 2:]
    count = torch.zeros(n, dtype=torch.int32, device=x.device)
    bind_cuda_context()
    x_desc = host_descriptor(x, [n * hw, c], [c, 1], [p.tile_p, box_c], layout)
    dummy = mean
    _launch((grid, ), x_desc, dummy if residual is None else residual, dummy if weight is None else weight,
            dummy if bias is None else bias, y, mean, rstd, part, scratch, count, n, hw, c, num_groups, cpg,
            p.n_chunks, p.chunk_px, p.per_round, *(residual_strides[:2] if residual is not None else (0, 0)),
            float(eps),
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            ACTIVATION=ACTIVATIONS.index(activation), HAS_PAD=hw % p.tile_p != 0, TILE_P=p.tile_p, BOX_C=box_c,
            N_CB_PAD=next_power_of_2(c // box_c), G_PAD=g_pad, CPG_PAD=next_power_of_2(cpg),
            K_BLOCK=min(K_BLOCK_MAX, next_power_of_2(p.n_chunks)), SLOTS=p.slots, SMEM=layout, WARPS=COMPUTE_WARPS,
            PARTS=PARTS, COMPUTE_REGS=COMPUTE_REGS, LOADER_REGS=LOADER_REGS, num_warps=COMPUTE_WARPS)
    return y, mean, rstd
