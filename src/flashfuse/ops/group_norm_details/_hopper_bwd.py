"""GroupNorm backward for Hopper in Gluon, NCHW: x and dy read from HBM once, each group split over programs that meet.

The Triton plans read x and dy twice (the group's two sums, then dx): 7 tensor passes where 3 are needed, so forward +
backward stalled at 41-60% of copy (benchmarks/NOTES.md, sessions 5-21). Here a group (one contiguous run of cpg
channels x HW pixels of NCHW) is cut into K chunks of cpc = cpg / K whole channels, x and dy of each within
MAX_CHUNK_TILES of the ring; the K programs holding one group's chunks meet once through global memory:

    loader (1 warp)        the chunk's x and dy tiles by TMA into the ring (slot k: x tile k and dy tile k)
    compute (2 x WARPS)    per round (partitions take rounds in turn, so the loader streams one partition's next chunk
                           as the other's slots free up, while that one meets and writes dx):
        sums     per tile, with x_hat = (s - mean) rstd, z = x_hat w_c + b_c, dz = dy act'(z) (s = x + r_c, rounded
                 to x's dtype like the forward, written back to the slot; dz rounded to x's dtype, as eager's
                 silu_backward gives it, and written back over dy, so the dx pass runs no activation):
                     per row   sum dz, sum dz x_hat      -> db, dw partials (fp32 per (n, c, row), summed later)
                     per chunk sum g, sum g x_hat        (g = dz w_c: the row sums times w_c)
        meet     (K > 1) the chunk's two sums stored, one release increment of the group's counter, spin (acquire)
                 until the K chunks are in, then summed in chunk order (deterministic)
        dx       dx = rstd (g - mean(g) - x_hat mean(g x_hat)) from the slots' s and dz (each released after its read,
                 behind a proxy fence, as in _hopper_fwd.py), per-row sums of dx for the time embedding's gradient

A chunk of x is [chunk_rows, TILE_COLS] (rows of 512 bytes, within one channel since TILE_COLS divides HW): x and dy
are seen as [N G K, chunk_rows, TILE_COLS] and read in [1, TILE_ROWS, TILE_COLS] TMA boxes (rows past chunk_rows
zero-filled: dy = 0 there, so dz = 0 and the sums need no mask; the dx stores do). Program pid holds chunk pid % K of
the groups pid // K, pid // K + S, ... (S = SMs // K groups per round): all K programs of a group are in the same round,
and the grid (S K <= SMs, one program per SM by its shared memory) is resident at once, so a spin never waits on a
program that is not running. K: plan(). The math is _kernels.py's backward (fp32 sums, SiLU' as glu.py's with the
exponent clamp, MUFU ex2 and rcp). Activations None / SiLU, no residual or one broadcast over the pixels; the rest
stays with the Triton plans (group_norm.py), as does everything off sm_90 with triton 3.6.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._triton import LaunchCache, next_power_of_2, sm_count
from .._triton import bind_cuda_context, host_descriptor
from ..attention.flash_fwd_hopper import available, gluon
from ._hopper_fwd import ACTIVATIONS, COMPUTE_REGS, COMPUTE_WARPS, LOADER_REGS, ROW_BYTES, TILE_BYTES, Plan
from ._hopper_fwd import slot_barrier_offset
from ._hopper_fwd import plan as _plan

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    from ._hopper_fwd import (_NEG_LOG2E, _affine_rows, _after_previous_chunk, _ex2, _exchange, _rcp, _release_slot,
                              _row_load, _store_rows)

SLOTS = 14                        # x + dy tiles of 8 KB each: 224 KB of ring (227 KB is the sm_90 limit)
# A chunk's tiles, at most. Chunks of up to half the ring keep both partitions' rounds in flight, but larger chunks
# (fewer programs per group: fewer meetings and rounds) measured faster (session 24, bf16 us: (16, 640, 64, 64)
# K = 4 -> 2 132.1 -> 121.6, (8, 320, 128, 128) K = 10 -> 5 138.8 -> 123.0, (16, 1280, 32, 32) K = 2 -> 1 77.7 -> 69.3).
MAX_CHUNK_TILES = 10
MIN_FILL = 0.9                    # least share of the SMs' rounds x chunk tiles holding tiles (as _hopper_fwd_cl)
# plan()'s time model, in tiles: each round's meeting and ramp, and a single round's chunk that overlaps nothing (its
# sums and dx passes with the other compute partition idle). Fitted to session 42's forced plans (fwd + bwd, H100,
# graph-timed): (2, 640, 64, 64) K = 4 in two rounds 35.1 us vs K = 2 in one 38.4; (2, 320, 128, 128) K = 5 in three
# rounds 66.4 vs K = 10 in five 69.5; K = 2 in one round stays best at (2, 320, 64, 64), (2, 1280, 32, 32), (2, 960,
# 32, 32) (24.4 / 24.3 / 22.2 vs 25.3-27.3 with more rounds).
ROUND_TILES, IDLE_SHARE = 2.5, 0.4

if gluon is not None:
    _MAX_EXP2 = gl.constexpr(126.0)    # glu.py's clamp: exp(-z) stays finite, so e s below is never inf * 0

    @gluon.jit
    def _silu_grad(z, dy):
        """dy SiLU'(z) = dy sig (1 + z e sig), e = exp(-z), sig = 1 / (1 + e) (1 - sig = e sig: no cancellation)."""
        e = _ex2(gl.minimum(z * _NEG_LOG2E, _MAX_EXP2))
        sig = _rcp(1.0 + e)
        return dy * (sig * (1.0 + z * (e * sig)))

    @gluon.jit
    def _stage(x_ring, dy_ring, ready, k, r, HAS_RESIDUAL: gl.constexpr, SLOTS: gl.constexpr, tile: gl.constexpr):
        """Waits for the program's tile k; returns s = x (+ r, broadcast to the tile, [TILE_ROWS, 1]: per row; rounded
        to x's dtype and written back to the slot for the dx pass) and dy as fp32, the tile's shape."""
        slot = k % SLOTS
        mbarrier.wait(ready.index(slot), (k // SLOTS) & 1)
        s = x_ring.index(slot).load(tile)
        if HAS_RESIDUAL:
            s = (s.to(gl.float32) + r).to(x_ring.dtype)
            x_ring.index(slot).store(s)
        return s.to(gl.float32), dy_ring.index(slot).load(tile).to(gl.float32)

    @gluon.jit
    def _stage_dz(dy_ring, k, x_hat, dy, w_row, b_row, ACTIVATION: gl.constexpr, SLOTS: gl.constexpr):
        """dz = dy act'(z), z = x_hat w + b, rounded to x's dtype and written over the tile's dy for the dx pass (eager
        PyTorch's silu_backward rounds it the same way); returned as fp32 (dy itself without an activation)."""
        dz = dy
        if ACTIVATION == 1:
            dz = _silu_grad(x_hat * gl.expand_dims(w_row, 1) + gl.expand_dims(b_row, 1), dy).to(dy_ring.dtype)
            dy_ring.index(k % SLOTS).store(dz)
            dz = dz.to(gl.float32)
        return dz

    @gluon.jit
    def _loader(x_desc, dy_desc, x_ring, dy_ring, ready, empty, n_groups, n_chunks, per_round, chunk_rows,
                TILE_ROWS: gl.constexpr, SLOTS: gl.constexpr):
        """Streams this program's chunk of each of its groups, x and dy tile by tile, into the ring; tile k goes to
        slot k % SLOTS once the compute warps released the tile k - SLOTS that was there (the slots start free).
        A chunk's first tile after the previous chunk where _after_previous_chunk says so."""
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        n_tiles = gl.cdiv(chunk_rows, TILE_ROWS)
        k = 0
        for grp in range(first, n_groups, per_round):
            u = grp * n_chunks + j
            _after_previous_chunk(ready, k, n_tiles, SLOTS)
            for t in range(n_tiles):
                slot = k % SLOTS
                mbarrier.wait(empty.index(slot), ((k // SLOTS) & 1) ^ 1)
                mbarrier.expect(ready.index(slot), 2 * x_desc.block_type.nbytes)
                box = x_ring.index(slot)._reinterpret(x_ring.dtype, x_desc.block_type.shape, x_desc.layout)
                tma.async_copy_global_to_shared(x_desc, [u, t * TILE_ROWS, 0], ready.index(slot), box)
                box = dy_ring.index(slot)._reinterpret(dy_ring.dtype, dy_desc.block_type.shape, dy_desc.layout)
                tma.async_copy_global_to_shared(dy_desc, [u, t * TILE_ROWS, 0], ready.index(slot), box)
                k += 1

    @gluon.jit
    def _compute(x_ring, dy_ring, ready, empty, p_res, p_w, p_b, p_mean, p_rstd, p_dx, p_dw, p_db, p_dres, p_part,
                 p_count, n_groups, groups, cpg, n_chunks, per_round, chunk_rows, inv_rows_per_channel, stride_rn,
                 stride_rc, inv_numel,
                 HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                 ACTIVATION: gl.constexpr, COMPUTE_DW: gl.constexpr, COMPUTE_DB: gl.constexpr,
                 HAS_DRES: gl.constexpr, HAS_PAD: gl.constexpr, MEET: gl.constexpr, K_PAD: gl.constexpr,
                 TILE_ROWS: gl.constexpr, TILE_COLS: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr,
                 PART: gl.constexpr, PARTS: gl.constexpr, empty_off):
        """Sums, meeting and dx pass of the rounds i = PART, PART + PARTS, ... of this program (module docstring)."""
        VEC: gl.constexpr = TILE_COLS // 32
        tile: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS, 1], [1, 0])   # a warp reads whole rows
        dtype: gl.constexpr = x_ring.dtype
        rows = gl.arange(0, TILE_ROWS, layout=gl.SliceLayout(1, tile))                 # [TILE_ROWS]
        cols = gl.arange(0, TILE_COLS, layout=gl.SliceLayout(0, tile))                 # [TILE_COLS]
        n_tiles = gl.cdiv(chunk_rows, TILE_ROWS)
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        cpc = cpg // n_chunks
        for i in range(PART, gl.cdiv(n_groups - first, per_round), PARTS):
            grp = first + i * per_round
            u = grp * n_chunks + j                             # the chunk: rows u * chunk_rows.. of [N C rows/channel]
            k = i * n_tiles
            n = grp // groups
            ch0 = (grp - n * groups) * cpg + j * cpc           # the chunk's first channel
            p_res_n = p_res + n * stride_rn
            mean = gl.load(p_mean + grp)
            rstd = gl.load(p_rstd + grp)
            mean_rstd = mean * rstd
            row_base = u * chunk_rows
            # sums; the affine and residual rows one tile ahead
            acc_g = gl.zeros([TILE_ROWS], gl.float32, gl.SliceLayout(1, tile))
            acc_gx = gl.zeros([TILE_ROWS], gl.float32, gl.SliceLayout(1, tile))
            w_1, b_1 = _affine_rows(p_w, p_b, ch0, rows, inv_rows_per_channel, chunk_rows, HAS_WEIGHT, HAS_BIAS,
                                    TILE_ROWS, tile)
            r_1 = gl.zeros([TILE_ROWS], gl.float32, gl.SliceLayout(1, tile))
            if HAS_RESIDUAL:
                r_1 = _row_load(p_res_n, ch0, rows, inv_rows_per_channel, chunk_rows, stride_rc)
            for t in range(n_tiles):
                row = t * TILE_ROWS + rows
                w_row, b_row, r = w_1, b_1, r_1
                w_1, b_1 = _affine_rows(p_w, p_b, ch0, row + TILE_ROWS, inv_rows_per_channel, chunk_rows, HAS_WEIGHT,
                                        HAS_BIAS, TILE_ROWS, tile)
                if HAS_RESIDUAL:
                    r_1 = _row_load(p_res_n, ch0, row + TILE_ROWS, inv_rows_per_channel, chunk_rows, stride_rc)
                s, dy = _stage(x_ring, dy_ring, ready, k + t, gl.expand_dims(r, 1), HAS_RESIDUAL, SLOTS, tile)
                x_hat = s * rstd - mean_rstd
                dz = _stage_dz(dy_ring, k + t, x_hat, dy, w_row, b_row, ACTIVATION, SLOTS)
                sum_dz = gl.sum(dz, axis=1)                                             # [TILE_ROWS]
                sum_dzx = gl.sum(dz * x_hat, axis=1)
                if COMPUTE_DW:
                    gl.store(p_dw + row_base + row, sum_dzx, mask=row < chunk_rows)
                if COMPUTE_DB:
                    gl.store(p_db + row_base + row, sum_dz, mask=row < chunk_rows)
                acc_g += w_row * sum_dz
                acc_gx += w_row * sum_dzx
            sum_g = gl.sum(acc_g, axis=0)
            sum_gx = gl.sum(acc_gx, axis=0)
            if MEET:
                g_k, gx_k, _ = _exchange(p_part, p_count + grp, grp * n_chunks, sum_g, sum_gx, n_chunks, K_PAD, WARPS)
                sum_g, sum_gx = gl.sum(g_k, axis=0), gl.sum(gx_k, axis=0)             # in chunk order
            c1 = sum_g * inv_numel * rstd                      # dx = (dz w) rstd - x_hat c2 - c1
            c2 = sum_gx * inv_numel * rstd
            # dx from s and dz; each warp releases a slot once it has read its rows
            w_1, _ = _affine_rows(p_w, p_b, ch0, rows, inv_rows_per_channel, chunk_rows, HAS_WEIGHT, False, TILE_ROWS,
                                  tile)
            for t in range(n_tiles):
                slot = (k + t) % SLOTS
                s = x_ring.index(slot).load(tile).to(gl.float32)
                dz = dy_ring.index(slot).load(tile).to(gl.float32)
                fence_async_shared()      # these generic reads (and the write-backs) before the next TMA write
                _release_slot(slot, empty_off, WARPS)
                row = t * TILE_ROWS + rows
                w_row = w_1
                w_1, _ = _affine_rows(p_w, p_b, ch0, row + TILE_ROWS, inv_rows_per_channel, chunk_rows, HAS_WEIGHT,
                                      False, TILE_ROWS, tile)
                x_hat = s * rstd - mean_rstd
                dx = dz * gl.expand_dims(w_row * rstd, 1) - (x_hat * c2 + c1)
                if HAS_DRES:
                    gl.store(p_dres + row_base + row, gl.sum(dx, axis=1), mask=row < chunk_rows)
                offs = (row_base + gl.expand_dims(row, 1)).to(gl.int64) * TILE_COLS + gl.expand_dims(cols, 0)
                _store_rows(p_dx + offs, dx.to(dtype), row, chunk_rows, cols, HAS_PAD)

    @gluon.jit
    def _group_norm_bwd_hopper_kernel(
            x_desc, dy_desc, p_res, p_w, p_b, p_mean, p_rstd, p_dx, p_dw, p_db, p_dres, p_part, p_count, n_groups,
            groups, cpg, n_chunks, per_round, chunk_rows, inv_rows_per_channel, stride_rn, stride_rc, inv_numel,
            empty_off,
            HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
            COMPUTE_DW: gl.constexpr, COMPUTE_DB: gl.constexpr, HAS_DRES: gl.constexpr, HAS_PAD: gl.constexpr,
            MEET: gl.constexpr, K_PAD: gl.constexpr, TILE_ROWS: gl.constexpr, TILE_COLS: gl.constexpr,
            SLOTS: gl.constexpr, SMEM: gl.constexpr, WARPS: gl.constexpr, COMPUTE_REGS: gl.constexpr,
            LOADER_REGS: gl.constexpr):
        x_ring = gl.allocate_shared_memory(x_desc.dtype, [SLOTS, TILE_ROWS, TILE_COLS], SMEM)
        dy_ring = gl.allocate_shared_memory(dy_desc.dtype, [SLOTS, TILE_ROWS, TILE_COLS], SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=WARPS)      # one arrive per compute warp (_release_slot)
        gl.warp_specialize([   # two compute partitions take the rounds in turn, one's meeting beside the other's work
            (_compute, (x_ring, dy_ring, ready, empty, p_res, p_w, p_b, p_mean, p_rstd, p_dx, p_dw, p_db, p_dres,
                        p_part, p_count, n_groups, groups, cpg, n_chunks, per_round, chunk_rows, inv_rows_per_channel,
                        stride_rn, stride_rc, inv_numel, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, COMPUTE_DW,
                        COMPUTE_DB, HAS_DRES, HAS_PAD, MEET, K_PAD, TILE_ROWS, TILE_COLS, SLOTS, WARPS, 0, 2,
                        empty_off)),
            (_compute, (x_ring, dy_ring, ready, empty, p_res, p_w, p_b, p_mean, p_rstd, p_dx, p_dw, p_db, p_dres,
                        p_part, p_count, n_groups, groups, cpg, n_chunks, per_round, chunk_rows, inv_rows_per_channel,
                        stride_rn, stride_rc, inv_numel, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, ACTIVATION, COMPUTE_DW,
                        COMPUTE_DB, HAS_DRES, HAS_PAD, MEET, K_PAD, TILE_ROWS, TILE_COLS, SLOTS, WARPS, 1, 2,
                        empty_off)),
            (_loader, (x_desc, dy_desc, x_ring, dy_ring, ready, empty, n_groups, n_chunks, per_round, chunk_rows,
                       TILE_ROWS, SLOTS)),
        ], [WARPS, 1], [COMPUTE_REGS, LOADER_REGS])

    _launch = LaunchCache(_group_norm_bwd_hopper_kernel,
                          ptx_args=lambda ptx, cx: (slot_barrier_offset(ptx, cx["WARPS"], cx["SLOTS"]), ))


_GL_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}


def plan(n: int, c: int, hw: int, groups: int, element_size: int, sms: int) -> Optional[Plan]:
    """_hopper_fwd.plan with chunks of at most MAX_CHUNK_TILES (x + dy) tiles, this file's MIN_FILL, and groups split to
    fill the SMs too ((2, 320, 64, 64): K = 2 measured 15.9 us vs 18.9 for the Triton plans, session 24), K by the time
    model ROUND_TILES / IDLE_SHARE."""
    return _plan(n, c, hw, groups, element_size, sms, MAX_CHUNK_TILES, MIN_FILL, split_to_fill=True,
                 round_cost=ROUND_TILES, idle_cost=IDLE_SHARE)


def eligible(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, num_groups: int, activation: str,
             residual_strides) -> bool:
    """Whether this kernel runs the backward of x (N, C, *spatial): contiguous NCHW x, dy and dx, 16-byte aligned,
    fp16 / bf16 / fp32, a plan (see plan), no residual or one broadcast over the pixels (residual_strides: the expanded
    residual's (stride_n, stride_c, stride_hw), or None), activation None / SiLU, on sm_90 with triton 3.6."""
    if activation not in ACTIVATIONS or x.dtype not in _GL_BITS or dy.dtype != x.dtype or not available(x.device):
        return False
    if not (x.is_contiguous() and dy.is_contiguous() and dx.is_contiguous()) or x.numel() == 0:
        return False
    if residual_strides is not None and residual_strides[2] != 0:
        return False
    if x.data_ptr() % 16 or dy.data_ptr() % 16 or dx.data_ptr() % 16:
        return False
    n, c = x.shape[0], x.shape[1]
    return plan(n, c, x.numel() // (n * c), num_groups, x.element_size(), sm_count(x.device)) is not None


def backward(dy, x, residual, residual_strides, weight, bias, mean, rstd, num_groups, activation, dx, compute_dw,
             compute_db, compute_dres, alloc):
    """dx (written into dx), and the fp32 partials of dw, db and the broadcast residual's gradient, None where not
    asked, each [N, C, rows per channel] (contiguous: a sum per 512-byte row; group_norm sums them per channel), for an
    eligible x; residual: expanded to x's shape (a strided view), or None; alloc(shape, dtype, device): group_norm's
    allocator of the buffers the kernel writes."""
    n, c = x.shape[0], x.shape[1]
    hw = x.numel() // (n * c)
    cpg, cols = c // num_groups, ROW_BYTES // x.element_size()
    tile_rows = TILE_BYTES // ROW_BYTES
    rows_per_channel = hw // cols
    p = plan(n, c, hw, num_groups, x.element_size(), sm_count(x.device))
    n_groups = n * num_groups
    units = n_groups * p.n_chunks
    # per-row sums, [N, C, rows per channel] each: dw and db in one buffer (one reduction), dresidual's apart
    n_sums = compute_dw + compute_db
    row_sums = alloc((max(n_sums, 1), n * c * rows_per_channel), torch.float32, x.device)
    dres_rows = alloc((n * c * rows_per_channel, ), torch.float32, x.device) if compute_dres else None
    meet = p.n_chunks > 1       # the meeting's partials and zeroed counters (a memset launch: none without a meeting)
    part = alloc((units * 2, ), torch.float32, x.device) if meet else mean
    count = torch.zeros(n_groups, dtype=torch.int32, device=x.device) if meet else mean
    bits = _GL_BITS[x.dtype]
    box_layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=3)
    bind_cuda_context()
    shape, strides, box = [units, p.chunk_rows, cols], [p.chunk_rows * cols, cols, 1], [1, tile_rows, cols]
    x_desc = host_descriptor(x, shape, strides, box, box_layout)
    dy_desc = host_descriptor(dy, shape, strides, box, box_layout)
    dummy = mean
    _launch((p.per_round * p.n_chunks, ), x_desc, dy_desc, dummy if residual is None else residual,
            dummy if weight is None else weight, dummy if bias is None else bias, mean, rstd, dx, row_sums[0],
            row_sums[n_sums - 1], dummy if dres_rows is None else dres_rows, part, count, n_groups, num_groups,
            cpg, p.n_chunks, p.per_round, p.chunk_rows, 1.0 / rows_per_channel,
            *(residual_strides[:2] if residual is not None else (0, 0)), 1.0 / (cpg * hw),
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            ACTIVATION=ACTIVATIONS.index(activation), COMPUTE_DW=compute_dw, COMPUTE_DB=compute_db,
            HAS_DRES=compute_dres, HAS_PAD=p.chunk_rows % tile_rows != 0, MEET=meet,
            K_PAD=next_power_of_2(p.n_chunks), TILE_ROWS=tile_rows, TILE_COLS=cols, SLOTS=SLOTS,
            SMEM=gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2), WARPS=COMPUTE_WARPS,
            COMPUTE_REGS=COMPUTE_REGS, LOADER_REGS=LOADER_REGS, num_warps=COMPUTE_WARPS)
    parts = row_sums.view(-1, n, c, rows_per_channel)
    return (parts[0] if compute_dw else None, parts[n_sums - 1] if compute_db else None,
            dres_rows.view(n, c, rows_per_channel) if compute_dres else None)
