"""FlashAttention forward for Hopper in Gluon: the softmax of one key block overlaps the P V product
of the previous one (FlashAttention-3's intra-warpgroup pipelining).

The math is flash_fwd's online softmax (see its docstring; scores in the log2 domain, rows with no
visible key store O = 0 and lse = +inf). What Triton's ``tl.dot`` cannot express is the schedule:
its wgmma waits right after the Q K^T issue, so the exponentials and the tensor cores take turns
(benchmarks/NOTES.md, session 11). Gluon exposes the asynchronous wgmma and its wait, so each key
block j runs

    issue  S_j  = Q K_j^T                     (wgmma, async)
    issue  acc += P_{j-1} V_{j-1}             (wgmma, async; P_{j-1} in registers)
    wait   until one group is left            -> S_j is done, P_{j-1} V_{j-1} still running
    softmax(S_j) -> P_j, alpha_j = exp2(m_{j-1} - m_j), l_j
    wait   for P_{j-1} V_{j-1};  acc *= alpha_j

K and V tiles stream through NUM_STAGES shared-memory slots filled by TMA (mbarrier per slot): a K
slot is refilled as soon as its Q K^T is done, a V slot once its P V is done.

Two kernels run this schedule:

- ``_flash_fwd_hopper_kernel``: every warp does everything. At head dim 64, one warpgroup on 64 x 128
  tiles (two programs per SM) measured 5-11% faster than flash_fwd's Triton kernels (H200, session 14).
  With two warpgroups on 128-row tiles (head dim 128) it lost: the warpgroups share K / V slots, so each
  refill takes a CTA-wide barrier and they run in lockstep, both on the softmax at once; and ptxas moves
  the P V wait above the exponentials (the new P takes the registers of the old one).
- ``_flash_fwd_hopper_ws_kernel`` (FlashAttention-3's warp specialization): a producer warp streams Q,
  K and V by TMA; two consumer warpgroups own 64 query rows each and run the schedule above, releasing
  slots through mbarriers (one arrival per warpgroup) instead of CTA-wide barriers. The warpgroups
  drift apart, one's softmax running beside the other's matrix products, and the registers move to the
  consumers (240 each, 24 for the producer). Optionally persistent: one program per SM walks the tiles,
  the producer loading the next tile while the consumers finish the last one, O leaving through its own
  shared-memory slot. At head dim 128 this measured 1.0-1.3x the Triton kernels and 0.77-1.05x cuDNN
  (session 15); an explicit ping-pong between the warpgroups (mbarrier turns) measured no faster.

HOPPER_CONFIGS says where each one is used.

Scope: the common case only, as flash_fwd's fast kernel: 16-bit inputs, no dropout / ALiBi / softcap /
bias / left window / varlen; a right window (causal) and GQA are in. Gluon is triton's lower-level
dialect and its API still moves between releases, so this kernel is used only on the release it was
written and measured against (GLUON_TRITON); flash_fwd falls back to its Triton kernels everywhere
else, the CPU interpreter included.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..._env import INTERPRET
from .._triton import cdiv, ensure_tma_allocator, sm_count

# The triton release this file's Gluon code is written and GPU-tested against.
GLUON_TRITON = "3.6."

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # a triton without Gluon: the kernel below is never defined or used
    gluon = None

LOG2E = 1.4426950408889634


def available(device: torch.device) -> bool:
    """Whether this kernel can run here: compiled (not the interpreter) on an sm_90 GPU, with the
    triton release it was written for."""
    return (gluon is not None and not INTERPRET and triton.__version__.startswith(GLUON_TRITON)
            and device.type == "cuda"
            and _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0))


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


if gluon is not None:
    _LOG2E = gl.constexpr(LOG2E)

    @gluon.jit
    def _softmax_block(s, m_i, l_i, j, m0, seqlen_q, seqlen_k, full_end, window_right, qk_scale,
                       HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr,
                       BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """Online-softmax step for key block j: s [BLOCK_M, BLOCK_N] raw Q K^T (fp32, s_layout).
        Returns (p, alpha, m_new, l_new); blocks reaching past full_end get the causal / length mask."""
        if (j + 1) * BLOCK_N > full_end:
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            visible = gl.expand_dims(cols < seqlen_k, 0)
            if HAS_RIGHT:
                off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
                visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + off + window_right, 1))
            s = gl.where(visible, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)   # rows with no visible key yet
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_safe, 1))
        alpha = gl.exp2(m_i - m_safe)
        l_new = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_new

    @gluon.jit
    def _flash_fwd_hopper_kernel(
        p_q, p_k, p_v, p_o, p_lse,
        stride_q_b, stride_q_s, stride_q_h,
        stride_k_b, stride_k_s, stride_k_h,
        stride_v_b, stride_v_s, stride_v_h,
        stride_o_b, stride_o_s, stride_o_h,
        stride_lse_b, stride_lse_h,
        nheads_q, group, seqlen_q, seqlen_k, qk_scale, window_right,
        HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
        Q_SMEM: gl.constexpr, KV_SMEM: gl.constexpr, num_warps: gl.constexpr,
    ):
        # q, o: [batch, seqlen_q, nheads_q, HEAD_DIM]; k, v: [batch, seqlen_k, nheads_k, HEAD_DIM]; lse:
        # [batch, nheads_q, seqlen_q] fp32. Grid (cdiv(seqlen_q, BLOCK_M), batch * nheads_q), heaviest
        # (causal: last) row blocks first. The launcher checked TMA's 16-byte alignment of bases and strides.
        dtype: gl.constexpr = p_q.dtype.element_ty
        # wgmma accumulators: warps stacked along rows (16 rows each), one instruction spans all columns.
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

        i_m = gl.num_programs(0) - 1 - gl.program_id(0)
        i_bh = gl.program_id(1)
        i_b = (i_bh // nheads_q).to(gl.int64)
        i_h = (i_bh % nheads_q).to(gl.int64)
        i_hk = i_h // group
        m0 = i_m * BLOCK_M
        # One [seqlen, HEAD_DIM] matrix per (batch, head): TMA zero-fills rows past seqlen on loads and
        # drops them on stores.
        q_desc = tma.make_tensor_descriptor(p_q + i_b * stride_q_b + i_h * stride_q_h, [seqlen_q, HEAD_DIM],
                                            [stride_q_s, 1], [BLOCK_M, HEAD_DIM], Q_SMEM)
        k_desc = tma.make_tensor_descriptor(p_k + i_b * stride_k_b + i_hk * stride_k_h, [seqlen_k, HEAD_DIM],
                                            [stride_k_s, 1], [BLOCK_N, HEAD_DIM], KV_SMEM)
        v_desc = tma.make_tensor_descriptor(p_v + i_b * stride_v_b + i_hk * stride_v_h, [seqlen_k, HEAD_DIM],
                                            [stride_v_s, 1], [BLOCK_N, HEAD_DIM], KV_SMEM)
        o_desc = tma.make_tensor_descriptor(p_o + i_b * stride_o_b + i_h * stride_o_h, [seqlen_q, HEAD_DIM],
                                            [stride_o_s, 1], [BLOCK_M, HEAD_DIM], Q_SMEM)

        # Key range: [0, hi) is visible to some row of the block; [0, full_end) to every row.
        hi = seqlen_k
        full_end = seqlen_k
        if HAS_RIGHT:
            off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
            last_row = gl.minimum(m0 + BLOCK_M, seqlen_q) - 1
            hi = gl.maximum(gl.minimum(last_row + off + window_right + 1, seqlen_k), 0)
            full_end = gl.minimum(m0 + off + window_right + 1, seqlen_k)
        # A block whose rows see no key still runs block 0, fully masked: O = 0, lse = +inf.
        n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)

        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM)       # Q, then O
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)

        tile_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
        mbarrier.expect(q_bar, BLOCK_M * HEAD_DIM * 2)
        tma.async_copy_global_to_shared(q_desc, [m0, 0], q_bar, q_smem)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.expect(k_bars.index(i), tile_bytes, pred=i < n_blocks)
            tma.async_copy_global_to_shared(k_desc, [i * BLOCK_N, 0], k_bars.index(i), k_smem.index(i),
                                            pred=i < n_blocks)
            mbarrier.expect(v_bars.index(i), tile_bytes, pred=i < n_blocks)
            tma.async_copy_global_to_shared(v_desc, [i * BLOCK_N, 0], v_bars.index(i), v_smem.index(i),
                                            pred=i < n_blocks)

        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)

        # Block 0: S_0 and its softmax.
        mbarrier.wait(q_bar, 0)
        mbarrier.wait(k_bars.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
        if num_warps > 4:
            gl.thread_barrier()            # every warpgroup is done with K slot 0
        mbarrier.expect(k_bars.index(0), tile_bytes, pred=NUM_STAGES < n_blocks)
        tma.async_copy_global_to_shared(k_desc, [NUM_STAGES * BLOCK_N, 0], k_bars.index(0), k_smem.index(0),
                                        pred=NUM_STAGES < n_blocks)
        p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, 0, m0, seqlen_q, seqlen_k, full_end, window_right,
                                            qk_scale, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_M, BLOCK_N, s_layout)
        p_op = gl.convert_layout(p.to(dtype), p_layout)       # P_0 as wgmma's register operand

        for j in range(1, n_blocks):
            slot = j % NUM_STAGES
            prev = (j - 1) % NUM_STAGES
            mbarrier.wait(k_bars.index(slot), (j // NUM_STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // NUM_STAGES) & 1)
            acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))          # S_j done; P V still running
            if num_warps > 4:
                gl.thread_barrier()
            refill_k = j + NUM_STAGES < n_blocks
            mbarrier.expect(k_bars.index(slot), tile_bytes, pred=refill_k)
            tma.async_copy_global_to_shared(k_desc, [(j + NUM_STAGES) * BLOCK_N, 0], k_bars.index(slot),
                                            k_smem.index(slot), pred=refill_k)
            p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, j, m0, seqlen_q, seqlen_k, full_end, window_right,
                                                qk_scale, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_M, BLOCK_N, s_layout)
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_op))
            if num_warps > 4:
                gl.thread_barrier()
            refill_v = j - 1 + NUM_STAGES < n_blocks
            mbarrier.expect(v_bars.index(prev), tile_bytes, pred=refill_v)
            tma.async_copy_global_to_shared(v_desc, [(j - 1 + NUM_STAGES) * BLOCK_N, 0], v_bars.index(prev),
                                            v_smem.index(prev), pred=refill_v)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        last = n_blocks - 1
        mbarrier.wait(v_bars.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
        acc_tok = warpgroup_mma(p_op, v_smem.index(last % NUM_STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))

        mbarrier.invalidate(q_bar)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))

        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) / _LOG2E)
        rows = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        gl.store(p_lse + i_b * stride_lse_b + i_h * stride_lse_h + rows, lse, mask=rows < seqlen_q)
        out = acc * gl.expand_dims(gl.convert_layout(1.0 / l_safe, o_rows), 1)
        if num_warps > 4:
            gl.thread_barrier()            # every warpgroup's last Q K^T is done before Q's slot holds O
        q_smem.store(out.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(o_desc, [m0, 0], q_smem)            # rows past seqlen_q dropped
        tma.store_wait(pendings=0)


    # ---- Warp-specialized, persistent variant: a producer warp streams Q / K / V, two consumer warpgroups
    # own 64 query rows each; every program walks tiles t = pid, pid + nprog, ... of (row block, batch, head).

    @gluon.jit
    def _tma_box(buf, desc):
        """A [rows, HEAD_DIM] shared-memory tile seen as the descriptor's [1, rows, 1, HEAD_DIM] box: the unit
        dims change nothing in memory (same swizzle), only the rank TMA addresses."""
        return buf._reinterpret(buf.dtype, desc.block_type.shape, desc.layout)

    @gluon.jit
    def _ws_tile(t, n_m_blocks, seqlen_q, seqlen_k, window_right, HAS_RIGHT: gl.constexpr,
                 BOTTOM_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Tile t -> (batch*head, first row, number of key blocks): the row blocks of one head side by side
        (K / V reuse in L2), causal heaviest (last) first. (Causal with all heads' heaviest blocks first,
        for a balanced static round-robin, measured slower: the K / V in flight no longer fit L2.)"""
        i_m = t % n_m_blocks
        if HAS_RIGHT:
            i_m = n_m_blocks - 1 - i_m
        i_bh = t // n_m_blocks
        m0 = i_m * BLOCK_M
        hi = seqlen_k
        if HAS_RIGHT:
            off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
            last_row = gl.minimum(m0 + BLOCK_M, seqlen_q) - 1
            hi = gl.maximum(gl.minimum(last_row + off + window_right + 1, seqlen_k), 0)
        # A block whose rows see no key still runs block 0, fully masked: O = 0, lse = +inf.
        return i_bh, m0, gl.maximum(gl.cdiv(hi, BLOCK_N), 1)

    @gluon.jit
    def _ws_producer(descs, smem, bars, shape, window_right, HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
        """One warp: per tile, Q into each consumer's slot once that consumer's last Q K^T of the previous
        tile is done, then K_j / V_j into ring slot c % NUM_STAGES (c counts key blocks over all tiles) once
        both consumers released it."""
        q_desc, k_desc, v_desc, o_desc = descs
        q_smem, k_smem, v_smem, o_smem = smem
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        nheads_q, group, seqlen_q, seqlen_k, n_m_blocks, n_tiles = shape
        ROWS: gl.constexpr = BLOCK_M // 2
        dtype: gl.constexpr = q_smem.dtype
        tile_bytes: gl.constexpr = BLOCK_N * HEAD_DIM * 2
        c = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            i_bh, m0, n_blocks = _ws_tile(t, n_m_blocks, seqlen_q, seqlen_k, window_right, HAS_RIGHT,
                                          BOTTOM_RIGHT, BLOCK_M, BLOCK_N)
            i_b = i_bh // nheads_q
            i_h = i_bh % nheads_q
            i_hk = i_h // group
            for w in gl.static_range(2):
                mbarrier.wait(q_empty.index(w), (it & 1) ^ 1)     # the first tile passes: the slots start free
                mbarrier.expect(q_ready.index(w), ROWS * HEAD_DIM * 2)
                tma.async_copy_global_to_shared(q_desc, [i_b, m0 + w * ROWS, i_h, 0], q_ready.index(w),
                                                _tma_box(q_smem.index(w), q_desc))
            for j in range(n_blocks):
                slot = (c + j) % NUM_STAGES
                free_parity = (((c + j) // NUM_STAGES) & 1) ^ 1
                mbarrier.wait(k_empty.index(slot), free_parity)
                mbarrier.expect(k_ready.index(slot), tile_bytes)
                tma.async_copy_global_to_shared(k_desc, [i_b, j * BLOCK_N, i_hk, 0], k_ready.index(slot),
                                                _tma_box(k_smem.index(slot), k_desc))
                mbarrier.wait(v_empty.index(slot), free_parity)
                mbarrier.expect(v_ready.index(slot), tile_bytes)
                tma.async_copy_global_to_shared(v_desc, [i_b, j * BLOCK_N, i_hk, 0], v_ready.index(slot),
                                                _tma_box(v_smem.index(slot), v_desc))
            c += n_blocks
            it += 1

    @gluon.jit
    def _ws_consumer(descs, p_lse, stride_lse_b, stride_lse_h, smem, bars, shape, window_right, qk_scale,
                     WG: gl.constexpr, HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr):
        """One warpgroup, rows [m0 + WG * BLOCK_M / 2, +BLOCK_M / 2) of each tile: the schedule of the kernel
        above (S_j issued beside P_{j-1} V_{j-1}), releasing K / V slots and its Q slot through mbarriers
        instead of CTA-wide barriers, so the two warpgroups drift apart and take turns on the tensor cores.
        O leaves through its own shared-memory slot by TMA while the next tile starts."""
        q_desc, k_desc, v_desc, o_desc = descs
        q_smem, k_smem, v_smem, o_smem = smem
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        nheads_q, group, seqlen_q, seqlen_k, n_m_blocks, n_tiles = shape
        ROWS: gl.constexpr = BLOCK_M // 2
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        q = q_smem.index(WG)
        o_buf = o_smem.index(WG)
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        c = 0
        it = 0
        for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
            i_bh, m0, n_blocks = _ws_tile(t, n_m_blocks, seqlen_q, seqlen_k, window_right, HAS_RIGHT,
                                          BOTTOM_RIGHT, BLOCK_M, BLOCK_N)
            row0 = m0 + WG * ROWS
            full_end = seqlen_k
            if HAS_RIGHT:
                off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
                full_end = gl.minimum(row0 + off + window_right + 1, seqlen_k)
            m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)

            mbarrier.wait(q_ready.index(WG), it & 1)
            mbarrier.wait(k_ready.index(c % NUM_STAGES), (c // NUM_STAGES) & 1)
            s_tok = warpgroup_mma(q, k_smem.index(c % NUM_STAGES).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
            mbarrier.arrive(k_empty.index(c % NUM_STAGES), count=1)
            p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, 0, row0, seqlen_q, seqlen_k, full_end, window_right,
                                                qk_scale, HAS_RIGHT, BOTTOM_RIGHT, ROWS, BLOCK_N, s_layout)
            p_op = gl.convert_layout(p.to(dtype), p_layout)
            for j in range(1, n_blocks):
                slot = (c + j) % NUM_STAGES
                prev = (c + j - 1) % NUM_STAGES
                mbarrier.wait(k_ready.index(slot), ((c + j) // NUM_STAGES) & 1)
                s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                mbarrier.wait(v_ready.index(prev), ((c + j - 1) // NUM_STAGES) & 1)
                acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))       # S_j done; P V still running
                mbarrier.arrive(k_empty.index(slot), count=1)
                p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, j, row0, seqlen_q, seqlen_k, full_end,
                                                    window_right, qk_scale, HAS_RIGHT, BOTTOM_RIGHT, ROWS, BLOCK_N,
                                                    s_layout)
                acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_op))
                mbarrier.arrive(v_empty.index(prev), count=1)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
                p_op = gl.convert_layout(p.to(dtype), p_layout)
            mbarrier.arrive(q_empty.index(WG), count=1)      # every Q K^T of this tile is done
            last = c + n_blocks - 1
            mbarrier.wait(v_ready.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
            acc_tok = warpgroup_mma(p_op, v_smem.index(last % NUM_STAGES), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
            mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)

            i_b = i_bh // nheads_q
            i_h = i_bh % nheads_q
            empty = l_i == 0.0
            l_safe = gl.where(empty, 1.0, l_i)
            lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) / _LOG2E)
            rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
            gl.store(p_lse + i_b.to(gl.int64) * stride_lse_b + i_h.to(gl.int64) * stride_lse_h + rows, lse,
                     mask=rows < seqlen_q)
            out = acc * gl.expand_dims(gl.convert_layout(1.0 / l_safe, o_rows), 1)
            tma.store_wait(pendings=0)       # the previous tile's O has left o_buf
            o_buf.store(out.to(dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(o_desc, [i_b, row0, i_h, 0], _tma_box(o_buf, o_desc))  # rows past seqlen_q dropped
            c += n_blocks
            it += 1
        tma.store_wait(pendings=0)

    @gluon.jit
    def _flash_fwd_hopper_ws_kernel(
        q_desc, k_desc, v_desc, o_desc, p_lse, stride_lse_b, stride_lse_h,
        nheads_q, group, seqlen_q, seqlen_k, qk_scale, window_right, n_tiles,
        HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
        Q_SMEM: gl.constexpr, KV_SMEM: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):
        # Host-side TMA descriptors over q, o [batch, seqlen_q, nheads_q, HEAD_DIM] (boxes [1, BLOCK_M / 2, 1,
        # HEAD_DIM]) and k, v [batch, seqlen_k, nheads_k, HEAD_DIM] (boxes [1, BLOCK_N, 1, HEAD_DIM]): rows past
        # a sequence's end are zero-filled on loads and dropped on stores. lse [batch, nheads_q, seqlen_q] fp32.
        # Grid (min(n_tiles, programs),): n_tiles = cdiv(seqlen_q, BLOCK_M) * batch * nheads_q. num_warps = 4 is
        # the first consumer warpgroup (the default partition); the second consumer and the producer warp are
        # the workers.
        gl.static_assert(num_warps == 4)
        gl.static_assert(BLOCK_M == 128)
        dtype: gl.constexpr = q_desc.dtype
        ROWS: gl.constexpr = BLOCK_M // 2
        q_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], Q_SMEM)
        o_smem = gl.allocate_shared_memory(dtype, [2, ROWS, HEAD_DIM], Q_SMEM)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(2):
            mbarrier.init(q_ready.index(w), count=1)
            mbarrier.init(q_empty.index(w), count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)           # one arrival per consumer warpgroup
            mbarrier.init(v_empty.index(i), count=2)

        descs = (q_desc, k_desc, v_desc, o_desc)
        smem = (q_smem, k_smem, v_smem, o_smem)
        bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
        shape = (nheads_q, group, seqlen_q, seqlen_k, gl.cdiv(seqlen_q, BLOCK_M), n_tiles)
        gl.warp_specialize([
            (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, smem, bars, shape, window_right, qk_scale, 0,
                            HAS_RIGHT, BOTTOM_RIGHT, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES)),
            (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, smem, bars, shape, window_right, qk_scale, 1,
                            HAS_RIGHT, BOTTOM_RIGHT, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES)),
            (_ws_producer, (descs, smem, bars, shape, window_right, HAS_RIGHT, BOTTOM_RIGHT, BLOCK_M, BLOCK_N,
                            HEAD_DIM, NUM_STAGES)),
        ], [4, 1], [CONSUMER_REGS, 24])

_WARP_SPECIALIZED = dict(BLOCK_M=128, BLOCK_N=128, NUM_STAGES=2, num_warps=4, WARP_SPECIALIZED=True, CONSUMER_REGS=240)

# (head dim, right window / causal) -> ((shortest key loop, config), ...): where these kernels measured faster
# than flash_fwd's (H200, bf16, 16384 tokens, model dim 2048; benchmarks/NOTES.md sessions 14-15). A call takes
# the last entry whose key loop is at most seqlen_k.
# - hd64 without a mask, one warpgroup on 64 x 128 tiles (two programs per SM), from S = 2048 (S = 1024: 375.5
#   vs 377 TFLOP/s): 424 / 449 / 463 / 466 TFLOP/s at S = 2048..16384 vs 403 / 416 / 419 / 422 (cuDNN 451 / 465
#   / 467 / 467). The warp-specialized kernel measured slower at hd64 (e.g. 400 vs 427 at S = 2048).
# - hd128 without a mask, warp-specialized and persistent: 466 / 542 / 581 / 588 / 594 / 599 TFLOP/s at
#   S = 512..16384 (one tile per program: 405 / 490 / 548 / 585 / 604 / 612) vs the Triton kernel's 294 / 384 /
#   473 / 505 / 525 / 544 (cuDNN 499 / 564 / 585 / 609 / 606 / 615).
# - hd128 causal, warp-specialized, one tile per program, heaviest first: 248 / 364 / 461 / 530 / 571 / 613 at
#   S = 512..16384 vs 212 / 287 / 368 / 443 / 492 / 542 (cuDNN 331 / 417 / 489 / 522 / 536 / 560). Persistent
#   measured slower from S = 4096 (437 vs 613 at 16384: the static round-robin balances causal tiles badly).
# ptxas: 187 registers, 74 KB of shared memory (hd64); 168 at launch, 240 per consumer warpgroup, 192 KB (hd128).
HOPPER_CONFIGS = {
    (64, False): ((2048, dict(BLOCK_M=64, BLOCK_N=128, NUM_STAGES=2, num_warps=4)), ),
    (128, False): ((512, dict(_WARP_SPECIALIZED, PERSISTENT=True)), ),
    (128, True): ((512, dict(_WARP_SPECIALIZED, PERSISTENT=False)), ),
}


def hopper_forward_config(head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int, programs_per_row_block: int,
                          num_sms: int):
    """This file's config for a call, or None where flash_fwd's kernels measured faster: head dims and masks
    without a HOPPER_CONFIGS entry, key loops shorter than the entry's, grids under two waves."""
    config = None
    for min_seqlen_k, entry in HOPPER_CONFIGS.get((head_dim, causal), ()):
        if seqlen_k >= min_seqlen_k:
            config = entry
    if config is None or cdiv(seqlen_q, config["BLOCK_M"]) * programs_per_row_block < 2 * num_sms:
        return None
    return dict(config)


def _smem_layout(block_shape, dtype):
    return gl.NVMMASharedLayout.get_default_for(block_shape, gl.bfloat16 if dtype == torch.bfloat16 else gl.float16)


def hopper_forward(q, k, v, out, lse, *, q_strides, k_strides, v_strides, o_strides, lse_strides, nheads_q,
                   nheads_k, seqlen_q, seqlen_k, qk_scale, window_right, bottom_right, config):
    """Launch on validated inputs (flash_fwd's fast-path checks, TMA alignment included)."""
    head_dim = q.shape[-1]
    cfg = dict(config)
    block_m, block_n = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    consts = dict(HAS_RIGHT=window_right >= 0, BOTTOM_RIGHT=bottom_right, BLOCK_M=block_m, BLOCK_N=block_n,
                  HEAD_DIM=head_dim, KV_SMEM=_smem_layout([block_n, head_dim], q.dtype))
    if cfg.pop("WARP_SPECIALIZED", False):
        batch, rows = q.shape[0], block_m // 2
        n_tiles = cdiv(seqlen_q, block_m) * batch * nheads_q
        programs = min(n_tiles, sm_count(q.device)) if cfg.pop("PERSISTENT") else n_tiles
        # The kernel reads each [1, box, 1, head_dim] TMA box as a [box, head_dim] tile (_tma_box): the two
        # layouts must swizzle alike.
        assert all(_smem_layout([1, box, 1, head_dim], q.dtype).swizzle_byte_width
                   == _smem_layout([box, head_dim], q.dtype).swizzle_byte_width for box in (rows, block_n))
        # triton encodes host-side descriptors before its launcher binds the CUDA context to the calling
        # thread, and a new thread has none yet ("invalid device context"): any CUDA runtime call binds it,
        # and this one is also legal while a CUDA graph is being captured.
        torch.cuda.is_current_stream_capturing()
        descs = [TensorDescriptor(t, [batch, seqlen, heads, head_dim], list(strides), [1, box, 1, head_dim],
                                  _smem_layout([1, box, 1, head_dim], q.dtype))
                 for t, seqlen, heads, strides, box in ((q, seqlen_q, nheads_q, q_strides, rows),
                                                        (k, seqlen_k, nheads_k, k_strides, block_n),
                                                        (v, seqlen_k, nheads_k, v_strides, block_n),
                                                        (out, seqlen_q, nheads_q, o_strides, rows))]
        _flash_fwd_hopper_ws_kernel[(programs, )](
            *descs, lse, *lse_strides, nheads_q, nheads_q // nheads_k, seqlen_q, seqlen_k, qk_scale, window_right,
            n_tiles, Q_SMEM=_smem_layout([rows, head_dim], q.dtype), **consts, **cfg)
    else:
        ensure_tma_allocator()          # device-side descriptors
        grid = (cdiv(seqlen_q, block_m), q.shape[0] * nheads_q)
        _flash_fwd_hopper_kernel[grid](
            q, k, v, out, lse, *q_strides[:3], *k_strides[:3], *v_strides[:3], *o_strides[:3], *lse_strides,
            nheads_q, nheads_q // nheads_k, seqlen_q, seqlen_k, qk_scale, window_right,
            Q_SMEM=_smem_layout([block_m, head_dim], q.dtype), **consts, **cfg)
    return out, lse
