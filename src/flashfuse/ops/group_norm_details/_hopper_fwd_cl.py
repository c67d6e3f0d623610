"""GroupNorm forward for Hopper in Gluon, channels_last: each sample read from HBM once, split over programs that meet.

channels_last x (N, C, H, W) is [N, HW, C] in memory: a group is cpg channels of every pixel of its sample, so no
program can hold a group of SD's shapes alone (a sample is 2.6-10 MB). Here the sample is cut into K chunks of
pixels (all C channels, <= the 224 KB ring), and the K programs holding one sample's chunks meet once through
global memory:

    loader (1 warp)        the chunk's [TILE_P pixels, BOX_C channels] tiles by TMA into the ring (channel block
                           by channel block), as in _hopper_fwd.py
    compute (2 x WARPS)    per round (partitions take rounds in turn):
        statistics   per channel block, one-pass shifted sums per tile position over the chunk's pixel tiles
                     (as _hopper_fwd._stats), reduced to (mean, M2) per channel, then per group of the chunk:
                         mean_g = sum_c mean_c / cpg,   M2_g = sum_c M2_c + P sum_c (mean_c - mean_g)^2
        meet         (mean_g, M2_g) stored, one release atomic on the sample's counter, spin (acquire) until the
                     K chunks are in; merged exactly over the chunks (counts P_k cpg, Chan's formula)
        normalize    y = act(s a_c + b_c), a_c = w_c rstd_g, b_c = bias_c - mean_g a_c per column (a channel):
                     no per-row work; slots released as read

Program pid holds chunk pid % K of the samples pid // K, pid // K + S, ... (S = SMs // K samples per round): all K
programs of a sample are in the same round, and the grid (S K <= SMs, one program per SM by its shared memory) is
resident at once, so the spin cannot wait on a program that is not running. Chunk size: the tiles per chunk
that minimise rounds x chunk length (plan). The (N, C, 1, 1) time embedding is added per column (rounded to x's
dtype like torch's add) and written back to the slot. Statistics in fp32; SiLU as _hopper_fwd (MUFU ex2, rcp).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .._triton import LaunchCache, cdiv, next_power_of_2, sm_count
from ..attention.flash_fwd_hopper import available, bind_cuda_context, gluon, host_descriptor
from ._hopper_fwd import ACTIVATIONS, COMPUTE_REGS, COMPUTE_WARPS, LOADER_REGS, PARTS, TILE_BYTES

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

    from ._hopper_fwd import _NEG_LOG2E, _ex2, _rcp

BOX_BYTES = 128                   # a tile row: BOX_C = 128 / element size channels of one pixel (8 lanes x 16 B)
SLOTS = 27                        # 216 KB of ring: the meeting's reductions need ~4.5 KB beside it (227 KB in all)

if gluon is not None:
    @gluon.jit
    def _stage_s(ring, ready, k, r, HAS_RESIDUAL: gl.constexpr, SLOTS: gl.constexpr, tile: gl.constexpr):
        """Waits for the program's tile k; s = x (+ r per column, rounded to x's dtype and written back to the slot
        for the normalize pass) as fp32 [TILE_P, BOX_C]."""
        slot = k % SLOTS
        mbarrier.wait(ready.index(slot), (k // SLOTS) & 1)
        s = ring.index(slot).load(tile)
        if HAS_RESIDUAL:
            s = (s.to(gl.float32) + gl.expand_dims(r, 0)).to(ring.dtype)
            ring.index(slot).store(s)
        return s.to(gl.float32)

    @gluon.jit
    def _chunk_stats(ring, ready, k, p_r, stride_rc, p_scr, p_part, n_pt, n_px, n_cb, cpg, groups,
                     HAS_RESIDUAL: gl.constexpr, HAS_PAD: gl.constexpr, TILE_P: gl.constexpr, BOX_C: gl.constexpr,
                     G_PAD: gl.constexpr, CPG_PAD: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr,
                     tile: gl.constexpr):
        """(mean, M2) per group of this chunk (n_px pixels) -> p_part[g * 2 + {0, 1}]; p_scr [>= 2 C] fp32 holds
        the per-channel (mean, M2) in between."""
        rows = gl.arange(0, TILE_P, layout=gl.SliceLayout(1, tile))                     # [TILE_P]
        cols = gl.arange(0, BOX_C, layout=gl.SliceLayout(0, tile))                      # [BOX_C]
        last_rows = n_px - (n_pt - 1) * TILE_P                 # valid rows of the last pixel tile
        n_i = gl.expand_dims(gl.where(rows < last_rows, n_pt, n_pt - 1).to(gl.float32), 1)   # values per position
        inv_px = 1.0 / n_px.to(gl.float32)
        r = gl.zeros([BOX_C], gl.float32, gl.SliceLayout(0, tile))
        for cb in range(n_cb):
            if HAS_RESIDUAL:
                r = gl.load(p_r + (cb * BOX_C + cols) * stride_rc).to(gl.float32)
            kk = k + cb * n_pt
            c = _stage_s(ring, ready, kk, r, HAS_RESIDUAL, SLOTS, tile)                 # the shifts: tile 0
            if HAS_PAD:
                c = gl.where(gl.expand_dims(rows < n_px, 1), c, 0.0)
            a = gl.zeros([TILE_P, BOX_C], gl.float32, tile)
            b = gl.zeros([TILE_P, BOX_C], gl.float32, tile)
            for t in range(1, n_pt):
                d = _stage_s(ring, ready, kk + t, r, HAS_RESIDUAL, SLOTS, tile) - c
                if HAS_PAD:
                    d = gl.where(gl.expand_dims(t * TILE_P + rows < n_px, 1), d, 0.0)
                a += d
                b += d * d
            if HAS_PAD:
                mean_c = gl.sum(n_i * c + a, axis=0) * inv_px                            # [BOX_C]
                e = c - gl.expand_dims(mean_c, 0)                  # (n_i = 0: c = a = b = 0, no contribution)
                m2_c = gl.sum(b + e * (2.0 * a + n_i * e), axis=0)
            else:
                n_f = n_pt.to(gl.float32)
                mean_c = gl.sum(n_f * c + a, axis=0) * inv_px
                e = c - gl.expand_dims(mean_c, 0)
                m2_c = gl.sum(b + e * (2.0 * a + n_f * e), axis=0)
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
    def _meet(p_part_n, p_count_n, p_scr_g, n_chunks, chunk_px, hw, cpg, groups, eps,
              G_PAD: gl.constexpr, K_BLOCK: gl.constexpr, WARPS: gl.constexpr):
        """Publishes this chunk (its stores, then a release increment of the sample's counter), waits until all
        n_chunks are in, merges their (mean, M2) per group (chunk k: P_k cpg values) -> p_scr_g[g * 2 + {0, 1}] =
        (mean, rstd); returns them [G_PAD]."""
        gl.thread_barrier()
        gl.atomic_add(p_count_n, 1, sem="release", scope="gpu")
        arrived = gl.atomic_add(p_count_n, 0, sem="acquire", scope="gpu")
        while arrived < n_chunks:
            arrived = gl.atomic_add(p_count_n, 0, sem="acquire", scope="gpu")
        gl.thread_barrier()
        kl: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [WARPS, 1], [1, 0])
        og = gl.arange(0, G_PAD, layout=gl.SliceLayout(0, kl))                          # [G_PAD]
        m_g = og < groups
        acc = gl.zeros([K_BLOCK, G_PAD], gl.float32, kl)
        for k0 in range(0, n_chunks, K_BLOCK):
            ok = k0 + gl.arange(0, K_BLOCK, layout=gl.SliceLayout(1, kl))               # [K_BLOCK]
            m = gl.expand_dims(ok < n_chunks, 1) & gl.expand_dims(m_g, 0)
            px = gl.minimum(gl.maximum(hw - ok * chunk_px, 0), chunk_px).to(gl.float32)
            mk = gl.load(p_part_n + (gl.expand_dims(ok * groups, 1) + gl.expand_dims(og, 0)) * 2, mask=m, other=0.0,
                         cache_modifier=".cg")
            acc += gl.expand_dims(px, 1) * mk
        mean = gl.sum(acc, axis=0) / (hw * 1.0)                                  # [G_PAD]
        acc = gl.zeros([K_BLOCK, G_PAD], gl.float32, kl)
        for k0 in range(0, n_chunks, K_BLOCK):
            ok = k0 + gl.arange(0, K_BLOCK, layout=gl.SliceLayout(1, kl))
            m = gl.expand_dims(ok < n_chunks, 1) & gl.expand_dims(m_g, 0)
            px = gl.minimum(gl.maximum(hw - ok * chunk_px, 0), chunk_px).to(gl.float32)
            p = p_part_n + (gl.expand_dims(ok * groups, 1) + gl.expand_dims(og, 0)) * 2
            dev = gl.load(p, mask=m, other=0.0, cache_modifier=".cg") - gl.expand_dims(mean, 0)
            m2k = gl.load(p + 1, mask=m, other=0.0, cache_modifier=".cg")
            acc += gl.where(m, m2k + gl.expand_dims(px, 1) * (cpg * 1.0) * dev * dev, 0.0)
        numel = (hw * 1.0) * cpg
        rstd = gl.rsqrt(gl.maximum(gl.sum(acc, axis=0), 0.0) / numel + eps)
        gl.store(p_scr_g + og * 2, mean, mask=m_g)
        gl.store(p_scr_g + og * 2 + 1, rstd, mask=m_g)
        gl.thread_barrier()
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
    def _compute(ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count, n_samples, hw, c,
                 groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps,
                 HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr,
                 ACTIVATION: gl.constexpr, HAS_PAD: gl.constexpr, TILE_P: gl.constexpr, BOX_C: gl.constexpr,
                 G_PAD: gl.constexpr, CPG_PAD: gl.constexpr, K_BLOCK: gl.constexpr, SLOTS: gl.constexpr,
                 WARPS: gl.constexpr, PART: gl.constexpr, PARTS: gl.constexpr):
        """Statistics, meeting and normalize pass of the rounds i = PART, PART + PARTS, ... of this program."""
        VEC: gl.constexpr = 128 // ring.dtype.primitive_bitwidth                        # 16 bytes per lane
        tile: gl.constexpr = gl.BlockedLayout([1, VEC], [32 * VEC // BOX_C, BOX_C // VEC], [WARPS, 1], [1, 0])
        rows = gl.arange(0, TILE_P, layout=gl.SliceLayout(1, tile))                     # [TILE_P]
        cols = gl.arange(0, BOX_C, layout=gl.SliceLayout(0, tile))                      # [BOX_C]
        pid = gl.program_id(0)
        first, j = pid // n_chunks, pid % n_chunks
        p0 = j * chunk_px
        n_px = gl.minimum(chunk_px, hw - p0)
        n_pt = gl.cdiv(n_px, TILE_P)
        n_cb = c // BOX_C
        p_scr = p_scr + (pid * PARTS + PART) * (2 * c + 2 * G_PAD)                       # this partition's scratch
        for i in range(PART, gl.cdiv(n_samples - first, per_round), PARTS):
            n = first + i * per_round
            k = i * n_cb * n_pt
            _chunk_stats(ring, ready, k, p_res + n * stride_rn, stride_rc, p_scr, p_part + (n * n_chunks + j) * groups * 2,
                         n_pt, n_px, n_cb, cpg, groups, HAS_RESIDUAL, HAS_PAD, TILE_P, BOX_C, G_PAD, CPG_PAD, SLOTS,
                         WARPS, tile)
            mean, rstd, og, m_g = _meet(p_part + n * n_chunks * groups * 2, p_count + n, p_scr + 2 * c, n_chunks,
                                        chunk_px, hw, cpg, groups, eps, G_PAD, K_BLOCK, WARPS)
            gl.store(p_mean + n * groups + og, mean, mask=m_g & (j == 0))
            gl.store(p_rstd + n * groups + og, rstd, mask=m_g & (j == 0))
            row_base = (n * hw + p0).to(gl.int64) * c
            for cb in range(n_cb):
                ch = cb * BOX_C + cols                                                  # [BOX_C]
                g = ch // cpg
                a = gl.load(p_scr + 2 * c + g * 2 + 1)                                  # rstd_g
                if HAS_WEIGHT:
                    a = a * gl.load(p_w + ch).to(gl.float32)
                b = -gl.load(p_scr + 2 * c + g * 2) * a                                 # -mean_g a
                if HAS_BIAS:
                    b += gl.load(p_b + ch).to(gl.float32)
                a2 = gl.expand_dims(a, 0)
                b2 = gl.expand_dims(b, 0)
                ae = gl.expand_dims(a * _NEG_LOG2E, 0)
                be = gl.expand_dims(b * _NEG_LOG2E, 0)
                for t in range(n_pt):
                    slot = (k + cb * n_pt + t) % SLOTS
                    s = ring.index(slot).load(tile).to(gl.float32)
                    gl.thread_barrier()
                    mbarrier.arrive(empty.index(slot), count=1)
                    z = s * a2 + b2
                    if ACTIVATION == 1:   # z sigmoid(z) = z / (1 + 2^(-z log2 e))
                        z = z * _rcp(1.0 + _ex2(s * ae + be))
                    row = t * TILE_P + rows
                    offs = row_base + gl.expand_dims(row.to(gl.int64) * c, 1) + gl.expand_dims(ch, 0)
                    if HAS_PAD:
                        gl.store(p_y + offs, z.to(ring.dtype),
                                 mask=gl.expand_dims(row < n_px, 1) & gl.expand_dims(cols >= 0, 0))
                    else:
                        gl.store(p_y + offs, z.to(ring.dtype))

    @gluon.jit
    def _group_norm_fwd_hopper_cl_kernel(
            x_desc, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count, n_samples, hw, c, groups, cpg,
            n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps,
            HAS_RESIDUAL: gl.constexpr, HAS_WEIGHT: gl.constexpr, HAS_BIAS: gl.constexpr, ACTIVATION: gl.constexpr,
            HAS_PAD: gl.constexpr, TILE_P: gl.constexpr, BOX_C: gl.constexpr, G_PAD: gl.constexpr,
            CPG_PAD: gl.constexpr, K_BLOCK: gl.constexpr, SLOTS: gl.constexpr, SMEM: gl.constexpr,
            WARPS: gl.constexpr, PARTS: gl.constexpr, COMPUTE_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
        ring = gl.allocate_shared_memory(x_desc.dtype, [SLOTS, TILE_P, BOX_C], SMEM)
        ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(SLOTS):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize([   # two compute partitions take the rounds in turn, one's meeting beside the other's work
            (_compute, (ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count, n_samples,
                        hw, c, groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps, HAS_RESIDUAL,
                        HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, TILE_P, BOX_C, G_PAD, CPG_PAD, K_BLOCK, SLOTS,
                        WARPS, 0, 2)),
            (_compute, (ring, ready, empty, p_res, p_w, p_b, p_y, p_mean, p_rstd, p_part, p_scr, p_count, n_samples,
                        hw, c, groups, cpg, n_chunks, chunk_px, per_round, stride_rn, stride_rc, eps, HAS_RESIDUAL,
                        HAS_WEIGHT, HAS_BIAS, ACTIVATION, HAS_PAD, TILE_P, BOX_C, G_PAD, CPG_PAD, K_BLOCK, SLOTS,
                        WARPS, 1, 2)),
            (_loader, (x_desc, ring, ready, empty, n_samples, hw, n_chunks, chunk_px, per_round, c, TILE_P, BOX_C,
                       SLOTS)),
        ], [WARPS, 1], [COMPUTE_REGS, LOADER_REGS])

    _launch = LaunchCache(_group_norm_fwd_hopper_cl_kernel)


_GL_BITS = {torch.float16: 16, torch.bfloat16: 16, torch.float32: 32}


class Plan(NamedTuple):
    chunk_px: int       # pixels per chunk (a multiple of TILE_P)
    n_chunks: int       # K programs per sample
    per_round: int      # samples per round: the grid is per_round * n_chunks <= SMs


def plan(n: int, c: int, hw: int, element_size: int, sms: int) -> Optional[Plan]:
    """The chunking that minimises rounds x pixel tiles per chunk (the time of the busiest program), ties to fewer,
    larger chunks; None when one pixel tile of all C channels overflows the ring or a sample needs more programs
    than there are SMs."""
    box_c, tile_p = BOX_BYTES // element_size, TILE_BYTES // BOX_BYTES
    if c % box_c:
        return None
    n_cb, n_pt = c // box_c, cdiv(hw, tile_p)
    best = None
    for t in range(1, SLOTS // n_cb + 1):
        k = cdiv(n_pt, t)
        if k > sms:
            continue
        per_round = min(sms // k, n)
        cost = (cdiv(n, per_round) * t, -t)
        if best is None or cost < best[0]:
            best = (cost, Plan(t * tile_p, k, per_round))
    return None if best is None else best[1]


def eligible(x: torch.Tensor, num_groups: int, activation: str, residual_strides, y: torch.Tensor) -> bool:
    """Whether this kernel runs the forward of x into y: 4-D channels_last x and y (dense), 16-byte aligned, fp16 /
    bf16 / fp32, C a multiple of 128 bytes of channels, a pixel tile of all C channels within the ring, no residual
    or one broadcast over the pixels, activation None / SiLU, on sm_90 with triton 3.6."""
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
    box_c, tile_p = BOX_BYTES // x.element_size(), TILE_BYTES // BOX_BYTES
    p = plan(n, c, hw, x.element_size(), sm_count(x.device))
    grid = p.per_round * p.n_chunks
    g_pad = next_power_of_2(num_groups)
    bits = _GL_BITS[x.dtype]
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)
    part = torch.empty(n * p.n_chunks * num_groups * 2 + grid * PARTS * (2 * c + 2 * g_pad), dtype=torch.float32,
                       device=x.device)
    scratch = part[n * p.n_chunks * num_groups * 2:]
    count = torch.zeros(n, dtype=torch.int32, device=x.device)
    bind_cuda_context()
    x_desc = host_descriptor(x, [n * hw, c], [c, 1], [tile_p, box_c], layout)
    dummy = mean
    _launch((grid, ), x_desc, dummy if residual is None else residual, dummy if weight is None else weight,
            dummy if bias is None else bias, y, mean, rstd, part, scratch, count, n, hw, c, num_groups, cpg,
            p.n_chunks, p.chunk_px, p.per_round, *(residual_strides[:2] if residual is not None else (0, 0)),
            float(eps),
            HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            ACTIVATION=ACTIVATIONS.index(activation), HAS_PAD=hw % tile_p != 0, TILE_P=tile_p, BOX_C=box_c,
            G_PAD=g_pad, CPG_PAD=next_power_of_2(cpg), K_BLOCK=min(32, next_power_of_2(p.n_chunks)), SLOTS=SLOTS,
            SMEM=layout, WARPS=COMPUTE_WARPS, PARTS=PARTS, COMPUTE_REGS=COMPUTE_REGS, LOADER_REGS=LOADER_REGS,
            num_warps=COMPUTE_WARPS)
    return y, mean, rstd
