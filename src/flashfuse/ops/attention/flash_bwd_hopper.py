"""FlashAttention backward for Hopper in Gluon, warp-specialized (FlashAttention-3's scheme): 5 matrix products
per tile instead of flash_bwd's 7, dQ added into an fp32 buffer by TMA reduce-adds.

The math is flash_bwd's (see its docstring). One program owns a block of BLOCK_N keys of one kv head and keeps
K, V and the dK, dV accumulators on chip while it walks the query blocks that see those keys (every query head
of its GQA group). Per query block of BLOCK_M rows, with scores in the transposed layout (keys are the rows,
so P^T and dS^T land in registers as the A operands of their products):

    S^T   = K Q^T                 [BLOCK_N, BLOCK_M]   wgmma, async
    dP^T  = V dO^T                [BLOCK_N, BLOCK_M]   wgmma, async
    P^T   = exp2(S^T * scale * log2(e) - lse2)         (lse2 = lse * log2(e), per query: a column vector)
    dV   += P^T dO                [BLOCK_N, D]         issued as soon as P^T exists; dP^T still running
    dS^T  = P^T * (dP^T - delta)                       (delta = rowsum(dO * O), flash_bwd's preprocess)
    dK   += dS^T Q                [BLOCK_N, D]
    dQ_j  = dS K = (dS^T)^T K     [BLOCK_M, D]         dS^T through shared memory (both warpgroups' keys)
    dQ   += dQ_j                                        TMA reduce-add (fp32) into a zeroed [B, S, H, D] buffer

with the softmax scale folded into dS (so dK and dQ need no final scaling); at the end dK, dV leave through
K / V's shared memory by TMA, and dQ is the buffer cast to dQ's dtype. A producer warp streams Q, dO and their
lse2 / delta rows by TMA into NUM_STAGES slots (one mbarrier pair per slot); the consumer is one 8-warp partition
(two warpgroups, 64 keys each, the dQ product split by head-dim halves), with 240 registers per thread (dK and dV
alone take 128) and two CTA barriers per query block. That is _bwd_consumer, used at head dim 128 (64-row query
blocks).

At head dim 64 a 64-row query block carries half the matrix work of head dim 128 for the same softmax, waits and
barriers; FlashAttention-3 takes 128-row blocks there. In the transposed layout those spill (each thread holds 32
queries' lse2 and delta), so _bwd_consumer_rows keeps scores in the row layout (S = Q K^T, each warpgroup 64 query
rows, each thread 2), passes P and dS to the dV and dK products through shared memory, read transposed (three CTA
barriers per block), and takes dQ_j = dS K from the warpgroup's own dS registers.

Head dims above 128 take _bwd_consumer_rows with 64 x 64 steps, each warpgroup half of the head dim in dK and dV,
and leave dQ to a pass of its own (DQ_PASS, flash_bwd_dq_hopper): adding a [64, 256] fp32 dQ tile into L2 per step,
by atomics (the TMA reduce-add's fp32 slots do not fit beside two Q / dO stages), bound the one-pass kernel at
~1.6 TB/s of reductions (benchmarks/NOTES.md, session 38). 129..160 and 161..192 compute 128
columns plus a 32- / 64-column tail (TAIL_DIM, as the forward: each Q / K / V / dO tile's columns past 128 in a box and
tiles of their own; session 44), 193..256 are padded to 256; varlen pads 129..256 to 256. (Leaving a step's dV / dK
in flight while the next step's S / dP are issued measured 0.75-0.82x: an accumulator in flight across the loop's
back edge makes ptxas serialize every wgmma of the kernel; session 44.) 65..80 take _bwd_consumer at 64 columns plus
a 16-column tail, dQ's tail reduce-added through fp32 slots and a descriptor of its own (session 46); 81..128 are
padded to 128.

Measured (benchmarks/NOTES.md, sessions 16, 22, 38 and 45): hd128 0.93-1.03x cuDNN from 1024 keys (H200); hd64 with
128-row blocks 0.96-1.04x without a mask and 1.00-1.08x causal (H100; 64-row blocks: 0.87-1.01x / 0.90-1.08x), split
by queries 1.02-1.07x the same split by keys (session 45); hd256 with the dQ pass 0.99-1.08x cuDNN (H100; one pass
with atomic dQ: 0.71-0.83x; the dQ pass split by queries 1.06-1.11x that, session 45); hd160 / hd192 with the tail
1.16-1.30x / 1.10-1.22x cuDNN (H100, session 45, the dQ pass split by queries; padded to 256: 0.85-0.97x /
0.89-1.00x). Varlen (session 40, 16K tokens in sequences of [max / 8, max]): 0.97-1.48x flash_bwd's grid at hd64,
1.23-1.32x at hd128, 1.59-1.82x at hd256.

dQ's summation order over key blocks varies run to run (reduce-adds), so deterministic=True keeps flash_bwd's grid,
but at head dims above 128, where nothing is added across programs (DQ_PASS). Scope as flash_fwd_hopper: 16-bit
inputs, head dims 33..256 (kernel_head_dim), no bias; dropout (HAS_DROPOUT, session 50: dV from the kept P^T / (1 - p),
dP^T's kept entries scaled alike, the others 0; under it head dim 64 takes the transposed layout); GQA, both window
sides (causal, sliding), varlen,
softcap (HAS_SOFTCAP: S^T becomes t = tanh(S^T * scale / softcap), P^T = exp2(t * softcap * log2(e) - lse2), and dS^T
takes the factor 1 - t^2, kept in fp16 beside P^T across the masks) and ALiBi (HAS_ALIBI: P^T's exponent minus
slope * |query + off - key|, the slope per step's query head; dS unchanged) are in. Under either, head dim 64 takes
the transposed layout (HOPPER_BWD_SCORE_MOD_CONFIGS: the row layout spills).

Varlen (IS_VARLEN, session 40): the descriptors see the packed tensors as one batch entry, a program reads its
sequence's bounds from cu_seqlens (key blocks past the sequence's end do nothing), P is masked for the rows past the
sequence's end too (they are the next sequence's queries), dQ's reduce-add adds zeros there, and the sequence's last
dK / dV block is stored from registers with its rows masked (a TMA box would overwrite the next sequence's rows).
lse2 / delta start each sequence at a 16-byte boundary (_vec_start: an unaligned fp32 box is an illegal instruction).
Boxes reaching past cu_seqlens[-1] (a buffer padded past its sequences holds anything there, NaN included) have those
rows zeroed by the producer before the consumer sees them (session 41, _hopper_common._zero_rows).

Used only on the triton release it was written and measured against (flash_fwd_hopper.GLUON_TRITON); flash_bwd's
Triton grid everywhere else. Beside this file: the producer warp (flash_bwd_hopper_loads), the hand-outs of dQ, dK, dV
(flash_bwd_hopper_stores), the key-block walk (flash_bwd_hopper_tiles), the configs (flash_bwd_hopper_configs).
"""

from __future__ import annotations

import torch

from .._triton import Launch, LaunchCache, PlanCache, cdiv, launch_device
from . import flash_bwd_dq_hopper, flash_fwd_hopper
from ._flash_common import alibi_batch_stride, empty_packed, score_scales
from ._hopper_common import _smem_layout, packed_geometry, sequence_geometry
from .flash_bwd_dq_hopper import vector_geometry
from .flash_bwd_preprocess import hopper_backward_inputs
from .flash_bwd_hopper_configs import (HOPPER_BWD_CONFIGS, HOPPER_BWD_SCORE_MOD_CONFIGS,  # noqa: F401
                                       hopper_backward_config, vector_block)
from .flash_fwd_hopper import gluon, main_width

LOG2E = flash_fwd_hopper.LOG2E
# Where this kernel can run and which tensors its host-side descriptors take: as the forward's.
available = flash_fwd_hopper.available
descriptor_compatible = flash_fwd_hopper.descriptor_compatible

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .flash_bwd_dq_hopper import _alloc_vector_rows, _mask_rows, _probs_rows
    from .flash_bwd_hopper_loads import _bwd_producer
    from .flash_bwd_hopper_stores import _hand_off_dq, _store_dkdv, _store_dkdv_rows
    from ._hopper_common import (_alibi, _alibi_slope, _dropout_keep, _dropout_rng, _softcap, _softcap_grad,
                                 _softcap_slope)
    from .flash_bwd_hopper_tiles import _key_block, _program, _step

    @gluon.jit
    def _bwd_consumer(descs, smem, bars, shape, cu_seqlens, fp32_out, windows, qk_scale, sm_scale, softcap_scale,
                      alibi, dropout, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
                      HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr,
                      IS_VARLEN: gl.constexpr,
                      FP32_GRADS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                      NUM_STAGES: gl.constexpr, TAIL_DIM: gl.constexpr):
        """Eight warps (two warpgroups of BLOCK_N / 2 keys each): the schedule in the module docstring. The slot
        is released once every product reading it is done; dQ_j leaves through one of two fp32 slots. TAIL_DIM > 0
        (head dims 65..80 as 64 + 16 columns): Q's, K's, V's and dO's columns past HEAD_DIM in tiles of their own
        (smem[8:12]), S^T and dP^T each the sum of two wgmma groups, dK, dV and dQ_j two accumulators each (dQ_j's
        tail through its own fp32 slots, smem[12], and descriptor, descs[13]), dK / dV's tails stored from
        registers."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc = descs[:9]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = smem[:8]
        kv_ready, q_ready, do_ready, empty = bars
        nheads_q, nheads_k, group, seqlen_q, seqlen_k = shape
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, BLOCK_M, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                            instr_shape=[16, HEAD_DIM // 2, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
        kvt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                             instr_shape=[16, max(TAIL_DIM, 8), 16])
        dqt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                             instr_shape=[16, max(TAIL_DIM // 2, 8), 16])
        opt_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kvt_layout, k_width=2)
        TAIL_MMAS: gl.constexpr = 1 if TAIL_DIM > 0 else 0       # each product's second wgmma group (the tail's)
        cols_layout: gl.constexpr = gl.SliceLayout(0, s_layout)      # one value per query (column)
        window_left, window_right = windows
        batch_entry = 0
        if HAS_ALIBI or HAS_DROPOUT:       # this program's batch entry (varlen: sequence): the slopes' row, the mask's
            batch_entry = _program(seqlen_k, nheads_k, BLOCK_N)[1]
        rng = (0, 0, 0, 0, 1.0)
        if HAS_DROPOUT:         # (Philox key, offset, threshold << 24, 1 / (1 - p)): dropout.py's mask
            rng = _dropout_rng(dropout[0], dropout[1])
        # Dropout (session 51): the exponential gives P^T / (1 - p) (lse2 less log2(1 / (1 - p))) and delta is scaled
        # by 1 - p, so dS^T = P^T / (1 - p) (kept dP^T - (1 - p) delta) needs no multiply a score (1.00-1.04x). At 128
        # columns the mask rides in P^T's sign from the draw to dP^T's arrival (a bool tile held across the dP^T wait
        # spilled: 116 -> 40 bytes, 188 -> 116 causal, ptxas offline): dropped scores negative, dS^T from |P^T|; a
        # dropped P^T of 0 reads as kept and its dS^T is 0 either way, and _softcap_grad's factor 1 - t^2 >= 0 keeps
        # the sign. Narrower: no spill, and two instructions a score fewer.
        SIGN_MASK: gl.constexpr = HEAD_DIM >= 128
        rng_log2_scale = 0.0
        keep_rate = 1.0
        if HAS_DROPOUT:
            rng_log2_scale = gl.log2(rng[4])
            keep_rate = 1.0 / rng[4]
        b, q_start, k_start, seqlen_q, seqlen_k, i_hk, n0, off, m_first, n_steps, live, _ = _key_block(
            cu_seqlens, seqlen_q, seqlen_k, nheads_k, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, IS_VARLEN, BLOCK_M,
            BLOCK_N)
        keys = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout))
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=s_layout)
        zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        if TAIL_DIM > 0:
            zero_dqt = gl.zeros([BLOCK_M, TAIL_DIM], gl.float32, layout=dqt_layout)
            dkt = gl.zeros([BLOCK_N, TAIL_DIM], gl.float32, layout=kvt_layout)
            dvt = gl.zeros([BLOCK_N, TAIL_DIM], gl.float32, layout=kvt_layout)
        if live:
            mbarrier.wait(kv_ready, 0)
        for i in range(group * n_steps):
            i_h, m0 = _step(i, i_hk, group, m_first, n_steps, BLOCK_M)
            slot = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
            q = q_smem.index(slot)
            do = do_smem.index(slot)
            if HAS_ALIBI:       # the step's query head's slope (in raw score units)
                alibi_slope = _alibi_slope(alibi, batch_entry, i_h, qk_scale)
            mbarrier.wait(q_ready.index(slot), phase)
            st_tok = warpgroup_mma(k_smem, q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                st_tok = warpgroup_mma(smem[9], smem[8].index(slot).permute((1, 0)), st_tok, is_async=True)
            mbarrier.wait(do_ready.index(slot), phase)
            dpt_tok = warpgroup_mma(v_smem, do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                dpt_tok = warpgroup_mma(smem[10], smem[11].index(slot).permute((1, 0)), dpt_tok, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(st_tok, ))
            st = _softcap(st, softcap_scale, HAS_SOFTCAP)
            lse2 = lse_smem.index(slot).load(cols_layout)
            if HAS_DROPOUT:     # P^T / (1 - p) from the exponential itself: log2(1 / (1 - p)) off the lse
                lse2 = lse2 - rng_log2_scale
            if HAS_ALIBI:       # queries from the step's m0 (recomputed each step), keys from the block's n0
                alibi_q = (gl.arange(0, BLOCK_M, layout=cols_layout) + (m0 + off - n0)).to(gl.float32)
                alibi_k = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, s_layout)).to(gl.float32)
                pt = gl.exp2(_alibi(st, alibi_slope, gl.expand_dims(alibi_q, 0), gl.expand_dims(alibi_k, 1)) * qk_scale
                             - gl.expand_dims(lse2, 0))
            else:
                pt = gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0))
            dtanh = _softcap_slope(st, HAS_SOFTCAP)
            # Keys past seqlen_k (zero-filled K rows; varlen: the next sequence's) and, under a right window, keys
            # after a query's last visible one: P = 0. Rows past seqlen_q read zero-filled dO, delta = 0, but varlen's
            # are the next sequence's queries: P = 0 there too.
            need_mask = n0 + BLOCK_N > seqlen_k
            if IS_VARLEN:
                need_mask = need_mask | (m0 + BLOCK_M > seqlen_q)
            if HAS_RIGHT:
                need_mask = need_mask | (m0 + off + window_right < n0 + BLOCK_N - 1)
            if HAS_LEFT:      # under a left window, keys before a query's first visible one
                need_mask = need_mask | (n0 < m0 + BLOCK_M - 1 + off - window_left)
            if need_mask:
                queries = m0 + gl.arange(0, BLOCK_M, layout=cols_layout)
                visible = gl.expand_dims(keys < seqlen_k, 1)
                if IS_VARLEN:
                    visible = visible & gl.expand_dims(queries < seqlen_q, 0)
                if HAS_RIGHT:
                    visible = visible & (gl.expand_dims(keys, 1) <= gl.expand_dims(queries + off + window_right, 0))
                if HAS_LEFT:
                    visible = visible & (gl.expand_dims(keys, 1) >= gl.expand_dims(queries + off - window_left, 0))
                pt = gl.where(visible, pt, 0.0)
            if HAS_DROPOUT:     # pt is P^T / (1 - p): dV takes its kept entries, dS^T = pt (kept dP^T - (1 - p) delta)
                keep = _dropout_keep(rng, batch_entry * nheads_q + i_h, m0, n0, BLOCK_N, BLOCK_M, s_layout, True)
                pt_low = gl.where(keep, pt, 0.0).to(dtype)
                if SIGN_MASK:
                    pt = gl.where(keep, pt, -pt)
            else:
                pt_low = pt.to(dtype)
            pt = _softcap_grad(pt, dtanh, HAS_SOFTCAP)      # (dS's factor; P^T itself is in pt_low)
            dv_tok = warpgroup_mma(gl.convert_layout(pt_low, op_layout), do, dv, is_async=True)
            if TAIL_DIM > 0:
                dvt_tok = warpgroup_mma(gl.convert_layout(pt_low, opt_layout), smem[11].index(slot), dvt,
                                        is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(dpt_tok, ))       # dV still running
            delta = delta_smem.index(slot).load(cols_layout)
            if HAS_DROPOUT and SIGN_MASK:
                dpt = gl.where(pt >= 0.0, dpt, 0.0)
                pt = gl.abs(pt)
            elif HAS_DROPOUT:
                dpt = gl.where(keep, dpt, 0.0)
            if HAS_DROPOUT:
                delta = delta * keep_rate
            # dS^T with the softmax scale folded in (dK and dQ both carry it): scale * dP^T - scale * delta is an FMA.
            dst = (pt * (dpt * sm_scale - gl.expand_dims(delta * sm_scale, 0))).to(dtype)
            ds_smem.store(dst)
            dst_op = gl.convert_layout(dst, op_layout)
            dk_tok = warpgroup_mma(dst_op, q, dk, is_async=True)
            if TAIL_DIM > 0:
                dkt_tok = warpgroup_mma(gl.convert_layout(dst, opt_layout), smem[8].index(slot), dkt, is_async=True)
            fence_async_shared()
            gl.thread_barrier()             # both warpgroups' dS^T rows are in ds_smem
            dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, zero_dq, use_acc=False, is_async=True)
            # dQ_i -> dq_smem[i % 2], whose last reader (the reduce-add of dQ_{i-2}) the wait below at the end of
            # step i - 1 saw done. (Storing dQ_{i-1} while S^T_i and dP^T_i run instead spills at hd128 and measured
            # slower at hd64: session 16.)
            if TAIL_DIM > 0:
                dqt_tok = warpgroup_mma(ds_smem.permute((1, 0)), smem[9], zero_dqt, use_acc=False, is_async=True)
                dv, dk, dq, dvt, dkt, dqt = warpgroup_mma_wait(
                    num_outstanding=0, deps=(dv_tok, dk_tok, dq_tok, dvt_tok, dkt_tok, dqt_tok))
                _hand_off_dq(dq, dq_smem, dq_desc, empty, slot, i, b, q_start + m0, i_h, dqt, smem[12], descs[13],
                             HEAD_DIM, TAIL_DIM)
            else:
                dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, dq_tok))
                _hand_off_dq(dq, dq_smem, dq_desc, empty, slot, i, b, q_start + m0, i_h, dq, dq_smem, dq_desc,
                             HEAD_DIM, 0)
        if live:
            _store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, fp32_out, b, k_start, i_hk, n0, seqlen_k, kv_layout,
                        FP32_GRADS, IS_VARLEN, BLOCK_N, HEAD_DIM)
            if TAIL_DIM > 0:            # columns HEAD_DIM.. from registers
                _store_dkdv_rows(dkt, dvt, fp32_out, b, k_start, i_hk, n0, seqlen_k, HEAD_DIM, kvt_layout, IS_VARLEN)

    @gluon.jit
    def _bwd_consumer_rows(descs, smem, p_smem, bars, shape, cu_seqlens, fp32_out, windows, qk_scale, sm_scale,
                           softcap_scale, alibi, dropout, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                           BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr,
                           HAS_DROPOUT: gl.constexpr, IS_VARLEN: gl.constexpr, FP32_GRADS: gl.constexpr,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                           NUM_STAGES: gl.constexpr, DQ_PASS: gl.constexpr, TAIL_DIM: gl.constexpr):
        """Eight warps, scores in the row layout: with 128-row query steps (head dim 64) the transposed layout's
        per-query lse2 / delta columns take 64 registers and spill, rows take 4. Also the wide head dims' consumer
        (64 x 64 steps, each warpgroup half of the head dim in dK and dV), which computes dK and dV alone (DQ_PASS:
        flash_bwd_dq_hopper computes dQ).

            S  = Q K^T, dP = dO V^T     [BLOCK_M, BLOCK_N]   each warpgroup BLOCK_M / 2 query rows x all keys
                                                             (DQ_PASS: all 64 rows x BLOCK_N / 2 keys)
            dQ_j = dS K                 [BLOCK_M, D]         each warpgroup its own dS rows, from registers
            P -> p_smem, dS -> ds_smem                       (bf16) the A operands of dV and dK, read transposed
            dV += P^T dO, dK += dS^T Q  [BLOCK_N, D]         each warpgroup BLOCK_N / 2 keys (DQ_PASS: half of D)

        Split by queries, S and dP are one m64n128 wgmma per warpgroup and k-step (split by keys, FlashAttention-3's
        hd64 layout, two m64n64 reading K's half twice: shared memory bandwidth is what bounds hd64's five N = 64
        products), and dQ's A operand is in registers and issued before the dS barrier: 1.02-1.07x at hd64 (session
        45). Three CTA barriers per step: P stored, dS stored, the step's end (as _bwd_consumer's). TAIL_DIM > 0 (head
        dims 129..192 as 128 + 32 / 64 columns; DQ_PASS only): Q's, K's, V's and dO's columns past HEAD_DIM in tiles of
        their own (smem[8:12]), S and dP each the sum of two wgmma groups, dK and dV two accumulators each, HEAD_DIM
        and TAIL_DIM wide, stored from registers."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc = descs[:9]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = smem[:8]
        kv_ready, q_ready, do_ready, empty = bars
        nheads_q, nheads_k, group, seqlen_q, seqlen_k = shape
        dtype: gl.constexpr = q_smem.dtype
        # dK, dV [BLOCK_N, D] and dQ_j [BLOCK_M, D]: 128 rows take a warp per 16 rows; 64 rows (the wide head dims)
        # a warpgroup per half of the head dim.
        WARPS_M: gl.constexpr = 8 if BLOCK_N == 128 else 4
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS_M, 8 // WARPS_M],
                                                            instr_shape=[16, HEAD_DIM // (8 // WARPS_M), 16])
        # S, dP [BLOCK_M, BLOCK_N]: with dQ (hd64, 128 query rows) split by queries, each warpgroup 64 rows x all keys,
        # so that its dS rows are the A operand of its own dQ rows; the wide head dims' 64 rows by keys.
        if DQ_PASS:
            s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                               instr_shape=[16, BLOCK_N // 2, 16])
        else:
            s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                               instr_shape=[16, BLOCK_N, 16])
        kvt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                             instr_shape=[16, max(TAIL_DIM // 2, 8), 16])
        TAIL_MMAS: gl.constexpr = 1 if TAIL_DIM > 0 else 0       # each product's second wgmma group (the tail's)
        rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)      # one value per query (row)
        batch_entry = 0
        if HAS_ALIBI or HAS_DROPOUT:       # this program's batch entry (varlen: sequence): the slopes' row, the mask's
            batch_entry = _program(seqlen_k, nheads_k, BLOCK_N)[1]
        rng = (0, 0, 0, 0, 1.0)
        rng_log2_scale = 0.0
        keep_rate = 1.0
        if HAS_DROPOUT:         # (Philox key, offset, threshold << 24, 1 / (1 - p)): dropout.py's mask
            rng = _dropout_rng(dropout[0], dropout[1])
            rng_log2_scale = gl.log2(rng[4])
            keep_rate = 1.0 / rng[4]
        b, q_start, k_start, seqlen_q, seqlen_k, i_hk, n0, off, m_first, n_steps, live, _ = _key_block(
            cu_seqlens, seqlen_q, seqlen_k, nheads_k, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, IS_VARLEN, BLOCK_M,
            BLOCK_N)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=kv_layout)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        if TAIL_DIM > 0:
            dkt = gl.zeros([BLOCK_N, TAIL_DIM], gl.float32, layout=kvt_layout)
            dvt = gl.zeros([BLOCK_N, TAIL_DIM], gl.float32, layout=kvt_layout)
        if live:
            mbarrier.wait(kv_ready, 0)
        for i in range(group * n_steps):
            i_h, m0 = _step(i, i_hk, group, m_first, n_steps, BLOCK_M)
            slot = i % NUM_STAGES
            phase = (i // NUM_STAGES) & 1
            q = q_smem.index(slot)
            do = do_smem.index(slot)
            alibi_slope = 0.0
            if HAS_ALIBI:       # the step's query head's slope (in raw score units)
                alibi_slope = _alibi_slope(alibi, batch_entry, i_h, qk_scale)
            mbarrier.wait(q_ready.index(slot), phase)
            s_tok = warpgroup_mma(q, k_smem.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                s_tok = warpgroup_mma(smem[8].index(slot), smem[9].permute((1, 0)), s_tok, is_async=True)
            mbarrier.wait(do_ready.index(slot), phase)
            dp_tok = warpgroup_mma(do, v_smem.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                dp_tok = warpgroup_mma(smem[11].index(slot), smem[10].permute((1, 0)), dp_tok, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(s_tok, ))
            s = _softcap(s, softcap_scale, HAS_SOFTCAP)
            lse2 = lse_smem.index(slot).load(rows_layout)
            if HAS_DROPOUT:     # P / (1 - p) from the exponential, as in the transposed consumer
                lse2 = lse2 - rng_log2_scale
            alibi_q = lse2              # (unused without ALiBi)
            if HAS_ALIBI:
                alibi_q = gl.arange(0, BLOCK_M, layout=rows_layout).to(gl.float32)
            p, dtanh = _probs_rows(s, lse2, m0, n0, off, qk_scale, alibi_slope, alibi_q, HAS_SOFTCAP, HAS_ALIBI,
                                   BLOCK_N, s_layout)
            p = _mask_rows(p, m0, n0, seqlen_q, seqlen_k, off, windows, HAS_LEFT, HAS_RIGHT, IS_VARLEN, BLOCK_M,
                           BLOCK_N, s_layout)
            if HAS_DROPOUT:     # p is P / (1 - p): dV takes its kept entries, dS = p (kept dP - (1 - p) delta)
                keep = _dropout_keep(rng, batch_entry * nheads_q + i_h, m0, n0, BLOCK_M, BLOCK_N, s_layout, False)
                p_smem.store(gl.where(keep, p, 0.0).to(dtype))
            else:
                p_smem.store(p.to(dtype))
            p = _softcap_grad(p, dtanh, HAS_SOFTCAP)        # (dS's factor; P itself is in p_smem)
            fence_async_shared()
            gl.thread_barrier()             # P's rows from both warpgroups are in p_smem
            dv_tok = warpgroup_mma(p_smem.permute((1, 0)), do, dv, is_async=True)
            if TAIL_DIM > 0:
                dvt_tok = warpgroup_mma(p_smem.permute((1, 0)), smem[11].index(slot), dvt, is_async=True)
            dp = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(dp_tok, ))  # dV still running
            delta = delta_smem.index(slot).load(rows_layout)
            if HAS_DROPOUT:
                dp = gl.where(keep, dp, 0.0)
                delta = delta * keep_rate
            ds = (p * (dp * sm_scale - gl.expand_dims(delta * sm_scale, 1))).to(dtype)
            if not DQ_PASS:     # dQ_j = dS K from this warpgroup's own dS rows, before the barrier
                ds_op = gl.convert_layout(ds, gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2))
                dq_tok = warpgroup_mma(ds_op, k_smem, zero_dq, use_acc=False, is_async=True)
            ds_smem.store(ds)
            fence_async_shared()
            gl.thread_barrier()             # dS from both warpgroups is in ds_smem
            dk_tok = warpgroup_mma(ds_smem.permute((1, 0)), q, dk, is_async=True)
            if TAIL_DIM > 0:
                dkt_tok = warpgroup_mma(ds_smem.permute((1, 0)), smem[8].index(slot), dkt, is_async=True)
                dv, dk, dvt, dkt = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, dvt_tok, dkt_tok))
                gl.thread_barrier()         # every product of the step is done: the slot, p_smem and ds_smem are free
                mbarrier.arrive(empty.index(slot), count=1)
            elif DQ_PASS:
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok))
                gl.thread_barrier()         # every product of the step is done: the slot, p_smem and ds_smem are free
                mbarrier.arrive(empty.index(slot), count=1)
            else:
                dv, dk, dq = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, dq_tok))
                _hand_off_dq(dq, dq_smem, dq_desc, empty, slot, i, b, q_start + m0, i_h, dq, dq_smem, dq_desc,
                             HEAD_DIM, 0)
        if live:
            if TAIL_DIM > 0:            # both parts from registers (K / V's tiles are HEAD_DIM wide)
                _store_dkdv_rows(dk, dv, fp32_out, b, k_start, i_hk, n0, seqlen_k, 0, kv_layout, IS_VARLEN)
                _store_dkdv_rows(dkt, dvt, fp32_out, b, k_start, i_hk, n0, seqlen_k, HEAD_DIM, kvt_layout,
                                 IS_VARLEN)
            else:
                _store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, fp32_out, b, k_start, i_hk, n0, seqlen_k,
                            kv_layout, FP32_GRADS, IS_VARLEN, BLOCK_N, HEAD_DIM)

    @gluon.jit
    def _flash_bwd_hopper_kernel(
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc, qt_desc, kt_desc, vt_desc,
        dot_desc, dqt_desc, p_dk, p_dv, stride_dkv_b, stride_dkv_s, stride_dkv_h, head_dim, p_cu_seqlens_q,
        p_cu_seqlens_k,
        nheads_q, nheads_k, seqlen_q, seqlen_k, qk_scale, sm_scale, softcap_scale, p_alibi, stride_alibi_b, p_rng,
        dropout_p, window_left, window_right, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
        BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr,
        IS_VARLEN: gl.constexpr, FP32_GRADS: gl.constexpr,
        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
        SCORES_T: gl.constexpr, DQ_PASS: gl.constexpr,
        Q_SMEM: gl.constexpr, KV_SMEM: gl.constexpr, DS_SMEM: gl.constexpr, DQ_SMEM: gl.constexpr,
        TAIL_DIM: gl.constexpr, QT_SMEM: gl.constexpr, KVT_SMEM: gl.constexpr, DQT_SMEM: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        # Host-side TMA descriptors: q, do [batch, seqlen_q, nheads_q, head_dim] (boxes [1, BLOCK_M, 1, HEAD_DIM]),
        # k, v, dk, dv [batch, seqlen_k, nheads_k, head_dim] (boxes [1, BLOCK_N, 1, HEAD_DIM]), dq: the fp32
        # buffer shaped like q; head_dim <= HEAD_DIM (flash_fwd_hopper.kernel_head_dim: columns past it zero on
        # loads, dropped on stores); lse2, delta [batch * nheads_q, seqlen_q rounded up to vector_block] fp32 (boxes
        # [1, BLOCK_M]). FP32_GRADS: dk, dv are fp32 (p_dk, p_dv with their strides; the dk / dv descriptors
        # unused). SCORES_T: _bwd_consumer (scores transposed; DS_SMEM for [BLOCK_N, BLOCK_M]), else
        # _bwd_consumer_rows (DS_SMEM for [BLOCK_M, BLOCK_N], also P's layout). DQ_PASS (rows only): dK and dV alone,
        # no dQ product (flash_bwd_dq_hopper's pass writes dQ; the dq descriptor unused). IS_VARLEN: the tensors
        # packed (total, heads, head_dim), seen as batch 1 ([1, total, heads, head_dim]; lse2, delta [nheads_q,
        # vector_rows], each sequence from its _vec_start), sequences bounded by the int32 p_cu_seqlens_q / _k,
        # seqlen_q / _k the longest sequence's. TAIL_DIM > 0 (DQ_PASS: head dims 129..192 as 128 + 32 / 64 columns;
        # SCORES_T: 65..80 as 64 + 16): qt / kt / vt / dot_desc over q / k / v / dout with boxes TAIL_DIM wide,
        # loaded at column HEAD_DIM, and (SCORES_T) dqt_desc over the dq buffer, reduce-added there; else unused.
        # Grid (cdiv(seqlen_k, BLOCK_N) * batch * nheads_k,). num_warps = 8 is the consumer (the default
        # partition); the producer warp is the worker.
        gl.static_assert(num_warps == 8)
        gl.static_assert(BLOCK_N == 128 or (BLOCK_N == 64 and not SCORES_T))
        gl.static_assert(not (DQ_PASS and SCORES_T))
        gl.static_assert(TAIL_DIM == 0 or ((DQ_PASS or SCORES_T) and not IS_VARLEN))
        # _bwd_consumer_rows's dQ from registers: 2 x 64 query rows, dK / dV rows a warp per 16 keys (kv_layout [8, 1])
        gl.static_assert(SCORES_T or DQ_PASS or (BLOCK_M == 128 and BLOCK_N == 128))
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], Q_SMEM)
        do_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, HEAD_DIM], Q_SMEM)
        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], KV_SMEM)
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], KV_SMEM)
        lse_smem = _alloc_vector_rows(NUM_STAGES, BLOCK_M)      # lse2 / delta rows, TMA-written
        delta_smem = _alloc_vector_rows(NUM_STAGES, BLOCK_M)
        if DQ_PASS:
            dq_smem = delta_smem             # never used: no dQ slots
        else:
            dq_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, HEAD_DIM], DQ_SMEM)
        kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_ready, count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        if IS_VARLEN:       # the producer's own barrier for boxes it zeroes rows of (_hopper_common._zero_rows)
            zfill = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(zfill, count=1)
        else:
            zfill = kv_ready                 # never used

        descs = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc)
        bars = (kv_ready, q_ready, do_ready, empty)
        shape = (nheads_q, nheads_k, nheads_q // nheads_k, seqlen_q, seqlen_k)
        fp32_out = (p_dk, p_dv, stride_dkv_b, stride_dkv_s, stride_dkv_h, head_dim)
        windows = (window_left, window_right)
        cu_seqlens = (p_cu_seqlens_q, p_cu_seqlens_k)
        alibi = (p_alibi, stride_alibi_b)
        dropout = (p_rng, dropout_p)
        if SCORES_T:
            ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], DS_SMEM)
            smem = (q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem)
            if TAIL_DIM > 0:    # as below, and dQ's tail slots
                descs = descs + (qt_desc, kt_desc, vt_desc, dot_desc, dqt_desc)
                smem = smem + (gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, TAIL_DIM], QT_SMEM),
                               gl.allocate_shared_memory(dtype, [BLOCK_N, TAIL_DIM], KVT_SMEM),
                               gl.allocate_shared_memory(dtype, [BLOCK_N, TAIL_DIM], KVT_SMEM),
                               gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, TAIL_DIM], QT_SMEM),
                               gl.allocate_shared_memory(gl.float32, [2, BLOCK_M, TAIL_DIM], DQT_SMEM))
            gl.warp_specialize([
                (_bwd_consumer, (descs, smem, bars, shape, cu_seqlens, fp32_out, windows, qk_scale, sm_scale,
                                 softcap_scale, alibi, dropout, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, HAS_SOFTCAP,
                                 HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, FP32_GRADS, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                                 TAIL_DIM)),
                (_bwd_producer, (descs, smem, bars, shape, cu_seqlens, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                                 IS_VARLEN, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, TAIL_DIM, zfill)),
            ], [1], [24])
        else:
            ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], DS_SMEM)
            p_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], DS_SMEM)
            smem = (q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem)
            if TAIL_DIM > 0:    # the columns past HEAD_DIM of Q, K, V, dO: tiles like the main ones', TAIL_DIM wide
                descs = descs + (qt_desc, kt_desc, vt_desc, dot_desc)
                smem = smem + (gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, TAIL_DIM], QT_SMEM),
                               gl.allocate_shared_memory(dtype, [BLOCK_N, TAIL_DIM], KVT_SMEM),
                               gl.allocate_shared_memory(dtype, [BLOCK_N, TAIL_DIM], KVT_SMEM),
                               gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, TAIL_DIM], QT_SMEM))
            gl.warp_specialize([
                (_bwd_consumer_rows, (descs, smem, p_smem, bars, shape, cu_seqlens, fp32_out, windows, qk_scale,
                                      sm_scale, softcap_scale, alibi, dropout, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                                      HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, FP32_GRADS, BLOCK_M, BLOCK_N,
                                      HEAD_DIM, NUM_STAGES, DQ_PASS, TAIL_DIM)),
                (_bwd_producer, (descs, smem, bars, shape, cu_seqlens, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                                 IS_VARLEN, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, TAIL_DIM, zfill)),
            ], [1], [24])

    _launch_backward = LaunchCache(_flash_bwd_hopper_kernel)


def hopper_backward(dout, q, k, v, lse2, delta, dq_acc, dk, dv, *, qk_scale, sm_scale, window_right,
                    bottom_right, config, window_left=-1, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                    max_seqlen_k=0, softcap_scale=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """Launch on validated inputs: q, k, v, dout [batch, seqlen, heads, head dim] (varlen: packed [total, heads,
    head dim] with int32 cu_seqlens_q / _k and the longest lengths) 16-bit with 16-byte aligned strides; lse2, delta
    from flash_bwd_preprocess.hopper_backward_inputs with rows_block=vector_block(config) (the descriptors take their
    rows as given); dq_acc zeroed fp32 shaped like q; dk, dv contiguous, shaped like k, v: k's dtype, or fp32 (then
    stored from registers without rounding). Through the plan kept for this call signature (_BackwardPlan).
    softcap_scale > 0: scores qk_scale * tanh(softcap_scale * Q K^T); alibi_slopes: ALiBi (both as
    flash_fwd_hopper.hopper_forward's); dropout_p > 0: rng_state, the forward's (dropout.py's mask regenerated)."""
    varlen = None if cu_seqlens_q is None else (cu_seqlens_q.numel(), max_seqlen_q, max_seqlen_k)
    key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), dout.stride(), q.dtype, dk.dtype, window_left,
           window_right, bottom_right, softcap_scale > 0, alibi_slopes is not None, dropout_p > 0,
           tuple(config.items()), tuple(lse2.shape), varlen, launch_device())
    plan = _PLANS.get(key, lambda: _BackwardPlan(q, k, v, dout, dk, lse2, window_left, window_right, bottom_right,
                                                 config, varlen, softcap_scale > 0, alibi_slopes is not None,
                                                 dropout_p > 0))
    cu_q, cu_k = (lse2, lse2) if varlen is None else (cu_seqlens_q, cu_seqlens_k)
    alibi = (lse2, 0) if alibi_slopes is None else (alibi_slopes, alibi_batch_stride(alibi_slopes))
    dropout = (lse2 if rng_state is None else rng_state, float(dropout_p))
    plan(dout, q, k, v, lse2, delta, dq_acc, dk, dv, qk_scale, sm_scale, softcap_scale, alibi, cu_q, cu_k, dropout)


_PLANS = PlanCache()


class _BackwardPlan:
    """What a launch derives from the call's signature alone (grid, descriptor geometry, constexprs, the compiled
    kernel), as flash_fwd_hopper._ForwardPlan: a repeated call builds its 13 descriptors and launches."""

    def __init__(self, q, k, v, dout, dk, lse2, window_left, window_right, bottom_right, config, varlen,
                 softcap=False, alibi=False, dropout=False):
        head_dim = q.shape[-1]
        cfg = dict(config)
        tail = cfg["TAIL_DIM"]          # 65..96 and 129..192: 64 / 128 columns, then a tail box (forward_head_dim)
        kernel_dim = main_width(head_dim, tail)
        nheads_q, nheads_k = q.shape[-2], k.shape[-2]
        block_m, block_n = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
        if varlen is None:
            batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        else:
            batch, seqlen_q, seqlen_k = varlen[0] - 1, varlen[1], varlen[2]

        def geometry(t, box, dtype=q.dtype, width=kernel_dim):
            entries, rows, heads, strides = packed_geometry(t, varlen)
            return sequence_geometry(entries, rows, heads, head_dim, strides, box, dtype, width)

        vec = vector_geometry(lse2, block_m)
        dq_acc = torch.empty(q.shape, dtype=torch.float32, device="meta")       # contiguous, shaped like q
        width = tail or kernel_dim
        self.descriptors = [       # (shape, strides, box, layout) of q, k, v, dout, lse2, delta, dq_acc, dk, dv,
            geometry(q, block_m), geometry(k, block_n), geometry(v, block_n), geometry(dout, block_m), vec, vec,
            geometry(dq_acc, block_m, torch.float32), geometry(dk, block_n, dk.dtype),
            geometry(dk, block_n, dk.dtype),                                    # dv: shaped and laid out like dk
            # then q, k, v, dout and dq_acc with the tail's boxes (unused without one)
            geometry(q, block_m, width=width), geometry(k, block_n, width=width), geometry(v, block_n, width=width),
            geometry(dout, block_m, width=width), geometry(dq_acc, block_m, torch.float32, width=width)]
        self.sizes = (*packed_geometry(dk, varlen)[3][:3], head_dim)
        self.shape = (nheads_q, nheads_k, seqlen_q, seqlen_k)
        self.windows = (window_left, window_right)
        self.launch = Launch(
            _launch_backward, (cdiv(seqlen_k, block_n) * batch * nheads_k, ), self.descriptors,
            HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, BOTTOM_RIGHT=bottom_right, HAS_SOFTCAP=softcap,
            HAS_ALIBI=alibi, HAS_DROPOUT=dropout, IS_VARLEN=varlen is not None, FP32_GRADS=dk.dtype == torch.float32,
            BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=kernel_dim, Q_SMEM=_smem_layout([block_m, kernel_dim], q.dtype),
            KV_SMEM=_smem_layout([block_n, kernel_dim], q.dtype),
            DS_SMEM=_smem_layout([block_n, block_m] if cfg["SCORES_T"] else [block_m, block_n], q.dtype),
            DQ_SMEM=_smem_layout([block_m, kernel_dim], torch.float32),
            QT_SMEM=_smem_layout([block_m, width], q.dtype), KVT_SMEM=_smem_layout([block_n, width], q.dtype),
            DQT_SMEM=_smem_layout([block_m, width], torch.float32), **cfg)

    def __call__(self, dout, q, k, v, lse2, delta, dq_acc, dk, dv, qk_scale, sm_scale, softcap_scale, alibi, cu_q,
                 cu_k, dropout):
        self.launch(q, k, v, dout, lse2, delta, dq_acc, dk, dv, q, k, v, dout, dq_acc, dk, dv, *self.sizes, cu_q, cu_k,
                    *self.shape, qk_scale, sm_scale, softcap_scale, *alibi, *dropout, *self.windows)


def gluon_backward(dout, q, k, v, out, lse, *, softmax_scale, window_left, window_right, bottom_right, fp32_grads,
                   config, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, softcap=0.0,
                   alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """flash_bwd's entry to this file's kernel (config: hopper_backward_config's, for inputs flash_bwd._hopper_plan
    admitted): it adds dQ (scaled) into the fp32 buffer, cast to dq's dtype after; or, DQ_PASS (head dims 129..256),
    it computes dK and dV and flash_bwd_dq_hopper's pass writes dQ (with the same TAIL_DIM). Varlen: packed (total,
    heads, head_dim) tensors with cu_seqlens_q / _k (int32) and the longest lengths. Returns (dq, dk, dv)."""
    varlen = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                  max_seqlen_k=max_seqlen_k)
    delta, lse2, dq_acc = hopper_backward_inputs(out, dout, lse, config["BLOCK_M"], cu_seqlens_q=cu_seqlens_q,
                                                 max_seqlen_q=max_seqlen_q, rows_block=vector_block(config))
    grad_dtype = torch.float32 if fp32_grads else k.dtype
    dk, dv = (empty_packed(t.shape, grad_dtype, t.device, cu_seqlens_k) for t in (k, v))
    qk_scale, softcap_scale = score_scales(softmax_scale, softcap)
    scales = dict(qk_scale=qk_scale, sm_scale=softmax_scale, softcap_scale=softcap_scale, alibi_slopes=alibi_slopes,
                  window_right=window_right, bottom_right=bottom_right, window_left=window_left, dropout_p=dropout_p,
                  rng_state=rng_state)
    hopper_backward(dout, q, k, v, lse2, delta, dq_acc, dk, dv, config=config, **scales, **varlen)
    if config["DQ_PASS"]:
        dq = empty_packed(q.shape, torch.float32 if fp32_grads else q.dtype, q.device, cu_seqlens_q)
        flash_bwd_dq_hopper.hopper_backward_dq(dout, q, k, v, lse2, delta, dq, tail=config["TAIL_DIM"], **scales,
                                               **varlen)
        return dq, dk, dv
    return (dq_acc if fp32_grads else dq_acc.to(q.dtype)), dk, dv
