"""GroupNorm backward for Hopper in Gluon, channels_last: x and dy read from HBM once, each sample split over programs
that meet.

The Triton plans read x and dy twice (the group sums, then dx). As in _hopper_fwd_cl.py, a sample of channels_last x
(N, C, H, W), [N, HW, C] in memory, is cut into K chunks of pixels x all C channels, x and dy of each held in the ring
(at most MAX_CHUNK_TILES tiles), and the K programs holding one sample's chunks meet once through global memory:

    loader (1 warp)        the chunk's x and dy [TILE_P pixels, BOX_C channels] tiles by TMA into the ring (slot k:
                           x tile k and dy tile k), channel block by channel block
    compute (2 x WARPS)    per round (partitions take rounds in turn):
        tables   per channel of the round's sample (one [1, BOX_C] row per channel block, shared memory):
                 A_c = rstd_g, B_c = -mean_g rstd_g, the time embedding r_c; w_c, b_c once per kernel
        sums     per channel block and pixel tile, s = x (+ r_c, rounded to x's dtype like the forward, written back
                 to the slot), x_hat = s A + B, z = x_hat w + b, dz = dy act'(z), summed over the chunk's pixels:
                     per channel   S_dz, S_dzx = sum dz x_hat (the db, dw partials), S_x = sum x_hat (time embedding)
                 within the thread but for 3 shuffles (the forward's statistics layout); then per group
                     g_k = sum_c w_c S_dz,   gx_k = sum_c w_c S_dzx
        meet     (K > 1) (g_k, gx_k) per group stored, a release increment of the sample's counter, spin (acquire)
                 until the K chunks are in, summed in chunk order (deterministic): m1 = mean(g), m2 = mean(g x_hat)
                 per group (g = dz w), and the tables P1_c = A_c m2, P0_c = A_c m1; the time embedding's gradient
                 of the chunk per channel, sum over its pixels of dx = A (w S_dz - m2 S_x - m1 P_k), in place of S_x
        dx       dx = dz (A w) - x_hat P1 - P0 from the slots (each released after its read, behind a proxy fence,
                 as in _hopper_fwd_cl.py)

The per-chunk sums [N, K, 3, C] (S_dz, S_dzx, the time embedding's gradient) are reduced by torch: dw, db over
(N, K), dresidual over K. Chunks of at most MAX_CHUNK_TILES tiles may fill more than half the ring (SD's C = 640:
10 of 11 slots), so the loader streams a partition's next chunk only as the other's dx pass frees slots; larger
chunks (fewer rounds and meetings) measured faster in the NCHW backward (_hopper_bwd.py, session 24). Boxes past a
sample's pixels hold the next sample's (or TMA's zeros): masked in the sums (HAS_PAD) and the dx stores. Program pid
holds chunk pid % K of the samples pid // K, pid // K + S, ... (S = SMs // K samples per round): all K programs of a
sample are in the same round, and the grid (S K <= SMs, one program per SM by its shared memory) is resident at
once, so a spin never waits on a program that is not running. The math is _hopper_bwd.py's (fp32 sums, SiLU' with
the exponent clamp, MUFU ex2 and rcp). Activations None / SiLU, no residual or one broadcast over the pixels; the
rest stays with the Triton plans (group_norm.py), as does everything off sm_90 with triton 3.6.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch

from .._triton import LaunchCache, cdiv, next_power_of_2, sm_count
from ..attention.flash_fwd_hopper import available, bind_cuda_context, gluon, host_descriptor
from ._hopper_fwd import ACTIVATIONS, COMPUTE_REGS, LOADER_REGS
from ._hopper_fwd_cl import BOX_BYTES, K_BLOCK_MAX, MIN_FILL, SMEM_BYTES

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    from ._hopper_bwd import _silu_grad, _stage
    from ._hopper_fwd import _arrive_and_wait, _store_rows
    from ._hopper_fwd_cl import _channel_index, _rows

TILE_P = 64                       # pixels per tile: x + dy boxes of 2 x 8 KB per slot
SCRATCH_BYTES = 4096              # beside the ring and the tables: barriers and the reductions' scratch
MAX_CHUNK_TILES = 10              # a chunk's (x + dy) tiles, at most (as _hopper_bwd.py)
MAX_GROUPS = 64                   # the per-group vectors sit whole in each warp (8 values a thread at 64 groups; at
                                  # 320-640 groups they spilled 11-25 KB a thread, offline ptxas, session 25)
MEET_ELEMENTS = 2048              # chunks x groups summed per step of the meeting (8 values per thread)
N_SUMS = 3                        # per chunk and channel: S_dz, S_dzx, the time embedding's gradient
# Compute partitions x warps each (beside the one-warp loader). SD's chunks fill the ring, so a second partition's
# round could only start as the first's dx pass frees slots: PARTS_BWD_CL = 1 gives all the compute warps to one round.
PARTS_BWD_CL, WARPS_BWD_CL = 1, 16

if gluon is not None:
    # The tables (one [1, BOX_C] row per channel block, N_CB_PAD rows each) are written with one gather and one store
    # each: written row by row, each store waited on its own L2 round trip behind the barrier the compiler puts between
    # stores to one buffer (offline SASS, session 25), and tensors have power-of-two shapes.
    @gluon.jit
    def _sample_tables(coef, res, p_res_n, p_mean_n, p_rstd_n, cpg, stride_rc, C0: gl.constexpr, R0: gl.constexpr,
                       HAS_RESIDUAL: gl.constexpr, N_CB: gl.constexpr, N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr,
                       WARPS: gl.constexpr):
        """The round's sample: coef rows C0 + [0, N_CB_PAD) A_c = rstd_g, C0 + [N_CB_PAD, 2 N_CB_PAD)
        B_c = -mean_g rstd_g; res rows R0 + [0, N_CB_PAD) its residual r_c (x's dtype)."""
        ch = _channel_index(N_CB_PAD, BOX_C, WARPS)                                     # [N_CB_PAD, BOX_C]
        m = ch < N_CB * BOX_C
        rstd = gl.load(p_rstd_n + ch // cpg, mask=m, other=0.0)
        coef.slice(C0, N_CB_PAD).store(rstd)
        coef.slice(C0 + N_CB_PAD, N_CB_PAD).store(-gl.load(p_mean_n + ch // cpg, mask=m, other=0.0) * rstd)
        if HAS_RESIDUAL:
            res.slice(R0, N_CB_PAD).store(gl.load(p_res_n + ch * stride_rc, mask=m, other=0.0).to(res.dtype))

    @gluon.jit
    def _dx_tables(coef, p_grp, p_sums_u, p_w, n_px, cpg, C0: gl.constexpr, HAS_WEIGHT: gl.constexpr,
                   HAS_DRES: gl.constexpr, N_CB: gl.constexpr, N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr,
                   WARPS: gl.constexpr):
        """coef rows C0 + [2 N_CB_PAD, 3 N_CB_PAD): P1_c = A_c m2_g, C0 + [3 N_CB_PAD, 4 N_CB_PAD): P0_c = A_c m1_g
        (p_grp: (m1, m2) per group, just stored by this partition); with HAS_DRES the chunk's time-embedding gradient
        per channel, A (w S_dz - m2 S_x - m1 n_px), in place of S_x."""
        C: gl.constexpr = N_CB * BOX_C
        ch = _channel_index(N_CB_PAD, BOX_C, WARPS)                                     # [N_CB_PAD, BOX_C]
        m = ch < C
        a = coef.slice(C0, N_CB_PAD).load(ch.type.layout)
        m1 = gl.load(p_grp + (ch // cpg) * 2, mask=m, other=0.0, cache_modifier=".cg")
        m2 = gl.load(p_grp + (ch // cpg) * 2 + 1, mask=m, other=0.0, cache_modifier=".cg")
        coef.slice(C0 + 2 * N_CB_PAD, N_CB_PAD).store(a * m2)
        coef.slice(C0 + 3 * N_CB_PAD, N_CB_PAD).store(a * m1)
        if HAS_DRES:
            s_dz = gl.load(p_sums_u + ch, mask=m, other=0.0)
            if HAS_WEIGHT:
                s_dz = s_dz * gl.load(p_w + ch, mask=m, other=0.0).to(gl.float32)
            s_x = gl.load(p_sums_u + 2 * C + ch, mask=m, other=0.0)
            gl.store(p_sums_u + 2 * C + ch, a * (s_dz - m2 * s_x - m1 * n_px.to(gl.float32)), mask=m)

    @gluon.jit
    def _affine(wb_rows, cb, lay: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr):
        """(w, b) of channel block cb as fp32 [1, BOX_C] in layout lay (1 and 0 when absent)."""
        w = gl.full([1, BOX_C], 1.0, gl.float32, lay)
        b = gl.zeros([1, BOX_C], gl.float32, lay)
        if HAS_WEIGHT:
            w = wb_rows.index(cb).load(lay)
        if HAS_BIAS:
            b = wb_rows.index(N_CB_PAD + cb).load(lay)
        return w, b

    @gluon.jit
    def _grad_cols(s, dy, a2, b2, w2, bias2, ACTIVATION: gl.constexpr):
        """x_hat = s A + B and dz = dy act'(x_hat w + b) per column (A, B, w, b [1, BOX_C])."""
        x_hat = s * a2 + b2
        dz = dy
        if ACTIVATION == 1:
            dz = _silu_grad(x_hat * w2 + bias2, dy)
        return x_hat, dz

    @gluon.jit
    def _chunk_sums(x_ring, dy_ring, ready, coef_rows, wb_rows, res_rows, k, p_sums_u, n_pt, n_px, C0: gl.constexpr,
                    R0: gl.constexpr, HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                    ACTIVATION: gl.constexpr, HAS_DRES: gl.constexpr, HAS_PAD: gl.constexpr, TILE_P: gl.constexpr,
                    N_CB: gl.constexpr, N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr, SLOTS: gl.constexpr,
                    stat: gl.constexpr):
        """Per channel of the chunk (n_px pixels, n_pt tiles per channel block, from the program's tile k): S_dz,
        S_dzx (and S_x) -> p_sums_u[{0, 1, 2} C + channel]."""
        C: gl.constexpr = N_CB * BOX_C
        rows = gl.arange(0, TILE_P, layout=gl.SliceLayout(1, stat))                    # [TILE_P]
        cols = gl.arange(0, BOX_C, layout=gl.SliceLayout(0, stat))                     # [BOX_C]
        r = gl.zeros([1, BOX_C], gl.float32, stat)
        for cb in range(N_CB):
            a2 = coef_rows.index(C0 + cb).load(stat)                                    # [1, BOX_C]
            b2 = coef_rows.index(C0 + N_CB_PAD + cb).load(stat)
            w2, bias2 = _affine(wb_rows, cb, stat, HAS_WEIGHT and ACTIVATION == 1, HAS_BIAS, N_CB_PAD, BOX_C)
            if HAS_RESIDUAL:
                r = res_rows.index(R0 + cb).load(stat).to(gl.float32)
            s_dz = gl.zeros([BOX_C], gl.float32, gl.SliceLayout(0, stat))
            s_dzx = gl.zeros([BOX_C], gl.float32, gl.SliceLayout(0, stat))
            s_x = gl.zeros([BOX_C], gl.float32, gl.SliceLayout(0, stat))
            for t in range(n_pt):
                s, dy = _stage(x_ring, dy_ring, ready, k + cb * n_pt + t, r, HAS_RESIDUAL, SLOTS, stat)
                x_hat, dz = _grad_cols(s, dy, a2, b2, w2, bias2, ACTIVATION)
                if HAS_PAD:   # rows past the chunk's pixels: another sample's, or zeros
                    valid = gl.expand_dims(t * TILE_P + rows < n_px, 1)
                    x_hat = gl.where(valid, x_hat, 0.0)
                    dz = gl.where(valid, dz, 0.0)
                s_dz += gl.sum(dz, axis=0)
                s_dzx += gl.sum(dz * x_hat, axis=0)
                if HAS_DRES:
                    s_x += gl.sum(x_hat, axis=0)
            gl.store(p_sums_u + cb * BOX_C + cols, s_dz)
            gl.store(p_sums_u + C + cb * BOX_C + cols, s_dzx)
            if HAS_DRES:
                gl.store(p_sums_u + 2 * C + cb * BOX_C + cols, s_x)

    @gluon.jit
    def _group_sums(p_sums_u, p_w, cpg, groups, HAS_WEIGHT: gl.constexpr, N_CB: gl.constexpr, BOX_C: gl.constexpr,
                    G_PAD: gl.constexpr, CPG_PAD: gl.constexpr, WARPS: gl.constexpr):
        """(g_k, gx_k) per group [G_PAD] of the chunk from its per-channel sums (just stored by this partition), and the
        groups' index."""
        C: gl.constexpr = N_CB * BOX_C
        grp: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])
        og = gl.arange(0, G_PAD, layout=gl.SliceLayout(1, grp))                         # [G_PAD]
        oj = gl.arange(0, CPG_PAD, layout=gl.SliceLayout(0, grp))                       # [CPG_PAD]
        m = gl.expand_dims(og < groups, 1) & gl.expand_dims(oj < cpg, 0)
        ch = gl.expand_dims(og * cpg, 1) + gl.expand_dims(oj, 0)                        # [G_PAD, CPG_PAD]
        s_dz = gl.load(p_sums_u + ch, mask=m, other=0.0)
        s_dzx = gl.load(p_sums_u + C + ch, mask=m, other=0.0)
        if HAS_WEIGHT:
            w = gl.load(p_w + ch, mask=m, other=0.0).to(gl.float32)
            s_dz = s_dz * w
            s_dzx = s_dzx * w
        return gl.sum(s_dz, axis=1), gl.sum(s_dzx, axis=1), og

    @gluon.jit
    def _meet_sums(p_part_n, p_count_n, g, gx, og, n_chunks, groups, G_PAD: gl.constexpr, K_BLOCK: gl.constexpr,
                   WARPS: gl.constexpr):
        """Publishes this chunk's (g_k, gx_k) per group, waits until the sample's n_chunks are in, and returns the sums
        over the chunks (in chunk order, K_BLOCK per step) [G_PAD] and the groups' index."""
        j = gl.program_id(0) % n_chunks
        gl.store(p_part_n + (j * groups + og) * 2, g, mask=og < groups)
        gl.store(p_part_n + (j * groups + og) * 2 + 1, gx, mask=og < groups)
        _arrive_and_wait(p_count_n, n_chunks)
        # chunks across the lanes, groups across the warps: the sums over chunks stay within a warp (no scratch in
        # shared memory, which a cross-warp sum needs per group: at 128+ groups it overflowed the ring's budget)
        kl: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, WARPS], [0, 1])
        og = gl.arange(0, G_PAD, layout=gl.SliceLayout(0, kl))                          # [G_PAD]
        g = gl.zeros([G_PAD], gl.float32, gl.SliceLayout(0, kl))
        gx = gl.zeros([G_PAD], gl.float32, gl.SliceLayout(0, kl))
        for k0 in range(0, n_chunks, K_BLOCK):
            ok = k0 + gl.arange(0, K_BLOCK, layout=gl.SliceLayout(1, kl))               # [K_BLOCK]
            m = gl.expand_dims(ok < n_chunks, 1) & gl.expand_dims(og < groups, 0)
            p = p_part_n + (gl.expand_dims(ok * groups, 1) + gl.expand_dims(og, 0)) * 2
            g += gl.sum(gl.load(p, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
            gx += gl.sum(gl.load(p + 1, mask=m, other=0.0, cache_modifier=".cg"), axis=0)
        return g, gx, og

    @gluon.jit
    def _loader(x_desc, dy_desc, x_ring, dy_ring, ready, empty, n_samples, hw, n_chunks, chunk_px, per_round,
                TILE_P: gl.constexpr, N_CB: gl.constexpr, BOX_C: gl.constexpr, SLOTS: gl.constexpr):
        """Streams this program's chunk of each of its samples, x and dy channel block by channel block, into the ring;
        tile k goes to slot k % SLOTS once the compute warps released the tile k - SLOTS that was there."""
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        p0 = j * chunk_px
        n_pt = gl.cdiv(gl.minimum(chunk_px, hw - p0), TILE_P)
        k = 0
        for n in range(first, n_samples, per_round):
            for cb in range(N_CB):
                for t in range(n_pt):
                    slot = k % SLOTS
                    mbarrier.wait(empty.index(slot), ((k // SLOTS) & 1) ^ 1)
                    mbarrier.expect(ready.index(slot), 2 * x_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(x_desc, [n * hw + p0 + t * TILE_P, cb * BOX_C], ready.index(slot),
                                                    x_ring.index(slot))
                    tma.async_copy_global_to_shared(dy_desc, [n * hw + p0 + t * TILE_P, cb * BOX_C],
                                                    ready.index(slot), dy_ring.index(slot))
                    k += 1

    @gluon.jit
    def _compute(x_ring, dy_ring, ready, empty, coef, wb, res, p_res, p_w, p_mean, p_rstd, p_dx, p_sums, p_part,
                 p_scr, p_count, n_samples, hw, groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc,
                 inv_numel,
                 HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                 ACTIVATION: gl.constexpr, HAS_DRES: gl.constexpr, HAS_PAD: gl.constexpr, MEET: gl.constexpr,
                 TILE_P: gl.constexpr, N_CB: gl.constexpr, N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr,
                 G_PAD: gl.constexpr, CPG_PAD: gl.constexpr, K_BLOCK: gl.constexpr, SLOTS: gl.constexpr,
                 WARPS: gl.constexpr, PART: gl.constexpr, PARTS: gl.constexpr):
        """Tables, sums, meeting and dx pass of the rounds i = PART, PART + PARTS, ... of this program (module
        docstring)."""
        C: gl.constexpr = N_CB * BOX_C
        NS: gl.constexpr = 3 if HAS_DRES else 2
        C0: gl.constexpr = PART * 4 * N_CB_PAD                                          # this partition's coef rows
        R0: gl.constexpr = PART * N_CB_PAD                                              # and residual rows
        VEC: gl.constexpr = 128 // x_ring.dtype.primitive_bitwidth                     # 16 bytes per lane
        SV: gl.constexpr = 32 // x_ring.dtype.primitive_bitwidth                       # 4 bytes per lane
        # dx: a warp on 4 pixel rows (coalesced stores); sums: a warp on 4 bytes x 4 lanes of channels and 8 pixel
        # rows (sums over a tile's pixels within the thread but for 3 shuffles), as _hopper_fwd_cl.py
        tile: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // BOX_C, BOX_C // VEC], [WARPS, 1], [1, 0])
        stat: gl.constexpr = gl.BlockedLayout([1, SV], [32 * SV * WARPS // BOX_C, BOX_C // (SV * WARPS)], [1, WARPS],
                                              [1, 0])
        dtype: gl.constexpr = x_ring.dtype
        rows = gl.arange(0, TILE_P, layout=gl.SliceLayout(1, tile))                     # [TILE_P]
        cols = gl.arange(0, BOX_C, layout=gl.SliceLayout(0, tile))                      # [BOX_C]
        coef_rows, res_rows, wb_rows = _rows(coef), _rows(res), _rows(wb)
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        p0 = j * chunk_px
        n_px = gl.minimum(chunk_px, hw - p0)
        n_pt = gl.cdiv(n_px, TILE_P)
        p_grp = p_scr + (pid * PARTS + PART) * 2 * G_PAD                                # (m1, m2) per group
        for i in range(PART, gl.cdiv(n_samples - first, per_round), PARTS):
            n = first + i * per_round
            k = i * N_CB * n_pt
            p_sums_u = p_sums + (n * n_chunks + j).to(gl.int64) * NS * C                # this chunk's sums
            gl.thread_barrier()              # the partition's previous round is done with its tables
            _sample_tables(coef, res, p_res + n * stride_rn, p_mean + n * groups, p_rstd + n * groups, cpg, stride_rc,
                           C0, R0, HAS_RESIDUAL, N_CB, N_CB_PAD, BOX_C, WARPS)
            gl.thread_barrier()
            _chunk_sums(x_ring, dy_ring, ready, coef_rows, wb_rows, res_rows, k, p_sums_u, n_pt, n_px, C0, R0,
                        HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_DRES, HAS_PAD, TILE_P, N_CB, N_CB_PAD,
                        BOX_C, SLOTS, stat)
            gl.thread_barrier()
            g, gx, og = _group_sums(p_sums_u, p_w, cpg, groups, HAS_WEIGHT, N_CB, BOX_C, G_PAD, CPG_PAD, WARPS)
            if MEET:
                g, gx, og = _meet_sums(p_part + n * n_chunks * groups * 2, p_count + n, g, gx, og, n_chunks, groups,
                                       G_PAD, K_BLOCK, WARPS)
            gl.store(p_grp + og * 2, g * inv_numel, mask=og < groups)
            gl.store(p_grp + og * 2 + 1, gx * inv_numel, mask=og < groups)
            gl.thread_barrier()
            _dx_tables(coef, p_grp, p_sums_u, p_w, n_px, cpg, C0, HAS_WEIGHT, HAS_DRES, N_CB, N_CB_PAD, BOX_C, WARPS)
            gl.thread_barrier()
            # dx; each slot released once every warp of the partition has read it
            row_base = (n * hw + p0).to(gl.int64) * C
            for cb in range(N_CB):
                a2 = coef_rows.index(C0 + cb).load(tile)                                # [1, BOX_C]
                b2 = coef_rows.index(C0 + N_CB_PAD + cb).load(tile)
                p1 = coef_rows.index(C0 + 2 * N_CB_PAD + cb).load(tile)
                p0c = coef_rows.index(C0 + 3 * N_CB_PAD + cb).load(tile)
                w2, bias2 = _affine(wb_rows, cb, tile, HAS_WEIGHT, HAS_BIAS, N_CB_PAD, BOX_C)
                aw = a2 * w2
                for t in range(n_pt):
                    slot = (k + cb * n_pt + t) % SLOTS
                    s = x_ring.index(slot).load(tile).to(gl.float32)
                    dy = dy_ring.index(slot).load(tile).to(gl.float32)
                    fence_async_shared()      # these generic reads (and the write-back) before the next TMA write
                    gl.thread_barrier()
                    mbarrier.arrive(empty.index(slot), count=1)
                    x_hat, dz = _grad_cols(s, dy, a2, b2, w2, bias2, ACTIVATION)
                    dx = dz * aw - (x_hat * p1 + p0c)
                    px = t * TILE_P + rows
                    offs = row_base + gl.expand_dims(px.to(gl.int64) * C, 1) + gl.expand_dims(cb * BOX_C + cols, 0)
                    _store_rows(p_dx + offs, dx.to(dtype), px, n_px, cols, HAS_PAD)

    @gluon.jit
    def _group_norm_bwd_hopper_cl_kernel(
            x_desc, dy_desc, p_res, p_w, p_b, p_mean, p_rstd, p_dx, p_sums, p_part, p_scr, p_count, n_samples, hw,
            groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, inv_numel,
            HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
            HAS_DRES: gl.constexpr, HAS_PAD: gl.constexpr, MEET: gl.constexpr, TILE_P: gl.constexpr,
            N_CB: gl.constexpr, N_CB_PAD: gl.constexpr, BOX_C: gl.constexpr, G_PAD: gl.constexpr,
            CPG_PAD: gl.constexpr, K_BLOCK: gl.constexpr, SLOTS: gl.constexpr, SMEM: gl.constexpr,
            WARPS: gl.constexpr, PARTS: gl.constexpr, COMPUTE_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        x_ring = gl.allocate_shared_memory(x_desc.dtype, [SLOTS, TILE_P, BOX_C], SMEM)
        dy_ring = gl.allocate_shared_memory(dy_desc.dtype, [SLOTS, TILE_P, BOX_C], SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        # per partition A, B, P1, P0 (fp32) and the residual (x's dtype) of the round's sample; w and b (fp32) of the
        # kernel, written here once, before the partitions start
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        coef = gl.allocate_shared_memory(gl.float32, [PARTS * 4 * N_CB_PAD, BOX_C], flat)
        res = gl.allocate_shared_memory(x_desc.dtype, [PARTS * N_CB_PAD if HAS_RESIDUAL else 1, BOX_C], flat)
        wb = gl.allocate_shared_memory(gl.float32, [2 * N_CB_PAD if HAS_WEIGHT or HAS_BIAS else 1, BOX_C], flat)
        ch = _channel_index(N_CB_PAD, BOX_C, WARPS)
        if HAS_WEIGHT:
            wb.slice(0, N_CB_PAD).store(gl.load(p_w + ch, mask=ch < N_CB * BOX_C, other=0.0).to(gl.float32))
        if HAS_BIAS:
            wb.slice(N_CB_PAD, N_CB_PAD).store(gl.load(p_b + ch, mask=ch < N_CB * BOX_C, other=0.0).to(gl.float32))
        gl.thread_barrier()
        if PARTS == 1:
            gl.warp_specialize([
                (_compute, (x_ring, dy_ring, ready, empty, coef, wb, res, p_res, p_w, p_mean, p_rstd, p_dx, p_sums,
                            p_part, p_scr, p_count, n_samples, hw, groups, cpg, n_chunks, chunk_px, per_round,
                            stride_rn, stride_rc, inv_numel, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_DRES,
                            HAS_PAD, MEET, TILE_P, N_CB, N_CB_PAD, BOX_C, G_PAD, CPG_PAD, K_BLOCK, SLOTS, WARPS, 0, 1)),
                (_loader, (x_desc, dy_desc, x_ring, dy_ring, ready, empty, n_samples, hw, n_chunks, chunk_px,
                           per_round, TILE_P, N_CB, BOX_C, SLOTS)),
            ], [1], [LOADER_REGS])
        else:   # two compute partitions take the rounds in turn, one's meeting beside the other's work
            gl.warp_specialize([
                (_compute, (x_ring, dy_ring, ready, empty, coef, wb, res, p_res, p_w, p_mean, p_rstd, p_dx, p_sums,
                            p_part, p_scr, p_count, n_samples, hw, groups, cpg, n_chunks, chunk_px, per_round,
                            stride_rn, stride_rc, inv_numel, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_DRES,
                            HAS_PAD, MEET, TILE_P, N_CB, N_CB_PAD, BOX_C, G_PAD, CPG_PAD, K_BLOCK, SLOTS, WARPS, 0, 2)),
                (_compute, (x_ring, dy_ring, ready, empty, coef, wb, res, p_res, p_w, p_mean, p_rstd, p_dx, p_sums,
                            p_part, p_scr, p_count, n_samples, hw, groups, cpg, n_chunks, chunk_px, per_round,
                            stride_rn, stride_rc, inv_numel, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_DRES,
                            HAS_PAD, MEET, TILE_P, N_CB, N_CB_PAD, BOX_C, G_PAD, CPG_PAD, K_BLOCK, SLOTS, WARPS, 1, 2)),
                (_loader, (x_desc, dy_desc, x_ring, dy_ring, ready, empty, n_samples, hw, n_chunks, chunk_px,
                           per_round, TILE_P, N_CB, BOX_C, SLOTS)),
            ], [WARPS, 1], [COMPUTE_REGS, LOADER_REGS])

    _launch = LaunchCache(_group_norm_bwd_hopper_cl_kernel)


_GL_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}


class Plan(NamedTuple):
    slots: int          # ring slots of one x + dy box pair
    chunk_px: int       # pixels per chunk (a multiple of TILE_P)
    n_chunks: int       # K programs per sample
    per_round: int      # samples per round: the grid is per_round * n_chunks <= SMs


def _tables_bytes(n_cb: int, element_size: int, parts: int) -> int:
    """Shared memory beside the ring: each partition's A / B / P1 / P0 rows and residual rows, w / b rows."""
    box_c = BOX_BYTES // element_size
    return next_power_of_2(n_cb) * box_c * (parts * (4 * 4 + element_size) + 2 * 4)


def plan(n: int, c: int, hw: int, element_size: int, sms: int) -> Optional[Plan]:
    """The chunking of at most MAX_CHUNK_TILES tiles (t pixel tiles x all channel blocks) that minimises rounds x chunk
    pixels (the busiest program's share), ties to fewer rounds. None when C is not a multiple of a 128-byte channel
    block, one pixel tile of all C overflows MAX_CHUNK_TILES or the ring, a sample needs more programs than there are
    SMs, or the plan would leave more than 1 - MIN_FILL of the SMs' time idle."""
    return _chunking(n, c, hw, element_size, sms, MIN_FILL, PARTS_BWD_CL)


@functools.lru_cache(maxsize=1024)
def _chunking(n: int, c: int, hw: int, element_size: int, sms: int, min_fill: float, parts: int) -> Optional[Plan]:
    """plan(), cached per call signature (eligible and the launcher both ask, every call)."""
    box_c = BOX_BYTES // element_size
    if c % box_c:
        return None
    n_cb = c // box_c
    slots = (SMEM_BYTES - SCRATCH_BYTES - _tables_bytes(n_cb, element_size, parts)) // (2 * TILE_P * BOX_BYTES + 16)
    n_pt = cdiv(hw, TILE_P)
    best = None
    for t in range(1, min(MAX_CHUNK_TILES, slots) // n_cb + 1):
        k = cdiv(n_pt, t)
        if k > sms:
            continue
        per_round = min(sms // k, n)
        rounds = cdiv(n, per_round)
        cost = (rounds * t, rounds)
        if best is None or cost < best[0]:
            best = (cost, Plan(slots, t * TILE_P, k, per_round))
    if best is None or n * hw < min_fill * best[0][0] * TILE_P * sms:
        return None
    return best[1]


def eligible(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, num_groups: int, activation: str,
             residual_strides) -> bool:
    """Whether this kernel runs the backward of x: 4-D channels_last x, dy and dx (dense), 16-byte aligned, fp16 / bf16
    / fp32, at most MAX_GROUPS groups, a plan (see plan), no residual or one broadcast over the pixels
    (residual_strides: the expanded residual's (stride_n, stride_c, stride_hw), or None; in x's dtype, as group_norm
    checks), activation None / SiLU, on sm_90 with triton 3.6."""
    if activation not in ACTIVATIONS or x.dtype not in _GL_BITS or dy.dtype != x.dtype or x.dim() != 4:
        return False
    if num_groups > MAX_GROUPS or not available(x.device) or x.numel() == 0 or x.is_contiguous():
        return False
    cl = torch.channels_last
    if not all(t.is_contiguous(memory_format=cl) for t in (x, dy, dx)):
        return False
    if residual_strides is not None and residual_strides[2] != 0:
        return False
    if x.data_ptr() % 16 or dy.data_ptr() % 16 or dx.data_ptr() % 16:
        return False
    n, c = x.shape[0], x.shape[1]
    return plan(n, c, x.numel() // (n * c), x.element_size(), sm_count(x.device)) is not None


def backward(dy, x, residual, residual_strides, weight, bias, mean, rstd, num_groups, activation, dx, compute_dw,
             compute_db, compute_dres, alloc):
    """dx (written into dx), and dw, db (fp32 (C,)) and the broadcast residual's gradient summed over the pixels (fp32
    (N, C)), None where not asked, for an eligible x; residual: expanded to x's shape (a strided view), or None;
    alloc(shape, dtype, device): group_norm's allocator of the buffers the kernel writes."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg, box_c = c // num_groups, BOX_BYTES // x.element_size()
    p = plan(n, c, hw, x.element_size(), sm_count(x.device))
    grid = p.per_round * p.n_chunks
    n_sums = N_SUMS if compute_dres else N_SUMS - 1
    g_pad = next_power_of_2(num_groups)
    sums = alloc((n, p.n_chunks, n_sums, c), torch.float32, x.device)        # per chunk: S_dz, S_dzx (, dres)
    parts, warps = PARTS_BWD_CL, WARPS_BWD_CL
    scratch = alloc((grid * parts * 2 * g_pad, ), torch.float32, x.device)
    meet = p.n_chunks > 1       # the meeting's partials and zeroed counters (a memset launch: none without a meeting)
    part = alloc((n * p.n_chunks * num_groups * 2, ), torch.float32, x.device) if meet else mean
    count = torch.zeros(n, dtype=torch.int32, device=x.device) if meet else mean
    layout = gl.NVMMASharedLayout(swizzle_byte_width=BOX_BYTES, element_bitwidth=_GL_BITS[x.dtype], rank=2)
    bind_cuda_context()
    x_desc = host_descriptor(x, [n * hw, c], [c, 1], [TILE_P, box_c], layout)
    dy_desc = host_descriptor(dy, [n * hw, c], [c, 1], [TILE_P, box_c], layout)
    dummy = mean
    _launch((grid, ), x_desc, dy_desc, dummy if residual is None else residual, dummy if weight is None else weight,
            dummy if bias is None else bias, mean, rstd, dx, sums, part, scratch, count, n, hw, num_groups, cpg,
            p.n_chunks, p.chunk_px, p.per_round, *(residual_strides[:2] if residual is not None else (0, 0)),
            1.0 / (cpg * hw),
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None,
            HAS_BIAS=bias is not None and activation != "none", ACTIVATION=ACTIVATIONS.index(activation),
            HAS_DRES=compute_dres, HAS_PAD=hw % TILE_P != 0, MEET=meet, TILE_P=TILE_P, N_CB=c // box_c,
            N_CB_PAD=next_power_of_2(c // box_c), BOX_C=box_c, G_PAD=g_pad, CPG_PAD=next_power_of_2(cpg),
            K_BLOCK=min(K_BLOCK_MAX, next_power_of_2(p.n_chunks), max(1, MEET_ELEMENTS // g_pad)), SLOTS=p.slots,
            SMEM=layout, WARPS=warps, PARTS=parts, COMPUTE_REGS=COMPUTE_REGS, LOADER_REGS=LOADER_REGS,
            num_warps=warps)
    dw_db = sums[:, :, :2].sum((0, 1)) if compute_dw or compute_db else None                     # [2, C]
    dres = sums[:, :, 2].sum(1) if compute_dres else None
    return (dw_db[1] if compute_dw else None), (dw_db[0] if compute_db else None), dres
