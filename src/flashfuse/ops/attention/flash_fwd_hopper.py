"""FlashAttention forward for Hopper in Gluon, warp-specialized (FlashAttention-3's scheme): a producer
warp streams Q, K and V by TMA; two (or three: CONSUMERS) consumer warpgroups own 64 query rows each, and within
each the softmax of one key block overlaps the P V product of the previous one.

The math is flash_fwd's online softmax (see its docstring; scores in the log2 domain, rows with no
visible key store O = 0 and lse = +inf). What Triton's ``tl.dot`` cannot express is the schedule:
its wgmma waits right after the Q K^T issue, so the exponentials and the tensor cores take turns
(benchmarks/NOTES.md, session 11). Gluon exposes the asynchronous wgmma and its wait, so each consumer
warpgroup runs, per key block j,

    issue  S_j  = Q K_j^T                     (wgmma, async)
    issue  acc += P_{j-1} V_{j-1}             (wgmma, async; P_{j-1} in registers)
    wait   until one group is left            -> S_j is done, P_{j-1} V_{j-1} still running
    softmax(S_j) -> P_j, alpha_j = exp2(m_{j-1} - m_j), l_j
    wait   for P_{j-1} V_{j-1};  acc *= alpha_j

In the SASS the softmax overlaps its own P V only where SPLIT_PV_WAIT is on (hd128 causal from 2K keys): elsewhere
ptxas issues the last wait at the start of the softmax's block, before every exponential, and that measured faster
than the overlap at every other entry (session 30), where the other warpgroup's softmax fills the tensor cores.

K and V tiles stream through NUM_STAGES shared-memory slots: the producer fills a slot once all consumers
released it (mbarriers, one arrival per warpgroup), so the warpgroups are never held in lockstep by a
CTA-wide barrier; they drift apart, one's softmax running beside the other's matrix products. Registers
move to the consumers (240 each, 24 for the producer). Persistent: one program per SM walks the tiles, the
producer loading the next tile's Q (a second Q slot per consumer, Q_STAGES) and K / V while the consumers finish
the last one, O leaving through its own shared-memory slot. Causal tiles are walked in pairs of row blocks
(n - 1 - i, i) of one head, so that every unit of work is about the same size and the static round-robin stays
balanced while the K / V in flight stay within a few heads (L2); an odd number of row blocks runs one tile per
program instead (HOPPER_ODD_CAUSAL_CONFIGS). The descriptors are host-side 4-D ([batch, seqlen, heads, head dim]),
so no tile builds one.

Measured on an H200 (benchmarks/NOTES.md, sessions 14-17): on par with or ahead of cuDNN from 1024 keys at head
dim 128 (causal too) and from 2048 at 64, 1.1-1.6x flash_fwd's Triton kernels, which it replaces from 512 keys.
HOPPER_CONFIGS says where it is used. Tried and dropped: one warpgroup per 64-row tile with every warp doing
everything (session 14), an explicit ping-pong between the consumers (no gain), persistent causal with single
tiles round-robin (session 15: one program got twice another's work), the next tile's first Q K^T issued beside
the last P V of this one (session 17: slower); session 29: half diagonal blocks for the upper warpgroup, one K / V
release per block, O stored from registers (benchmarks/NOTES.md).

Scope: the common case, as flash_fwd's fast kernel, plus sliding windows, varlen, softcap, ALiBi and dropout
(HAS_DROPOUT, session 50: P's dropped scores zeroed before P V by _hopper_common._dropout_keep, dropout.py's mask; O
divided by l (1 - p)): 16-bit inputs, no bias; GQA, a right window (causal) and a left window are in (HAS_LEFT: a
tile's key loop starts at the block its first row sees, and the blocks before the first key its last row sees get the
left mask; session 37).
Softcap (HAS_SOFTCAP, session 48): each score block becomes tanh(S * scale / softcap) by tanh.approx (one MUFU
instruction, as flash-attn's CUDA kernels), the softmax's log2 scale softcap * log2(e). ALiBi (HAS_ALIBI): minus
slope * |row + off - key| added to each scaled score (one subtract and one FMA a score, the row and key indices as fp32
vectors; the slope per tile from alibi_slopes (nheads,) or (batch, nheads)).
Varlen (IS_VARLEN, session 39): the descriptors see the packed tensors as one batch entry, a tile reads its sequence's
bounds from cu_seqlens, row blocks past a sequence's end are skipped and O leaves from registers with its rows masked
(a TMA box would overwrite the next sequence's first rows); a V box reaching past cu_seqlens[-1] has those rows zeroed
by the producer (_zero_rows: NaN padding must not reach the last sequence, session 41). Head dims 64, 128 and 256, and
those between (33..256) padded to them by the TMA boxes alone (kernel_head_dim); at 256 O leaves from registers
(O_FROM_REGS: its shared-memory slots do not fit beside Q and K / V). But 129..160 and 161..192 (forward_head_dim,
session 43): 128 columns plus a TAIL_DIM = 32 / 64 tail, each Q / K / V tile's tail in a box and slots of its own, S
the sum of two wgmma groups, O two accumulators stored from registers: 160 / 256 and 192 / 256 of the padded work (not
varlen: its producer zeroing takes one box); likewise 65..80 and 81..96 (session 46) as 64 columns plus a 16 / 32
tail, O's first 64 columns by TMA and the tail's from registers. Configs: flash_fwd_hopper_configs.py; the tile walk
and the softmax step: flash_fwd_hopper_tiles.py.
Gluon is triton's lower-level dialect and its API still moves between releases, so this kernel is used only on the
release it was written and measured against (GLUON_TRITON); flash_fwd falls back to its Triton kernels everywhere
else, the CPU interpreter included.
"""

from __future__ import annotations

import functools

import torch
import triton

from ..._env import INTERPRET
from .._triton import Launch, LaunchCache, PlanCache, cdiv, launch_device, sm_count
from ._flash_common import alibi_batch_stride
from ._hopper_common import _smem_layout, sequence_geometry
from .flash_fwd_hopper_configs import (HOPPER_CONFIGS, HOPPER_ODD_CAUSAL_CONFIGS, MIN_WAVE,  # noqa: F401
                                       _WARP_SPECIALIZED, _WIDE, forward_head_dim, hopper_forward_config,
                                       kernel_head_dim, main_width, varlen_config)

# The triton release this file's Gluon code is written and GPU-tested against.
GLUON_TRITON = "3.6."

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
except ImportError:  # a triton without Gluon: the kernel below is never defined or used
    gluon = None

LOG2E = 1.4426950408889634


def available(device: torch.device) -> bool:
    """Whether this kernel can run here: compiled (not the interpreter) on an sm_90 GPU, with the
    triton release it was written for."""
    return (gluon is not None and not INTERPRET and triton.__version__.startswith(GLUON_TRITON)
            and device.type == "cuda"
            and _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0))


def descriptor_compatible(*tensors) -> bool:
    """Beyond flash_fwd's TMA checks (16-byte aligned base and strides): the host-side 4-D descriptors take
    every stride as given, so a broadcast dimension (stride 0, e.g. K / V expanded over heads) stays with
    the Triton kernels, which index per (batch, head) themselves."""
    return all(0 not in t.stride() for t in tensors)


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


if gluon is not None:
    from ._hopper_common import _alibi_slope, _dropout_rng, _dropped, _load_zeroed, _packed_end, _seq_bounds, _tma_box
    from .flash_fwd_hopper_tiles import _softmax_block, _ws_key_blocks, _ws_row_block, _ws_tiles

    _LOG2E = gl.constexpr(LOG2E)

    @gluon.jit
    def _tail_load(descs, smem, i: gl.constexpr, b, row, h, bar, slot, HEAD_DIM: gl.constexpr,
                   TAIL_DIM: gl.constexpr):
        """TAIL_DIM > 0: columns HEAD_DIM.. of the tile at (b, row, h) (descs[i]: boxes TAIL_DIM wide, zero-filled
        past the head dim) into smem[i]'s slot, completing on bar with the main box."""
        if TAIL_DIM > 0:
            tma.async_copy_global_to_shared(descs[i], [b, row, h, HEAD_DIM], bar,
                                            _tma_box(smem[i].index(slot), descs[i]))

    @gluon.jit
    def _ws_producer(descs, smem, bars, shape, cu_seqlens, window_left, window_right, HAS_LEFT: gl.constexpr,
                     HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr,
                     PAIRED: gl.constexpr, CONSUMERS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, Q_STAGES: gl.constexpr,
                     TAIL_DIM: gl.constexpr):
        """One warp: per tile, Q into each consumer's slot it % Q_STAGES once that consumer's last Q K^T of the
        tile that used it is done, then K_j / V_j into ring slot c % NUM_STAGES (c counts key blocks over all
        tiles) once all consumers released it. Varlen: a V box reaching past cu_seqlens_k[-1] lands on the producer's
        own barrier (v_ready[NUM_STAGES]), has those rows zeroed (_load_zeroed), then is released on its ready barrier
        (K's need not: S masks them with -inf, not 0 * x). TAIL_DIM: each tile's columns past HEAD_DIM come in a
        second box of their own (_tail_load) on the same barrier."""
        q_desc, k_desc, v_desc, o_desc = descs[:4]
        q_smem, k_smem, v_smem, o_smem = smem[:4]
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        nheads_q, group, seqlen_q, seqlen_k, n_m_blocks, n_units = shape
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        tile_bytes: gl.constexpr = BLOCK_N * (HEAD_DIM + TAIL_DIM) * 2
        k_end = _packed_end(cu_seqlens[1], n_units * (2 if PAIRED else 1) // (n_m_blocks * nheads_q), IS_VARLEN)
        zphase = 0
        c = 0
        it = 0
        for k in range(_ws_tiles(n_units, PAIRED)):
            i_bh, i_m = _ws_row_block(k, n_m_blocks, HAS_RIGHT, PAIRED)
            m0 = i_m * BLOCK_M
            i_h = i_bh % nheads_q
            i_hk = i_h // group
            b, q_start, k_start, sq, sk = _seq_bounds(i_bh // nheads_q, cu_seqlens, seqlen_q, seqlen_k, IS_VARLEN)
            live = True
            if IS_VARLEN:       # row blocks past this sequence's end (cdiv(max_seqlen_q, BLOCK_M) per sequence)
                live = m0 < sq
            if live:
                j0, n_blocks = _ws_key_blocks(m0, sq, sk, window_left, window_right, HAS_LEFT, HAS_RIGHT,
                                              BOTTOM_RIGHT, BLOCK_M, BLOCK_N)
                for w in gl.static_range(CONSUMERS):
                    q_slot = w * Q_STAGES + it % Q_STAGES
                    mbarrier.wait(q_empty.index(q_slot), ((it // Q_STAGES) & 1) ^ 1)     # the slots start free
                    mbarrier.expect(q_ready.index(q_slot), ROWS * (HEAD_DIM + TAIL_DIM) * 2)
                    tma.async_copy_global_to_shared(q_desc, [b, q_start + m0 + w * ROWS, i_h, 0],
                                                    q_ready.index(q_slot), _tma_box(q_smem.index(q_slot), q_desc))
                    _tail_load(descs, smem, 4, b, q_start + m0 + w * ROWS, i_h, q_ready.index(q_slot), q_slot,
                               HEAD_DIM, TAIL_DIM)
                n_plain = n_blocks
                if IS_VARLEN:       # the last block's V box reaches past cu_seqlens_k[-1]: loaded apart, below
                    if k_start + (j0 + n_blocks) * BLOCK_N > k_end:
                        n_plain = n_blocks - 1
                # (a branch per block in the loop below, never taken, cost the varlen forward 2-7%: session 41)
                for j in range(n_plain):
                    slot = (c + j) % NUM_STAGES
                    free_parity = (((c + j) // NUM_STAGES) & 1) ^ 1
                    mbarrier.wait(k_empty.index(slot), free_parity)
                    mbarrier.expect(k_ready.index(slot), tile_bytes)
                    tma.async_copy_global_to_shared(k_desc, [b, k_start + (j0 + j) * BLOCK_N, i_hk, 0],
                                                    k_ready.index(slot), _tma_box(k_smem.index(slot), k_desc))
                    _tail_load(descs, smem, 5, b, k_start + (j0 + j) * BLOCK_N, i_hk, k_ready.index(slot), slot,
                               HEAD_DIM, TAIL_DIM)
                    mbarrier.wait(v_empty.index(slot), free_parity)
                    mbarrier.expect(v_ready.index(slot), tile_bytes)
                    tma.async_copy_global_to_shared(v_desc, [b, k_start + (j0 + j) * BLOCK_N, i_hk, 0],
                                                    v_ready.index(slot), _tma_box(v_smem.index(slot), v_desc))
                    _tail_load(descs, smem, 6, b, k_start + (j0 + j) * BLOCK_N, i_hk, v_ready.index(slot), slot,
                               HEAD_DIM, TAIL_DIM)
                if IS_VARLEN:
                    if n_plain < n_blocks:
                        slot = (c + n_plain) % NUM_STAGES
                        free_parity = (((c + n_plain) // NUM_STAGES) & 1) ^ 1
                        row = k_start + (j0 + n_plain) * BLOCK_N
                        mbarrier.wait(k_empty.index(slot), free_parity)
                        mbarrier.expect(k_ready.index(slot), tile_bytes)
                        tma.async_copy_global_to_shared(k_desc, [b, row, i_hk, 0], k_ready.index(slot),
                                                        _tma_box(k_smem.index(slot), k_desc))
                        mbarrier.wait(v_empty.index(slot), free_parity)
                        zphase = _load_zeroed(v_desc, [b, row, i_hk, 0], v_smem.index(slot), v_ready.index(slot),
                                              tile_bytes, v_ready.index(NUM_STAGES), zphase, k_end - row)
                c += n_blocks
                it += 1

    @gluon.jit
    def _issue_scores(q, k_smem, smem, zero_s, q_slot, slot, TAIL_DIM: gl.constexpr):
        """Issues S = Q K^T for K slot `slot` (async): TAIL_DIM > 0, as the main columns' product plus the tail's
        (smem[4], smem[5]: Q's and K's columns past HEAD_DIM), two wgmma groups into one accumulator."""
        s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if TAIL_DIM > 0:
            s_tok = warpgroup_mma(smem[4].index(q_slot), smem[5].index(slot).permute((1, 0)), s_tok, is_async=True)
        return s_tok

    @gluon.jit
    def _store_o_regs(out, o_out, i_b, i_h, q_start, row0, seqlen_q, COL0: gl.constexpr, layout: gl.constexpr):
        """O_FROM_REGS: a consumer's [ROWS, W] fp32 output (layout: its accumulator's) into out's columns COL0.. of rows
        row0.. (o_out: pointer, strides, head_dim), rows past seqlen_q and columns past head_dim masked."""
        p_out, stride_o_b, stride_o_s, stride_o_h, head_dim = o_out
        cols = COL0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, layout))
        row_ids = row0 + gl.arange(0, out.shape[0], layout=gl.SliceLayout(1, layout))
        offs = (i_b.to(gl.int64) * stride_o_b + i_h.to(gl.int64) * stride_o_h
                + gl.expand_dims((q_start + row_ids).to(gl.int64) * stride_o_s, 1) + gl.expand_dims(cols, 0))
        gl.store(p_out + offs, out.to(p_out.dtype.element_ty),
                 mask=gl.expand_dims(row_ids < seqlen_q, 1) & gl.expand_dims(cols < head_dim, 0))

    @gluon.jit
    def _ws_consumer(descs, p_lse, stride_lse_b, stride_lse_h, o_out, smem, bars, shape, cu_seqlens, window_left,
                     window_right, qk_scale, softcap_scale, alibi, dropout, WG: gl.constexpr, HAS_LEFT: gl.constexpr,
                     HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                     HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr, IS_VARLEN: gl.constexpr, PAIRED: gl.constexpr,
                     CONSUMERS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     NUM_STAGES: gl.constexpr, Q_STAGES: gl.constexpr, SPLIT_PV_WAIT: gl.constexpr,
                     O_FROM_REGS: gl.constexpr, TAIL_DIM: gl.constexpr):
        """One warpgroup, rows [m0 + WG * ROWS, +ROWS) of each tile (ROWS = BLOCK_M / CONSUMERS): the schedule in the module
        docstring (S_j issued beside P_{j-1} V_{j-1}), releasing K / V slots and its Q slots through mbarriers
        (one arrival per warpgroup). Q comes in Q_STAGES slots (with two, the next tile's Q loads while this one
        runs). O leaves through its own shared-memory slot by TMA while the next tile starts, or, O_FROM_REGS (head dims
        padded to 256: no room for the slots), straight from registers (o_out: pointer, strides, head_dim).
        TAIL_DIM > 0 (head dims 65..96, 129..192): columns HEAD_DIM.. of Q, K and V in tiles of their own (smem[4:7]),
        S summed over both parts' products and O held as two accumulators, HEAD_DIM and TAIL_DIM wide (the tail's
        stored from registers). HAS_ALIBI: alibi = (p_alibi, stride_alibi_b), the fp32 slopes [batch or 1, nheads_q]
        (a stride of 0: one slope per head)."""
        q_desc, k_desc, v_desc, o_desc = descs[:4]
        q_smem, k_smem, v_smem, o_smem = smem[:4]
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        nheads_q, group, max_seqlen_q, max_seqlen_k, n_m_blocks, n_units = shape
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
        ot_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, max(TAIL_DIM, 8), 16])
        ot_rows: gl.constexpr = gl.SliceLayout(1, ot_layout)
        TAIL_MMAS: gl.constexpr = 1 if TAIL_DIM > 0 else 0       # each product's second wgmma group (the tail's)
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        # Key blocks narrower than the tile: the tile's trailing blocks that none of this warpgroup's rows sees (the
        # lower warpgroup's half of a causal diagonal) are released unread. (At full-width blocks that happens only
        # at ragged offsets, and the bookkeeping cost 3-7% at hd64 causal: session 23.)
        SKIP_UNSEEN: gl.constexpr = HAS_RIGHT and BLOCK_N < BLOCK_M
        rng = (0, 0, 0, 0, 1.0)
        if HAS_DROPOUT:         # (Philox key, offset, threshold << 24, 1 / (1 - p)): dropout.py's mask
            rng = _dropout_rng(dropout[0], dropout[1])
        c = 0
        it = 0
        for k in range(_ws_tiles(n_units, PAIRED)):
            i_bh, i_m = _ws_row_block(k, n_m_blocks, HAS_RIGHT, PAIRED)
            m0 = i_m * BLOCK_M
            q_start, seqlen_q, seqlen_k = 0, max_seqlen_q, max_seqlen_k
            live = True
            if IS_VARLEN:       # row blocks past this sequence's end (cdiv(max_seqlen_q, BLOCK_M) per sequence)
                _, q_start, _, seqlen_q, seqlen_k = _seq_bounds(i_bh // nheads_q, cu_seqlens, max_seqlen_q,
                                                                max_seqlen_k, IS_VARLEN)
                live = m0 < seqlen_q
            if live:
                j0, n_blocks = _ws_key_blocks(m0, seqlen_q, seqlen_k, window_left, window_right, HAS_LEFT, HAS_RIGHT,
                                              BOTTOM_RIGHT, BLOCK_M, BLOCK_N)
                q_slot = WG * Q_STAGES + it % Q_STAGES
                q = q_smem.index(q_slot)
                row0 = m0 + WG * ROWS
                full_end = seqlen_k
                left_full = 0
                n_mine = n_blocks
                off = seqlen_k - seqlen_q if BOTTOM_RIGHT else 0
                if HAS_LEFT:          # from key left_full on, every row of this warpgroup sees the keys (left side)
                    left_full = gl.minimum(row0 + ROWS, seqlen_q) - 1 + off - window_left
                if HAS_RIGHT:
                    full_end = gl.minimum(row0 + off + window_right + 1, seqlen_k)
                    if SKIP_UNSEEN:
                        seen = gl.minimum(gl.minimum(row0 + ROWS, seqlen_q) + off + window_right, seqlen_k)
                        n_mine = gl.minimum(gl.maximum(gl.cdiv(seen, BLOCK_N) - j0, 1), n_blocks)
                alibi_slope = 0.0
                if HAS_ALIBI:       # this tile's head's slope (in raw score units)
                    alibi_slope = _alibi_slope(alibi, i_bh // nheads_q, i_bh % nheads_q, qk_scale)
                m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
                l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
                acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=o_layout)
                if TAIL_DIM > 0:
                    acc_t = gl.zeros([ROWS, TAIL_DIM], gl.float32, layout=ot_layout)

                mbarrier.wait(q_ready.index(q_slot), (it // Q_STAGES) & 1)
                mbarrier.wait(k_ready.index(c % NUM_STAGES), (c // NUM_STAGES) & 1)
                s_tok = _issue_scores(q, k_smem, smem, zero_s, q_slot, c % NUM_STAGES, TAIL_DIM)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
                mbarrier.arrive(k_empty.index(c % NUM_STAGES), count=1)
                p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, j0, row0, seqlen_q, seqlen_k, full_end, left_full,
                                                    window_left, window_right, qk_scale, softcap_scale, alibi_slope,
                                                    HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, ROWS,
                                                    BLOCK_N, s_layout)
                p_op = gl.convert_layout(_dropped(p, rng, i_bh, row0, j0 * BLOCK_N, s_layout, HAS_DROPOUT).to(dtype),
                                         p_layout)
                for j in range(1, n_mine):
                    slot = (c + j) % NUM_STAGES
                    prev = (c + j - 1) % NUM_STAGES
                    mbarrier.wait(k_ready.index(slot), ((c + j) // NUM_STAGES) & 1)
                    s_tok = _issue_scores(q, k_smem, smem, zero_s, q_slot, slot, TAIL_DIM)
                    mbarrier.wait(v_ready.index(prev), ((c + j - 1) // NUM_STAGES) & 1)
                    acc_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
                    if TAIL_DIM > 0:
                        acc_t_tok = warpgroup_mma(p_op, smem[6].index(prev), acc_t, is_async=True)
                    # S_j done; P V still running
                    s = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(s_tok, ))
                    mbarrier.arrive(k_empty.index(slot), count=1)
                    p, alpha, m_i, l_i = _softmax_block(s, m_i, l_i, j0 + j, row0, seqlen_q, seqlen_k, full_end,
                                                        left_full, window_left, window_right, qk_scale, softcap_scale,
                                                        alibi_slope, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP,
                                                        HAS_ALIBI, ROWS, BLOCK_N, s_layout)
                    if SPLIT_PV_WAIT and j == -1 - seqlen_q:
                        # Never taken (seqlen_q >= 0): the branch ends the block that holds the exponentials above. Without
                        # it ptxas issues the P V wait below at the start of that block (its scheduler places the wgmma
                        # wait as early as it may), before every exponential, so that this softmax never overlapped its
                        # own P V (SASS of every config, session 30).
                        gl.store(p_lse + row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout)), l_i)
                    if TAIL_DIM > 0:
                        acc, acc_t, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, acc_t_tok, p_op))
                        acc_t = acc_t * gl.expand_dims(gl.convert_layout(alpha, ot_rows), 1)
                    else:
                        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, p_op))
                    mbarrier.arrive(v_empty.index(prev), count=1)
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
                    p_op = gl.convert_layout(
                        _dropped(p, rng, i_bh, row0, (j0 + j) * BLOCK_N, s_layout, HAS_DROPOUT).to(dtype), p_layout)
                mbarrier.arrive(q_empty.index(q_slot), count=1)      # every Q K^T of this tile is done
                last = c + n_mine - 1
                mbarrier.wait(v_ready.index(last % NUM_STAGES), (last // NUM_STAGES) & 1)
                acc_tok = warpgroup_mma(p_op, v_smem.index(last % NUM_STAGES), acc, is_async=True)
                if TAIL_DIM > 0:
                    acc_t_tok = warpgroup_mma(p_op, smem[6].index(last % NUM_STAGES), acc_t, is_async=True)
                    acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, acc_t_tok))
                else:
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, ))
                mbarrier.arrive(v_empty.index(last % NUM_STAGES), count=1)

                # (computed here, not before the key loop: live across it they cost 2-3% at hd128 causal 4K keys)
                i_b = i_bh // nheads_q           # varlen: the lse / out batch strides are 0
                i_h = i_bh % nheads_q
                empty = l_i == 0.0
                l_safe = gl.where(empty, 1.0, l_i)
                lse = gl.where(empty, float("inf"), (m_i + gl.log2(l_safe)) / _LOG2E)
                rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
                gl.store(p_lse + i_b.to(gl.int64) * stride_lse_b + i_h.to(gl.int64) * stride_lse_h + q_start + rows,
                         lse, mask=rows < seqlen_q)
                inv_l = 1.0 / l_safe
                if HAS_DROPOUT:         # the kept probabilities scaled by 1 / (1 - p) (lse is the softmax's own)
                    inv_l = inv_l * rng[4]
                out = acc * gl.expand_dims(gl.convert_layout(inv_l, o_rows), 1)
                if O_FROM_REGS:
                    _store_o_regs(out, o_out, i_b, i_h, q_start, row0, seqlen_q, 0, o_layout)
                else:
                    o_buf = o_smem.index(WG)
                    tma.store_wait(pendings=0)       # the previous tile's O has left o_buf
                    o_buf.store(out.to(dtype))
                    fence_async_shared()
                    gl.thread_barrier()
                    # rows past seqlen_q dropped (not varlen: there they are the next sequence's)
                    tma.async_copy_shared_to_global(o_desc, [i_b, row0, i_h, 0], _tma_box(o_buf, o_desc))
                if TAIL_DIM > 0:          # columns HEAD_DIM.. from the tail's accumulator
                    out_t = acc_t * gl.expand_dims(gl.convert_layout(inv_l, ot_rows), 1)
                    _store_o_regs(out_t, o_out, i_b, i_h, q_start, row0, seqlen_q, HEAD_DIM, ot_layout)
                if SKIP_UNSEEN:
                    for j in range(n_mine, n_blocks):
                        # Released once loaded: the slot's previous use has then been released by every warpgroup, so
                        # this arrival cannot count toward it.
                        u = c + j
                        mbarrier.wait(k_ready.index(u % NUM_STAGES), (u // NUM_STAGES) & 1)
                        mbarrier.arrive(k_empty.index(u % NUM_STAGES), count=1)
                        mbarrier.wait(v_ready.index(u % NUM_STAGES), (u // NUM_STAGES) & 1)
                        mbarrier.arrive(v_empty.index(u % NUM_STAGES), count=1)
                c += n_blocks
                it += 1
        tma.store_wait(pendings=0)

    @gluon.jit
    def _flash_fwd_hopper_kernel(
        q_desc, k_desc, v_desc, o_desc, qt_desc, kt_desc, vt_desc, p_lse, stride_lse_b, stride_lse_h, p_out, stride_o_b,
        stride_o_s, stride_o_h, head_dim, p_cu_seqlens_q, p_cu_seqlens_k, nheads_q, group, seqlen_q, seqlen_k, qk_scale,
        softcap_scale, p_alibi, stride_alibi_b, p_rng, dropout_p, window_left, window_right, n_units,
        HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
        HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr, IS_VARLEN: gl.constexpr,
        PAIRED: gl.constexpr, CONSUMERS: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
        Q_STAGES: gl.constexpr, Q_SMEM: gl.constexpr, KV_SMEM: gl.constexpr, CONSUMER_REGS: gl.constexpr,
        SPLIT_PV_WAIT: gl.constexpr, O_FROM_REGS: gl.constexpr, TAIL_DIM: gl.constexpr, QT_SMEM: gl.constexpr,
        KVT_SMEM: gl.constexpr, num_warps: gl.constexpr,
    ):
        # Host-side TMA descriptors over q, o [batch, seqlen_q, nheads_q, head_dim] (boxes [1, 64, 1, HEAD_DIM]) and
        # k, v [batch, seqlen_k, nheads_k, head_dim] (boxes [1, BLOCK_N, 1, HEAD_DIM]), head_dim <= HEAD_DIM
        # (kernel_head_dim): rows past a sequence's end and columns past head_dim are zero-filled on loads and dropped
        # on stores. lse [batch, nheads_q, seqlen_q] fp32. TAIL_DIM > 0 (head dims 65..96 as 64 + 16 / 32 columns,
        # 129..192 as 128 + 32 / 64):
        # qt / kt / vt_desc over q / k / v with boxes [1, rows, 1, TAIL_DIM], loaded at column HEAD_DIM; else unused.
        # Grid (min(n_units, SMs),) persistent, else (n_units,): n_units = cdiv(seqlen_q, BLOCK_M) * batch * nheads_q
        # tiles, or PAIRED (persistent causal, an even row-block count) half as many pairs of tiles (_ws_tile).
        # CONSUMERS (2 or 3) warpgroups of 64 rows: num_warps = 4 is the first (the default partition); the other
        # consumers and the producer warp are the workers.
        gl.static_assert(num_warps == 4)
        gl.static_assert(BLOCK_M == 64 * CONSUMERS)
        gl.static_assert(TAIL_DIM == 0 or not IS_VARLEN)
        dtype: gl.constexpr = q_desc.dtype
        ROWS: gl.constexpr = 64
        q_smem = gl.allocate_shared_memory(dtype, [CONSUMERS * Q_STAGES, ROWS, HEAD_DIM], Q_SMEM)
        if O_FROM_REGS:
            o_smem = p_out                   # no O slots (_ws_consumer stores from registers)
        else:
            o_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, HEAD_DIM], Q_SMEM)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS * Q_STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS * Q_STAGES, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        # varlen: one more, the producer's own (boxes whose rows it zeroes land there first: _load_zeroed)
        v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES + (1 if IS_VARLEN else 0), 1],
                                            mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(CONSUMERS * Q_STAGES):
            mbarrier.init(q_ready.index(w), count=1)
            mbarrier.init(q_empty.index(w), count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)           # one arrival per consumer warpgroup
            mbarrier.init(v_empty.index(i), count=CONSUMERS)
        if IS_VARLEN:
            mbarrier.init(v_ready.index(NUM_STAGES), count=1)
        # varlen: the producer zeroes rows past cu_seqlens[-1] (_load_zeroed); with 24 registers ptxas spilled the
        # kernel's prologue values and the consumers reloaded them every tile (hd128: 28 bytes, 3-5%; session 41)
        PRODUCER_REGS: gl.constexpr = 40 if IS_VARLEN and CONSUMERS == 2 else 24
        descs = (q_desc, k_desc, v_desc, o_desc)
        smem = (q_smem, k_smem, v_smem, o_smem)
        if TAIL_DIM > 0:        # the columns past HEAD_DIM: slots like the main ones', TAIL_DIM wide
            descs = descs + (qt_desc, kt_desc, vt_desc)
            smem = smem + (gl.allocate_shared_memory(dtype, [CONSUMERS * Q_STAGES, ROWS, TAIL_DIM], QT_SMEM),
                           gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, TAIL_DIM], KVT_SMEM),
                           gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, TAIL_DIM], KVT_SMEM))
        bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)
        shape = (nheads_q, group, seqlen_q, seqlen_k, gl.cdiv(seqlen_q, BLOCK_M), n_units)
        o_out = (p_out, stride_o_b, stride_o_s, stride_o_h, head_dim)
        cu_seqlens = (p_cu_seqlens_q, p_cu_seqlens_k)
        alibi = (p_alibi, stride_alibi_b)
        dropout = (p_rng, dropout_p)
        if CONSUMERS == 2:
            gl.warp_specialize([
                (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, o_out, smem, bars, shape, cu_seqlens,
                                window_left, window_right, qk_scale, softcap_scale, alibi, dropout, 0, HAS_LEFT,
                                HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, PAIRED,
                                CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, Q_STAGES, SPLIT_PV_WAIT,
                                O_FROM_REGS, TAIL_DIM)),
                (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, o_out, smem, bars, shape, cu_seqlens,
                                window_left, window_right, qk_scale, softcap_scale, alibi, dropout, 1, HAS_LEFT,
                                HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, PAIRED,
                                CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, Q_STAGES, SPLIT_PV_WAIT,
                                O_FROM_REGS, TAIL_DIM)),
                (_ws_producer, (descs, smem, bars, shape, cu_seqlens, window_left, window_right, HAS_LEFT, HAS_RIGHT,
                                BOTTOM_RIGHT, IS_VARLEN, PAIRED, CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                Q_STAGES, TAIL_DIM)),
            ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, o_out, smem, bars, shape, cu_seqlens,
                                window_left, window_right, qk_scale, softcap_scale, alibi, dropout, 0, HAS_LEFT,
                                HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, PAIRED,
                                CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, Q_STAGES, SPLIT_PV_WAIT,
                                O_FROM_REGS, TAIL_DIM)),
                (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, o_out, smem, bars, shape, cu_seqlens,
                                window_left, window_right, qk_scale, softcap_scale, alibi, dropout, 1, HAS_LEFT,
                                HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, PAIRED,
                                CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, Q_STAGES, SPLIT_PV_WAIT,
                                O_FROM_REGS, TAIL_DIM)),
                (_ws_consumer, (descs, p_lse, stride_lse_b, stride_lse_h, o_out, smem, bars, shape, cu_seqlens,
                                window_left, window_right, qk_scale, softcap_scale, alibi, dropout, 2, HAS_LEFT,
                                HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, PAIRED,
                                CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, Q_STAGES, SPLIT_PV_WAIT,
                                O_FROM_REGS, TAIL_DIM)),
                (_ws_producer, (descs, smem, bars, shape, cu_seqlens, window_left, window_right, HAS_LEFT, HAS_RIGHT,
                                BOTTOM_RIGHT, IS_VARLEN, PAIRED, CONSUMERS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                Q_STAGES, TAIL_DIM)),
            ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])

    _launch_forward = LaunchCache(_flash_fwd_hopper_kernel)

def hopper_forward(q, k, v, out, lse, *, q_strides, k_strides, v_strides, o_strides, lse_strides, nheads_q,
                   nheads_k, seqlen_q, seqlen_k, qk_scale, window_right, bottom_right, config, window_left=-1,
                   cu_seqlens_q=None, cu_seqlens_k=None, softcap_scale=0.0, alibi_slopes=None, dropout_p=0.0,
                   rng_state=None):
    """Launch on validated inputs (flash_fwd's fast-path checks, TMA alignment included) through the plan kept for
    this call signature (_ForwardPlan). Varlen (cu_seqlens_q / k, int32): q / k / v / out (total, heads, head_dim),
    seqlen_q / k the max_seqlen arguments, lse (heads, total_q); the config must store O from registers (rows past a
    sequence's end are the next sequence's: no TMA store may cover them). softcap_scale > 0: scores
    qk_scale * tanh(softcap_scale * Q K^T) (flash_fwd's kernel_options: softmax_scale / softcap, and qk_scale then
    softcap * log2(e)). alibi_slopes: fp32 (nheads_q,) or (batch, nheads_q), contiguous. dropout_p > 0: rng_state
    int64 (seed, offset), dropout.py's mask on P (_hopper_common._dropout_keep)."""
    key = (q.shape, k.shape, q_strides, k_strides, v_strides, o_strides, lse_strides, q.dtype, window_left,
           window_right, bottom_right, softcap_scale > 0, alibi_slopes is not None, dropout_p > 0,
           tuple(config.items()),
           launch_device(), sm_count(q.device),
           None if cu_seqlens_q is None else (cu_seqlens_q.numel(), seqlen_q, seqlen_k))
    plan = _PLANS.get(key, lambda: _ForwardPlan(q, k, nheads_q, nheads_k, seqlen_q, seqlen_k, q_strides, k_strides,
                                                 v_strides, o_strides, lse_strides, window_left, window_right,
                                                 bottom_right, config, cu_seqlens_q, softcap_scale > 0,
                                                 alibi_slopes is not None, dropout_p > 0))
    plan(q, k, v, out, lse, qk_scale, softcap_scale, cu_seqlens_q, cu_seqlens_k, alibi_slopes, dropout_p, rng_state)
    return out, lse


_PLANS = PlanCache()


class _ForwardPlan:
    """What a launch derives from the call's signature alone (grid, row-block walk, descriptor geometry, constexprs,
    the compiled kernel), kept so that a repeated call only builds its four descriptors and launches: host time is
    what short calls are bound by on a slow host (benchmarks/NOTES.md, session 23)."""

    def __init__(self, q, k, nheads_q, nheads_k, seqlen_q, seqlen_k, q_strides, k_strides, v_strides, o_strides,
                 lse_strides, window_left, window_right, bottom_right, config, cu_seqlens_q=None, softcap=False,
                 alibi=False, dropout=False):
        head_dim, batch = q.shape[-1], q.shape[0]
        is_varlen = cu_seqlens_q is not None
        # Varlen: the descriptors see the packed tensors as one batch entry [1, total, heads, head_dim] (the unit
        # dimension's stride any nonzero multiple of 16 bytes); the kernel offsets each sequence's rows.
        rows_q, rows_k = (q.shape[0], k.shape[0]) if is_varlen else (seqlen_q, seqlen_k)
        if is_varlen:
            batch = cu_seqlens_q.numel() - 1
            q_strides, k_strides, v_strides, o_strides = ((t[1] * n, *t[1:]) for t, n in (
                (q_strides, rows_q), (k_strides, rows_k), (v_strides, rows_k), (o_strides, rows_q)))
        cfg = dict(config)
        tail = cfg.setdefault("TAIL_DIM", 0)    # 65..96 and 129..192: 64 / 128 columns, then a tail box
        kernel_dim = main_width(head_dim, tail)
        block_m, block_n = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
        rows = block_m // cfg["CONSUMERS"]          # 64: one consumer warpgroup's rows
        n_m_blocks = cdiv(seqlen_q, block_m)
        paired = cfg["PERSISTENT"] and window_right >= 0     # persistent causal: units of two row blocks (_ws_tile)
        if paired and n_m_blocks % 2:                        # an odd count (configs from outside the table: tests)
            cfg["PERSISTENT"] = paired = False               # one tile per program instead
        n_units = n_m_blocks * batch * nheads_q // (2 if paired else 1)
        grid = (min(n_units, sm_count(q.device)) if cfg.pop("PERSISTENT") else n_units, )
        # The kernel reads each [1, box, 1, head_dim] TMA box as a [box, head_dim] tile (_tma_box): the two layouts
        # must swizzle alike.
        assert all(_smem_layout([1, box, 1, width], q.dtype).swizzle_byte_width
                   == _smem_layout([box, width], q.dtype).swizzle_byte_width
                   for box in (rows, block_n) for width in (kernel_dim, tail or kernel_dim))
        q_kv = ((rows_q, nheads_q, q_strides, rows), (rows_k, nheads_k, k_strides, block_n),
                (rows_k, nheads_k, v_strides, block_n))
        # q, k, v, out with boxes kernel_dim wide, then q, k, v again with the tail's (unused without one)
        self.descriptors = [sequence_geometry(1 if is_varlen else batch, seqlen, heads, head_dim, strides, box,
                                              q.dtype, width)
                            for (seqlen, heads, strides, box), width in (
                                *((g, kernel_dim) for g in (*q_kv, (rows_q, nheads_q, o_strides, rows))),
                                *((g, tail or kernel_dim) for g in q_kv))]
        self.lse_strides = tuple(lse_strides)
        self.o_args = (0 if is_varlen else o_strides[0], *o_strides[1:3], head_dim)  # O_FROM_REGS: out's strides
                                                                                      # and true head dim
        self.sizes = (nheads_q, nheads_q // nheads_k, seqlen_q, seqlen_k)
        self.window = (window_left, window_right, n_units)
        self.launch = Launch(_launch_forward, grid, self.descriptors, HAS_LEFT=window_left >= 0,
                             HAS_RIGHT=window_right >= 0,
                             BOTTOM_RIGHT=bottom_right, HAS_SOFTCAP=softcap, HAS_ALIBI=alibi, HAS_DROPOUT=dropout,
                             IS_VARLEN=is_varlen,
                             PAIRED=paired, BLOCK_M=block_m,
                             BLOCK_N=block_n,
                             HEAD_DIM=kernel_dim,
                             Q_SMEM=_smem_layout([rows, kernel_dim], q.dtype),
                             KV_SMEM=_smem_layout([block_n, kernel_dim], q.dtype),
                             QT_SMEM=_smem_layout([rows, tail or kernel_dim], q.dtype),
                             KVT_SMEM=_smem_layout([block_n, tail or kernel_dim], q.dtype), **cfg)

    def __call__(self, q, k, v, out, lse, qk_scale, softcap_scale=0.0, cu_seqlens_q=None, cu_seqlens_k=None,
                 alibi_slopes=None, dropout_p=0.0, rng_state=None):
        cu_q, cu_k = (lse, lse) if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k)
        alibi = (lse, 0) if alibi_slopes is None else (alibi_slopes, alibi_batch_stride(alibi_slopes))
        self.launch(q, k, v, out, q, k, v, lse, *self.lse_strides, out, *self.o_args, cu_q, cu_k, *self.sizes,
                    qk_scale, softcap_scale, *alibi, lse if rng_state is None else rng_state, float(dropout_p),
                    *self.window)
