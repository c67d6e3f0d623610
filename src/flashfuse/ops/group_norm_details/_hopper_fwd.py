"""GroupNorm forward for Hopper in Gluon: each group read from HBM once, held in shared memory (split over programs
that meet where it does not fit one).

The Triton plans read x twice (statistics, then normalize) or meet through global memory, and stall at
50-60% of the copy bandwidth (benchmarks/NOTES.md, sessions 8-13): one pass needs the whole group before it
can normalize, and a program that holds it in registers cannot keep loads in flight. Here a persistent
program per SM keeps a ring of SLOTS shared-memory tiles, filled by TMA from a one-warp loader partition
that runs ahead of the compute warps and waits only for a free slot; two compute partitions take the program's
chunks in turn (even / odd), so one's statistics and waits overlap the other's normalize pass:

    loader (1 warp)           for each tile of each of this program's chunks: wait slot free, TMA -> slot (a chunk
                              over half the ring: once the previous chunk's last tile has landed)
    compute (2 x WARPS)       per chunk (its T tiles all in the ring):
        statistics   as the tiles arrive: s = x (+ r_c, rounded to x's dtype and written back to the slot),
                     one-pass shifted sums per tile position, merged exactly (_stats)       -> mean, M2
        meet         (K > 1) the chunk's (mean, M2) stored, a release increment of the group's counter, spin (acquire)
                     until the K chunks are in, merged in chunk order (equal counts)        -> mean, rstd
        normalize    y = act(s * a_c + b_c),  a_c = w_c rstd,  b_c = bias_c - mean a_c; each slot released as soon
                     as every warp of the partition has read it, so the loader streams the next tiles behind

A group of NCHW x is one contiguous run of L = cpg * HW elements, cut into K chunks of cpc = cpg / K whole
channels (plan(); K = 1 for groups that fit the ring, e.g. SD's (16, 640, 64, 64): 160 KB in bf16, 20 of the
ring's 28 tiles; K = 2 for (8, 320, 128, 128)). x is seen as [N * G * K, R, TILE_COLS] (R = cpc * HW / TILE_COLS
rows of 512 bytes, each within one channel since TILE_COLS divides HW) and read in [1, TILE_ROWS, TILE_COLS] TMA
boxes (rows past R zero-filled, masked in the sums and the stores). Program pid holds chunk pid % K of the groups
pid // K, pid // K + S, ... (S groups per round): all K programs of a group are in the same round, and the grid
(S K <= SMs, one program per SM by its shared memory) is resident at once, so a spin never waits on a program that
is not running. Channels_last, a full-size residual, activations other than None / SiLU and plans that leave SMs
idle (MIN_FILL) or one of the two compute partitions (plan()) stay with the Triton plans (group_norm.py), as does
everything off sm_90 with triton 3.6 (the release this Gluon code is written and measured against). The math
matches _kernels.py's forward (fp32 statistics, s rounded to x's dtype like torch's add) and glu.py's SiLU (MUFU ex2
and rcp). Measured on an H200
(session 18): 65-76% of copy at SD's large NCHW levels, where the Triton plans reach 53-56%.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple, Optional

import torch

from .._triton import LaunchCache, cdiv, next_power_of_2, sm_count
from .._triton import bind_cuda_context, host_descriptor
from ..attention.flash_fwd_hopper import available, gluon

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

TILE_BYTES = 8192                 # one TMA box: TILE_ROWS = TILE_BYTES / ROW_BYTES rows of ROW_BYTES
ROW_BYTES = 512                   # one warp's 16-byte vectors across 32 lanes: conflict-free shared loads
SLOTS = 28                        # 224 KB of ring (227 KB is the sm_90 limit; barriers and reductions ~0.5 KB)
# Two compute partitions of COMPUTE_WARPS warps each (COMPUTE_REGS registers per thread in the second; the
# default partition gets what is left) take the groups in turn, plus the one-warp loader (PARTS = 1, one partition
# of 8 warps on 16 KB tiles with 160 registers: 59.7 vs 52.5 us at (16, 640, 64, 64), session 18).
PARTS, COMPUTE_WARPS, COMPUTE_REGS, LOADER_REGS = 2, 8, 112, 40
# Least share of the SMs' rounds x chunk tiles holding tiles (as _hopper_fwd_cl.py); K chunks per group, at most.
MIN_FILL, K_PAD_MAX = 0.9, 64
MAX_SPLIT = 4                     # a single round of meeting chunks re-split into at most this many (plan())
ONE_ROUND_MEETINGS = False        # plan() keeps a single round of meeting chunks (tests: the kernel at small sizes)
ACTIVATIONS = ("none", "silu")    # codes 0 and 1, as group_norm.ACTIVATIONS

if gluon is not None:
    _NEG_LOG2E = gl.constexpr(-1.4426950408889634)

    @gluon.jit
    def _ex2(x):
        """2^x, one MUFU.EX2 (flush-to-zero): +inf past 128, so 1 / (1 + 2^x) -> 0 and z sigmoid(z) -> -0 for very
        negative z (glu.py clamps the exponent for its backward's e * s; the forward needs no clamp)."""
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def _rcp(x):
        """1 / x, one MUFU.RCP (flush-to-zero)."""
        return gl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def _release_slot(slot, empty_off, WARPS: gl.constexpr):
        """Each warp of the partition arrives once at the `empty` mbarrier of ring slot `slot` (WARPS arrivals complete
        it; `empty_off`: the barriers' byte offset in the CTA's shared memory, slot_barrier_offset), once all its lanes
        are past a warp barrier: their reads of the slot, each fenced against the loader's next TMA write, ordered
        before lane 0's (release) arrive, as CUTLASS releases a pipeline stage. Gluon's own arrive (one elected thread)
        gets a bar.sync of the whole partition from triton 3.6's Membar before it, so every tile of a pass ended in
        the 8 warps waiting for the slowest. Inline asm with the address taken from triton's `global_smem` symbol
        (Gluon gives no address of an allocation). Session 35 (H100, same bits): forwards up to 5% faster, the backward
        up to 3%, none slower by more than 2%."""
        one_per_thread: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        thread = gl.arange(0, 32 * WARPS, layout=one_per_thread)
        gl.inline_asm_elementwise(
            "{ .reg .pred lane0; .reg .u32 bar; setp.eq.u32 lane0, $1, 0; mov.u32 bar, global_smem; "
            "add.u32 bar, bar, $2; bar.warp.sync -1; @lane0 mbarrier.arrive.shared::cta.b64 _, [bar]; mov.u32 $0, 0; }",
            "=r,r,r", [thread % 32, thread * 0 + (empty_off + slot * 8)], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _store_rows(ptr, value, row, n_rows, cols, HAS_PAD: gl.constexpr):
        """ptr[...] = value [ROWS, COLS] (a tile of the output, already in its dtype), its rows row [ROWS] past n_rows
        dropped when the tile may be padded (cols [COLS]: the columns' index, for the mask's shape)."""
        if HAS_PAD:
            gl.store(ptr, value, mask=gl.expand_dims(row < n_rows, 1) & gl.expand_dims(cols >= 0, 0))
        else:
            gl.store(ptr, value)

    @gluon.jit
    def _affine_rows(p_w, p_b, ch0, row, inv_rows_per_channel, rows_per_group, HAS_WEIGHT: gl.constexpr,
                     HAS_BIAS: gl.constexpr, TILE_ROWS: gl.constexpr, tile: gl.constexpr):
        """(weight, bias) of the tile rows' channels, fp32 [TILE_ROWS] (1 and 0 when absent)."""
        if HAS_WEIGHT:
            w = _row_load(p_w, ch0, row, inv_rows_per_channel, rows_per_group, 1)
        else:
            w = gl.full([TILE_ROWS], 1.0, gl.float32, gl.SliceLayout(1, tile))
        if HAS_BIAS:
            b = _row_load(p_b, ch0, row, inv_rows_per_channel, rows_per_group, 1)
        else:
            b = gl.zeros([TILE_ROWS], gl.float32, gl.SliceLayout(1, tile))
        return w, b

    @gluon.jit
    def _row_load(p, ch0, row, inv_rows_per_channel, rows_per_group, stride):
        """p[(ch0 + channel of row) * stride] as fp32 per tile row, 0 past the group's rows (padding, or the tile
        after the last one, which pass 1 and 3 prefetch). The channel of a row is row // rows_per_channel, computed
        as floor((row + 1/2) / rows_per_channel) in fp32: exact (rows < 2^12 keep the quotient >= 1 /
        (2 rows_per_channel) from an integer), and 3 instructions where div.s32 takes ~20."""
        ch = ch0 + ((row.to(gl.float32) + 0.5) * inv_rows_per_channel).to(gl.int32)
        return gl.load(p + ch * stride, mask=row < rows_per_group, other=0.0).to(gl.float32)

    @gluon.jit
    def _stage_s(ring, ready, k, r, HAS_RESIDUAL: gl.constexpr, SLOTS: gl.constexpr, tile: gl.constexpr):
        """Waits for the program's tile k, returns s = x (+ the residual r per row [TILE_ROWS], rounded to x's dtype
        and written back to the slot for pass 3) as fp32 [TILE_ROWS, TILE_COLS]."""
        slot = k % SLOTS
        mbarrier.wait(ready.index(slot), (k // SLOTS) & 1)
        s = ring.index(slot).load(tile)
        if HAS_RESIDUAL:
            s = (s.to(gl.float32) + gl.expand_dims(r, 1)).to(ring.dtype)
            ring.index(slot).store(s)
        return s.to(gl.float32)

    @gluon.jit
    def _stats(ring, ready, k, p_res_n, ch0, rows, n_tiles, rows_per_group, inv_rows_per_channel, stride_rc,
               inv_numel, HAS_RESIDUAL: gl.constexpr, HAS_PAD: gl.constexpr, TILE_ROWS: gl.constexpr,
               TILE_COLS: gl.constexpr, SLOTS: gl.constexpr, tile: gl.constexpr):
        """mean and M2 (the sum of squared deviations) of the chunk in one pass as its tiles arrive (the residual's rows loaded a tile ahead).
        Each tile position i is a stream of n_i values (one per tile) shifted by its first value c_i: a_i = sum d,
        b_i = sum d^2, d = s - c_i (no cancellation: |d| is of the order of the spread). With e_i = c_i - mean,
            mean = sum_i (n_i c_i + a_i) / M,    M2 = sum (s - mean)^2 = sum_i (b_i + e_i (2 a_i + n_i e_i))."""
        r = gl.zeros([TILE_ROWS], gl.float32, gl.SliceLayout(1, tile))
        if HAS_RESIDUAL:
            r = _row_load(p_res_n, ch0, rows, inv_rows_per_channel, rows_per_group, stride_rc)
            r_next = _row_load(p_res_n, ch0, TILE_ROWS + rows, inv_rows_per_channel, rows_per_group, stride_rc)
        c = _stage_s(ring, ready, k, r, HAS_RESIDUAL, SLOTS, tile)
        a = gl.zeros([TILE_ROWS, TILE_COLS], gl.float32, tile)
        b = gl.zeros([TILE_ROWS, TILE_COLS], gl.float32, tile)
        for t in range(1, n_tiles):
            row = t * TILE_ROWS + rows
            if HAS_RESIDUAL:
                r = r_next
                r_next = _row_load(p_res_n, ch0, row + TILE_ROWS, inv_rows_per_channel, rows_per_group, stride_rc)
            d = _stage_s(ring, ready, k + t, r, HAS_RESIDUAL, SLOTS, tile) - c
            if HAS_PAD:
                d = gl.where(gl.expand_dims(row < rows_per_group, 1), d, 0.0)
            a += d
            b += d * d
        if HAS_PAD:   # only the last tile is partial: its padding rows' streams hold one value fewer
            n_i = gl.expand_dims(gl.where(rows < rows_per_group - (n_tiles - 1) * TILE_ROWS, n_tiles, n_tiles - 1)
                                 .to(gl.float32), 1)
            mean = gl.sum(gl.sum(n_i * c + a, axis=1), axis=0) * inv_numel
            e = c - mean
            m2 = gl.sum(gl.sum(b + e * (2.0 * a + n_i * e), axis=1), axis=0)
        else:
            n_i = n_tiles.to(gl.float32)
            mean = gl.sum(gl.sum(n_i * c + a, axis=1), axis=0) * inv_numel
            e = c - mean
            m2 = gl.sum(gl.sum(b + e * (2.0 * a + n_i * e), axis=1), axis=0)
        return mean, m2

    @gluon.jit
    def _arrive_and_wait(p_count, n_arrivals):
        """The partition's meeting through global memory: after its stores (the barrier), one release increment of the
        counter p_count, then a spin (acquire) until n_arrivals programs have arrived (the counter starts at 0)."""
        gl.thread_barrier()
        gl.atomic_add(p_count, 1, sem="release", scope="gpu")
        arrived = gl.atomic_add(p_count, 0, sem="acquire", scope="gpu")
        while arrived < n_arrivals:
            arrived = gl.atomic_add(p_count, 0, sem="acquire", scope="gpu")
        gl.thread_barrier()

    @gluon.jit
    def _exchange(p_part, p_count_grp, u0, a, b, n_chunks, K_PAD: gl.constexpr, WARPS: gl.constexpr):
        """Publishes this chunk's two fp32 values (a, b) at p_part[(u0 + j) * 2] (j = pid % n_chunks), meets the group's
        n_chunks programs at p_count_grp, and returns every chunk's (a_k, b_k) [K_PAD] (0 past n_chunks) and the mask of
        the chunks."""
        j = gl.program_id(0) % n_chunks
        gl.store(p_part + (u0 + j) * 2, a)
        gl.store(p_part + (u0 + j) * 2 + 1, b)
        _arrive_and_wait(p_count_grp, n_chunks)
        kl: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        ok = gl.arange(0, K_PAD, layout=kl)
        p = p_part + (u0 + ok) * 2
        a_k = gl.load(p, mask=ok < n_chunks, other=0.0, cache_modifier=".cg")
        b_k = gl.load(p + 1, mask=ok < n_chunks, other=0.0, cache_modifier=".cg")
        return a_k, b_k, ok < n_chunks

    @gluon.jit
    def _meet(p_part, p_count_grp, u0, mean, m2, n_chunks, chunk_numel, K_PAD: gl.constexpr, WARPS: gl.constexpr):
        """The group's (mean, M2) from its chunks' (equal counts: mean = the chunks' mean of means, M2 = sum M2_k +
        chunk_numel sum (mean_k - mean)^2), merged in chunk order."""
        mean_k, m2_k, m = _exchange(p_part, p_count_grp, u0, mean, m2, n_chunks, K_PAD, WARPS)
        mean = gl.sum(mean_k, axis=0) / n_chunks
        dev = gl.where(m, mean_k - mean, 0.0)
        return mean, gl.sum(m2_k, axis=0) + chunk_numel * gl.sum(dev * dev, axis=0)

    @gluon.jit
    def _after_previous_chunk(ready, k, n_tiles, SLOTS: gl.constexpr):
        """Before tile k, the first of a chunk of n_tiles: where the chunk takes more than half the ring, waits until
        the previous chunk's last tile (k - 1) has landed. Two such chunks never both fit, so the next one's statistics
        wait for this one's pass 3 anyway, and its reads issued beside this one's only delay it (session 28: every SM
        asks for the whole ring at the start, and the first 20-tile chunks took 12 us to land; with the wait, forwards
        with a time embedding ran 4-8% faster, others within 1%, the backward 2-7% faster). Tile k - 1's slot is
        refilled only by the loader, later, so its phase parity is unambiguous."""
        if k > 0 and 2 * n_tiles > SLOTS:
            mbarrier.wait(ready.index((k - 1) % SLOTS), ((k - 1) // SLOTS) & 1)

    @gluon.jit
    def _loader(x_desc, ring, ready, empty, n_groups, n_chunks, per_round, rows_per_group, TILE_ROWS: gl.constexpr,
                SLOTS: gl.constexpr):
        """Streams this program's chunk of each of its groups tile by tile into the ring; tile k of the program goes to
        slot k % SLOTS once the compute warps released the tile k - SLOTS that was there (the slots start free), a
        chunk's first tile after the previous chunk where _after_previous_chunk says so."""
        n_tiles = gl.cdiv(rows_per_group, TILE_ROWS)
        pid = gl.program_id(0)
        k = 0
        for grp in range(pid // n_chunks, n_groups, per_round):
            u = grp * n_chunks + pid % n_chunks
            _after_previous_chunk(ready, k, n_tiles, SLOTS)
            for t in range(n_tiles):
                slot = k % SLOTS
                mbarrier.wait(empty.index(slot), ((k // SLOTS) & 1) ^ 1)
                mbarrier.expect(ready.index(slot), x_desc.block_type.nbytes)
                box = ring.index(slot)._reinterpret(ring.dtype, x_desc.block_type.shape, x_desc.layout)
                tma.async_copy_global_to_shared(x_desc, [u, t * TILE_ROWS, 0], ready.index(slot), box)
                k += 1

    @gluon.jit
    def _compute(ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_count, n_groups, groups, cpg,
                 n_chunks, per_round, rows_per_group, inv_rows_per_channel, stride_rn, stride_rc, inv_numel, eps,
                 HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                 ACTIVATION: gl.constexpr, HAS_PAD: gl.constexpr, MEET: gl.constexpr, K_PAD: gl.constexpr,
                 TILE_ROWS: gl.constexpr,
                 TILE_COLS: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr, PART: gl.constexpr,
                 PARTS: gl.constexpr, empty_off):
        """The passes over each chunk held in the ring (see the module docstring): of this program's groups
        i = 0, 1, ... (group pid // K + i * per_round, its chunk pid % K: tiles i * T .. i * T + T - 1 of the ring's
        sequence), those with i % PARTS == PART."""
        VEC: gl.constexpr = TILE_COLS // 32
        tile: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS, 1], [1, 0])   # a warp reads whole rows
        dtype: gl.constexpr = ring.dtype
        rows = gl.arange(0, TILE_ROWS, layout=gl.SliceLayout(1, tile))                 # [TILE_ROWS]
        cols = gl.arange(0, TILE_COLS, layout=gl.SliceLayout(0, tile))                 # [TILE_COLS]
        n_tiles = gl.cdiv(rows_per_group, TILE_ROWS)
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        for i in range(PART, gl.cdiv(n_groups - first, per_round), PARTS):
            grp = first + i * per_round
            u = grp * n_chunks + j                             # the chunk: rows u * rows_per_group.. of [N C rows/ch]
            k = i * n_tiles
            n = grp // groups
            ch0 = (grp - n * groups) * cpg + j * (cpg // n_chunks)       # the chunk's first channel
            # the affine's rows are loaded two tiles ahead, the first two before the statistics: loaded in place
            # (or one tile ahead), their latency measured as the kernel's largest stall (ncu, session 18)
            w_1, b_1 = _affine_rows(p_w, p_b, ch0, rows, inv_rows_per_channel, rows_per_group, HAS_WEIGHT, HAS_BIAS,
                                    TILE_ROWS, tile)
            w_2, b_2 = _affine_rows(p_w, p_b, ch0, TILE_ROWS + rows, inv_rows_per_channel, rows_per_group, HAS_WEIGHT,
                                    HAS_BIAS, TILE_ROWS, tile)
            mean, m2 = _stats(ring, ready, k, p_res + n * stride_rn, ch0, rows, n_tiles, rows_per_group,
                              inv_rows_per_channel, stride_rc, inv_numel, HAS_RESIDUAL, HAS_PAD, TILE_ROWS,
                              TILE_COLS, SLOTS, tile)
            if MEET:
                mean, m2 = _meet(p_part, p_count + grp, grp * n_chunks, mean, m2, n_chunks,
                                 rows_per_group * TILE_COLS * 1.0, K_PAD, WARPS)
            rstd = gl.rsqrt(gl.maximum(m2, 0.0) * (inv_numel / n_chunks) + eps)
            if j == 0:
                gl.store(p_mean + grp, mean)
                gl.store(p_rstd + grp, rstd)
            # pass 3: normalize, activate, store; each warp releases a slot once it has read its rows
            base = u.to(gl.int64) * rows_per_group * TILE_COLS
            for t in range(n_tiles):
                slot = (k + t) % SLOTS
                s = ring.index(slot).load(tile).to(gl.float32)
                fence_async_shared()      # these generic reads (and the write-back) before the next TMA write
                _release_slot(slot, empty_off, WARPS)
                row = t * TILE_ROWS + rows
                w_row, b_row, w_1, b_1 = w_1, b_1, w_2, b_2
                w_2, b_2 = _affine_rows(p_w, p_b, ch0, row + 2 * TILE_ROWS, inv_rows_per_channel, rows_per_group,
                                        HAS_WEIGHT, HAS_BIAS, TILE_ROWS, tile)
                a = w_row * rstd                                   # z = s a + b: the normalization and the affine
                b = b_row - mean * a
                z = s * gl.expand_dims(a, 1) + gl.expand_dims(b, 1)
                if ACTIVATION == 1:     # z sigmoid(z) = z / (1 + 2^(-z log2 e)), the exponent as its own FMA
                    e = s * gl.expand_dims(a * _NEG_LOG2E, 1) + gl.expand_dims(b * _NEG_LOG2E, 1)
                    z = z * _rcp(1.0 + _ex2(e))
                offs = base + gl.expand_dims(row * TILE_COLS, 1) + gl.expand_dims(cols, 0)
                _store_rows(p_y + offs, z.to(dtype), row, rows_per_group, cols, HAS_PAD)

    @gluon.jit
    def _group_norm_fwd_hopper_kernel(
            x_desc, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_count, n_groups, groups, cpg, n_chunks, per_round,
            rows_per_group, inv_rows_per_channel, stride_rn, stride_rc, inv_numel, eps, empty_off,
            HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
            HAS_PAD: gl.constexpr, MEET: gl.constexpr, K_PAD: gl.constexpr, TILE_ROWS: gl.constexpr, TILE_COLS: gl.constexpr,
            SLOTS: gl.constexpr, SMEM: gl.constexpr, WARPS: gl.constexpr, PARTS: gl.constexpr,
            COMPUTE_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        ring = gl.allocate_shared_memory(x_desc.dtype, [SLOTS, TILE_ROWS, TILE_COLS], SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=WARPS)      # one arrive per compute warp (_release_slot)
        if PARTS == 1:
            gl.warp_specialize([
                (_compute, (ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_count, n_groups, groups, cpg,
                            n_chunks, per_round, rows_per_group, inv_rows_per_channel, stride_rn, stride_rc, inv_numel,
                            eps, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, MEET, K_PAD, TILE_ROWS,
                            TILE_COLS, SLOTS, WARPS, 0, 1, empty_off)),
                (_loader, (x_desc, ring, ready, empty, n_groups, n_chunks, per_round, rows_per_group, TILE_ROWS, SLOTS)),
            ], [1], [LOADER_REGS])
        else:   # two compute partitions take the groups in turn: one's statistics beside the other's pass 3
            gl.warp_specialize([
                (_compute, (ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_count, n_groups, groups, cpg,
                            n_chunks, per_round, rows_per_group, inv_rows_per_channel, stride_rn, stride_rc, inv_numel,
                            eps, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, MEET, K_PAD, TILE_ROWS,
                            TILE_COLS, SLOTS, WARPS, 0, 2, empty_off)),
                (_compute, (ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_count, n_groups, groups, cpg,
                            n_chunks, per_round, rows_per_group, inv_rows_per_channel, stride_rn, stride_rc, inv_numel,
                            eps, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, MEET, K_PAD, TILE_ROWS,
                            TILE_COLS, SLOTS, WARPS, 1, 2, empty_off)),
                (_loader, (x_desc, ring, ready, empty, n_groups, n_chunks, per_round, rows_per_group, TILE_ROWS, SLOTS)),
            ], [WARPS, 1], [COMPUTE_REGS, LOADER_REGS])

    _launch = LaunchCache(_group_norm_fwd_hopper_kernel,
                          ptx_args=lambda ptx, cx: (slot_barrier_offset(ptx, cx["WARPS"], cx["SLOTS"]), ))


_GL_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}


def slot_barrier_offset(ptx: str, count: int, slots: int) -> int:
    """The byte offset in the CTA's shared memory (triton's `global_smem`) of a ring kernel's `empty` barriers, read
    from its PTX: the one run of `slots` 8-byte mbarriers it initialises with `count` arrivals (its `ready` ones take
    1). Triton places the allocations (the offset differs between variants: 229600 in this forward, 229664-229712 in
    the backward); _release_slot addresses them in inline asm."""
    base = set(re.findall(r"mov\.b32\s+(%r\d+),\s*global_smem;", ptx))
    offset = {reg: 0 for reg in base}
    offset.update((reg, int(off)) for reg, src, off in re.findall(r"add\.s32\s+(%r\d+),\s*(%r\d+),\s*(\d+);", ptx)
                  if src in base)
    found = sorted(offset.get(reg, -1) for reg in
                   re.findall(rf"mbarrier\.init\.shared::cta\.b64\s+\[(%r\d+)\],\s*{count};", ptx))
    if not found or found != list(range(found[0], found[0] + 8 * slots, 8)):
        raise RuntimeError(f"GroupNorm on Hopper: no run of {slots} mbarriers initialised with {count} arrivals at "
                           f"known shared-memory offsets in the compiled PTX (found {found[:4]}...); this code reads "
                           "triton 3.6's PTX")
    return found[0]


def _tile_cols(x: torch.Tensor) -> int:
    return ROW_BYTES // x.element_size()


class Plan(NamedTuple):
    n_chunks: int       # K programs per group, each on cpg / K whole channels
    chunk_rows: int     # 512-byte rows per chunk
    per_round: int      # groups per round: the grid is per_round * n_chunks <= SMs


def plan(n: int, c: int, hw: int, groups: int, element_size: int, sms: int, max_tiles: int = SLOTS,
         min_fill: Optional[float] = None, split_to_fill: bool = False, round_cost: float = 0.0,
         idle_cost: float = 0.0) -> Optional[Plan]:
    """Chunks of NCHW groups for this kernel and _hopper_bwd.py, K dividing cpg with at most max_tiles tiles per chunk.
    split_to_fill (the backward): of the K that fill the SMs, the one that minimises the busiest program's time in
    tiles, rounds x (chunk tiles + round_cost) (+ idle_cost x chunk tiles for a single round, whose one chunk
    overlaps nothing), ties to fewer chunks. Otherwise (this forward): the least K that fits the ring, unless that is
    a single round of K >= 2 chunks that meet (one chunk per program: one of the two compute partitions idles and the
    meeting's latency overlaps nothing), then the least K up to MAX_SPLIT that gives two or more rounds, else the
    Triton plans. Session 42 (H100, forward us): (2, 1280, 64, 64) K = 2 in one round 22.2, K = 4 in two 20.6; (2,
    320, 128, 128) K = 2 in one round 22.3, the Triton plans 20.2; a single round of whole groups (K = 1, no meeting)
    stays: (4, 320, 64, 64) 9.6 vs 11.6 with K = 2 in two rounds; more, smaller chunks cost more meetings than they
    save (K = 5 / 10 slower at every batch-2 level). None when HW is not a multiple of a 512-byte row, no K fits, or
    the plan would leave more than 1 - min_fill (default MIN_FILL) of the SMs' time idle."""
    return _chunking(n, c, hw, groups, element_size, sms, max_tiles, MIN_FILL if min_fill is None else min_fill,
                     split_to_fill, round_cost, idle_cost, ONE_ROUND_MEETINGS)


@functools.lru_cache(maxsize=1024)
def _chunking(n, c, hw, groups, element_size, sms, max_tiles, min_fill, split_to_fill, round_cost, idle_cost,
              one_round_meetings) -> Optional[Plan]:
    """plan(), cached per call signature (eligible and the launcher both ask, every call)."""
    cols = ROW_BYTES // element_size
    tile_rows = TILE_BYTES // ROW_BYTES
    if hw % cols:
        return None
    cpg, rows_per_channel, n_groups = c // groups, hw // cols, n * groups

    def fills(cost):      # the rows present against the SMs' capacity over the plan's rounds
        return n_groups * cpg * rows_per_channel >= min_fill * cost * tile_rows * sms

    best, least = None, None
    for k in range(1, min(cpg, K_PAD_MAX, sms) + 1):
        tiles = cdiv(cpg // k * rows_per_channel, tile_rows)
        if cpg % k or tiles > max_tiles:
            continue
        per_round = min(sms // k, n_groups)
        rounds = cdiv(n_groups, per_round)
        candidate = Plan(k, cpg // k * rows_per_channel, per_round)
        if split_to_fill:
            time = rounds * (tiles + round_cost) + (idle_cost * tiles if rounds == 1 else 0.0)
            if fills(rounds * tiles) and (best is None or time < best[0]):
                best = (time, candidate)
            continue
        if least is None:     # the least K that fits
            least = k
            if rounds >= 2 or k == 1 or one_round_meetings:
                return candidate if fills(rounds * tiles) else None
        elif k > MAX_SPLIT:   # a single round of chunks that meet, and no K up to MAX_SPLIT gives two
            return None
        if rounds >= 2 and fills(rounds * tiles):
            return candidate
    return None if best is None else best[1]


def eligible(x: torch.Tensor, num_groups: int, activation: str, residual_strides, y: torch.Tensor) -> bool:
    """Whether this kernel runs the forward of x (N, C, *spatial) into y: contiguous NCHW x and y, 16-byte aligned,
    fp16 / bf16 / fp32, a plan (HW a multiple of TILE_COLS, chunks of whole channels within the ring, the SMs filled),
    no residual or one broadcast over the pixels (residual_strides: the expanded residual's (stride_n, stride_c,
    stride_hw), or None), activation None / SiLU, on sm_90 with triton 3.6."""
    if activation not in ACTIVATIONS or x.dtype not in _GL_BITS or not available(x.device):
        return False
    if not x.is_contiguous() or not y.is_contiguous() or x.numel() == 0:
        return False
    if residual_strides is not None and residual_strides[2] != 0:
        return False
    if x.data_ptr() % 16 or y.data_ptr() % 16:
        return False
    n, c = x.shape[0], x.shape[1]
    return plan(n, c, x.numel() // (n * c), num_groups, x.element_size(), sm_count(x.device)) is not None


def forward(x, num_groups, weight, bias, eps, activation, residual, residual_strides, y, mean, rstd):
    """y, mean, rstd of act(GN(x + residual)) for an eligible x (see eligible); residual: the residual expanded
    to x's shape (a strided view), or None."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg, cols = c // num_groups, _tile_cols(x)
    tile_rows = TILE_BYTES // ROW_BYTES
    p = plan(n, c, hw, num_groups, x.element_size(), sm_count(x.device))
    n_groups = n * num_groups
    units = n_groups * p.n_chunks
    meet = p.n_chunks > 1       # the meeting's partials and zeroed counters (a memset launch: none without a meeting)
    part = torch.empty(units * 2, dtype=torch.float32, device=x.device) if meet else mean
    count = torch.zeros(n_groups, dtype=torch.int32, device=x.device) if meet else mean
    bits = _GL_BITS[x.dtype]
    box_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=3)
    bind_cuda_context()
    x_desc = host_descriptor(x, [units, p.chunk_rows, cols], [p.chunk_rows * cols, cols, 1], [1, tile_rows, cols],
                             box_layout)
    dummy = mean
    _launch((p.per_round * p.n_chunks, ), x_desc, dummy if residual is None else residual,
            dummy if weight is None else weight, dummy if bias is None else bias, y, mean, rstd, part, count, n_groups,
            num_groups, cpg, p.n_chunks, p.per_round, p.chunk_rows, cols / hw,
            *(residual_strides[:2] if residual is not None else (0, 0)), 1.0 / (p.chunk_rows * cols), float(eps),
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            ACTIVATION=ACTIVATIONS.index(activation), HAS_PAD=p.chunk_rows % tile_rows != 0, MEET=meet,
            K_PAD=next_power_of_2(p.n_chunks), TILE_ROWS=tile_rows, TILE_COLS=cols, SLOTS=SLOTS,
            SMEM=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2), WARPS=COMPUTE_WARPS,
            PARTS=PARTS, COMPUTE_REGS=COMPUTE_REGS, LOADER_REGS=LOADER_REGS, num_warps=COMPUTE_WARPS)
    return y, mean, rstd
