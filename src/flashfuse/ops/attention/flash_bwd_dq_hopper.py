"""The dQ pass of the Gluon attention backward at head dims above 128 (Hopper, warp-specialized).

flash_bwd_hopper's one-pass backward adds each key block's dQ_j = dS_j K_j into an fp32 buffer in L2. At head dim
256 a 64 x 64 step adds a [64, 256] fp32 tile (64 KB) for 10.5 MFLOP of products, and those reductions bound it:
~1.6 TB/s of them at 261 TFLOP/s, against 640 TFLOP/s for the same kernel with dQ never added (benchmarks/NOTES.md,
session 38). So at 256 that kernel computes dK and dV alone (DQ_PASS) and this one computes dQ, FlashAttention-2's
split: each program owns BLOCK_M queries of one query head and walks the key blocks they see,

    S   = Q K_j^T                 [BLOCK_M, BLOCK_N]   wgmma, async
    dP  = dO V_j^T                [BLOCK_M, BLOCK_N]   wgmma, async
    P   = exp2(S * scale * log2(e) - lse2)
    dS  = P * (dP - delta) * scale
    dQ += dS K_j                  [BLOCK_M, D]         in registers

then stores dQ once: S and dP are recomputed (7 products over both passes instead of 5) and nothing is reduced
across programs, so dQ is also the same bits run to run. A program takes BLOCK_M = 128 queries, each warpgroup its own
64 rows x all BLOCK_N keys, so that dS is already in the registers of the warpgroup whose dQ rows it makes (the A
operand of dS K: no dS tile, one CTA barrier a block at the block's end). A producer warp loads Q, dO and their lse2 /
delta rows once and streams K_j through NUM_STAGES slots and V_j through V_STAGES: at 193..256 (Q + dO 128 KB) V has
one slot of its own, released (a second CTA barrier) once both warpgroups' dP is done. Session 45: the whole backward
1.08-1.12x at 129..192 and 1.06-1.11x at 256 against 64 query rows split by keys over the warpgroups (m64n32 wgmmas
for S and dP, asking 1.5x what shared memory delivers; dS through shared memory). Scope and masks as
flash_bwd_hopper (lse2 / delta from flash_bwd_preprocess.hopper_backward_inputs; rows with no visible key: lse2 =
+inf, so P = 0 and dQ = 0). Head dims 129..160 / 161..192 compute 128 columns plus a 32- / 64-column tail (TAIL_DIM)
as flash_bwd_hopper's kernel does (session 44), 193..256 at 256. (Session 44, on the 64-row pass: leaving block j's
dQ product in flight while block j + 1's S and dP are issued made ptxas serialize every wgmma: 0.8x.)
"""

from __future__ import annotations

from .._triton import Launch, LaunchCache, PlanCache, cdiv, launch_device
from ._flash_common import alibi_batch_stride
from ._hopper_common import _smem_layout, packed_geometry, sequence_geometry
from .flash_fwd_hopper import gluon, main_width

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

    from ._hopper_common import (_alibi, _alibi_slope, _dropout_keep, _dropout_rng, _load_zeroed, _packed_end,
                                 _seq_bounds, _softcap, _softcap_grad, _softcap_slope, _tma_box)

    @gluon.jit
    def _query_block(cu_seqlens, seqlen_q, seqlen_k, nheads_q, windows, HAS_LEFT: gl.constexpr,
                     HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """This program's (TMA batch coordinate b, first query row, first key row of its sequence, the sequence's
        seqlen_q and seqlen_k, query head, first query m0 within the sequence, causal offset off, first key block,
        number of key blocks, live, the column of the sequence's first row in lse2 / delta). The query blocks of one
        head side by side (their K / V shared in L2), causal heaviest first. Query q sees key k iff
        q + off - window_left <= k <= q + off + window_right. Varlen: as flash_bwd_hopper._key_block (seqlen_q / _k
        the longest on entry; a query block past its sequence's end is not live)."""
        window_left, window_right = windows
        n_m = gl.cdiv(seqlen_q, BLOCK_M)
        pid = gl.program_id(0)
        i_bh = pid // n_m
        i_m = pid % n_m
        if HAS_RIGHT:
            i_m = n_m - 1 - i_m
        m0 = i_m * BLOCK_M
        b, q_start, k_start, seqlen_q, seqlen_k = _seq_bounds(i_bh // nheads_q, cu_seqlens, seqlen_q, seqlen_k,
                                                              IS_VARLEN)
        off = 0
        if BOTTOM_RIGHT:
            off = seqlen_k - seqlen_q
        hi = seqlen_k
        if HAS_RIGHT:
            hi = gl.maximum(gl.minimum(gl.minimum(m0 + BLOCK_M, seqlen_q) - 1 + off + window_right + 1, seqlen_k), 0)
        j0 = 0
        if HAS_LEFT:
            j0 = gl.maximum(m0 + off - window_left, 0) // BLOCK_N
        n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N) - j0, 0)
        live = True
        if IS_VARLEN:
            live = m0 < seqlen_q
            if m0 >= seqlen_q:
                n_blocks = 0
        return (b, q_start, k_start, seqlen_q, seqlen_k, i_bh % nheads_q, m0, off, j0, n_blocks, live,
                _vec_start(i_bh // nheads_q, q_start, IS_VARLEN))

    @gluon.jit
    def _alloc_vector_rows(STAGES: gl.constexpr, BLOCK_M: gl.constexpr):
        """[STAGES, BLOCK_M] fp32 in shared memory for lse2 / delta rows: plain rows, each written by TMA as its
        [1, BLOCK_M] box (_tma_box), allocated in that box's layout. A TMA destination must be 128-byte aligned and an
        allocation in the plain layout is aligned to 16 bytes only: with one 8-byte barrier more, one landed 272 bytes
        off and the load faulted (misaligned address, session 41)."""
        buf = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M],
                                        gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
        return buf._reinterpret(gl.float32, [STAGES, BLOCK_M],
                                gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))

    @gluon.jit
    def _vec_start(i_b, q_start, IS_VARLEN: gl.constexpr):
        """The column of sequence i_b's first row in the lse2 / delta rows (flash_bwd_preprocess.hopper_backward_inputs
        lays them out so): varlen, its first row q_start rounded up to a multiple of 4, plus 4 per earlier sequence
        (so the sequences never overlap), making every [1, BLOCK_M] fp32 TMA box start 16-byte aligned (one that does
        not is an illegal instruction: benchmarks/NOTES.md, session 40); else 0."""
        vec0 = 0
        if IS_VARLEN:
            vec0 = (q_start + 3) // 4 * 4 + 4 * i_b
        return vec0

    @gluon.jit
    def _probs_rows(s, lse2, m0, n0, off, qk_scale, alibi_slope, alibi_q, HAS_SOFTCAP: gl.constexpr,
                    HAS_ALIBI: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """(P, the softcap's slope for dS) in the row layout before the masks: P = exp2(score - lse2) from S [BLOCK_M
        queries from m0, BLOCK_N keys from n0] (s_layout; already capped by _softcap where HAS_SOFTCAP), lse2 per
        query, ALiBi's bias added (HAS_ALIBI: alibi_slope from _alibi_slope, alibi_q the queries' indices from m0 as
        fp32, rows_layout, else both unused; the key vector is built from the step's offsets, so it is not hoisted out
        of the caller's loop). Also flash_bwd_hopper's _bwd_consumer_rows's."""
        if HAS_ALIBI:
            alibi_k = (gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)) + (n0 - m0 - off)).to(gl.float32)
            p = gl.exp2(_alibi(s, alibi_slope, gl.expand_dims(alibi_q, 1), gl.expand_dims(alibi_k, 0)) * qk_scale
                        - gl.expand_dims(lse2, 1))
        else:
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
        return p, _softcap_slope(s, HAS_SOFTCAP)

    @gluon.jit
    def _mask_rows(p, m0, n0, seqlen_q, seqlen_k, off, windows, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                   MASK_QUERIES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """P [BLOCK_M queries from m0, BLOCK_N keys from n0] in the row layout (s_layout) with the keys past seqlen_k
        and those a window hides from each query zeroed (_bwd_consumer's masks, transposed), and, MASK_QUERIES, the
        queries past seqlen_q (varlen's: the next sequence's rows); blocks that need no mask come back as they are
        (rows past seqlen_q read zero-filled dO, delta = 0). Also flash_bwd_hopper's _bwd_consumer_rows's."""
        window_left, window_right = windows
        need_mask = n0 + BLOCK_N > seqlen_k
        if MASK_QUERIES:
            need_mask = need_mask | (m0 + BLOCK_M > seqlen_q)
        if HAS_RIGHT:
            need_mask = need_mask | (m0 + off + window_right < n0 + BLOCK_N - 1)
        if HAS_LEFT:
            need_mask = need_mask | (n0 < m0 + BLOCK_M - 1 + off - window_left)
        if need_mask:
            # Indices relative to m0: in flash_bwd_hopper's step loop m0 changes every step and n0 does not, and key
            # indices n0 + arange were hoisted out of that loop (a register each, 32 at hd64's query split, which
            # ptxas then spilled; session 45).
            queries = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))                 # query - m0
            keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)) + (n0 - m0)      # key - m0
            visible = gl.expand_dims(keys < seqlen_k - m0, 0)
            if MASK_QUERIES:
                visible = visible & gl.expand_dims(queries < seqlen_q - m0, 1)
            if HAS_RIGHT:
                visible = visible & (gl.expand_dims(keys, 0) <= gl.expand_dims(queries + off + window_right, 1))
            if HAS_LEFT:
                visible = visible & (gl.expand_dims(keys, 0) >= gl.expand_dims(queries + off - window_left, 1))
            p = gl.where(visible, p, 0.0)
        return p

    @gluon.jit
    def _dq_producer(descs, smem, bars, shape, cu_seqlens, windows, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                     BOTTOM_RIGHT: gl.constexpr, IS_VARLEN: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, TAIL_DIM: gl.constexpr,
                     zfill, V_STAGES: gl.constexpr):
        """One warp: Q + lse2 and dO + delta once, then K_j and V_j into slot j % NUM_STAGES once it is free.
        Varlen: K / V boxes reaching past cu_seqlens_k[-1] get those rows zeroed as flash_bwd_hopper's producer
        does (Q / dO rows past the sequence reach only their own dQ rows, which are not stored). TAIL_DIM: each
        tile's columns past HEAD_DIM in a second box on the same barrier (q, k, v, dO: descs[6:10] into
        smem[6:10]). V_STAGES < NUM_STAGES: V_j into its own ring's slot j % V_STAGES once v_empty says the consumer's
        dP of the slot's last block is done."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc = descs[:6]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem = smem[:6]
        q_ready, do_ready, k_ready, v_ready, empty, v_empty = bars
        nheads_q, group, seqlen_q, seqlen_k = shape
        k_end = _packed_end(cu_seqlens[1], gl.num_programs(0) // (gl.cdiv(seqlen_q, BLOCK_M) * nheads_q), IS_VARLEN)
        zphase = 0
        b, q_start, k_start, _, _, i_h, m0, _, j0, n_blocks, live, vec0 = _query_block(
            cu_seqlens, seqlen_q, seqlen_k, nheads_q, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, IS_VARLEN, BLOCK_M,
            BLOCK_N)
        i_hk = i_h // group
        row = q_start + m0
        if live:
            mbarrier.expect(q_ready, BLOCK_M * (HEAD_DIM + TAIL_DIM) * 2 + BLOCK_M * 4)
            tma.async_copy_global_to_shared(q_desc, [b, row, i_h, 0], q_ready, _tma_box(q_smem, q_desc))
            tma.async_copy_global_to_shared(lse_desc, [b * nheads_q + i_h, vec0 + m0], q_ready,
                                            _tma_box(lse_smem, lse_desc))
            mbarrier.expect(do_ready, BLOCK_M * (HEAD_DIM + TAIL_DIM) * 2 + BLOCK_M * 4)
            tma.async_copy_global_to_shared(do_desc, [b, row, i_h, 0], do_ready, _tma_box(do_smem, do_desc))
            tma.async_copy_global_to_shared(delta_desc, [b * nheads_q + i_h, vec0 + m0], do_ready,
                                            _tma_box(delta_smem, delta_desc))
            if TAIL_DIM > 0:
                tma.async_copy_global_to_shared(descs[6], [b, row, i_h, HEAD_DIM], q_ready, _tma_box(smem[6], descs[6]))
                tma.async_copy_global_to_shared(descs[9], [b, row, i_h, HEAD_DIM], do_ready,
                                                _tma_box(smem[9], descs[9]))
        for j in range(n_blocks):
            slot = j % NUM_STAGES
            mbarrier.wait(empty.index(slot), ((j // NUM_STAGES) & 1) ^ 1)      # the first pass finds slots free
            v_slot = j % V_STAGES
            k_row = k_start + (j0 + j) * BLOCK_N
            if IS_VARLEN and k_row + BLOCK_N > k_end:
                zphase = _load_zeroed(k_desc, [b, k_row, i_hk, 0], k_smem.index(slot), k_ready.index(slot),
                                      BLOCK_N * HEAD_DIM * 2, zfill, zphase, k_end - k_row)
                if V_STAGES < NUM_STAGES:
                    mbarrier.wait(v_empty.index(v_slot), ((j // V_STAGES) & 1) ^ 1)
                zphase = _load_zeroed(v_desc, [b, k_row, i_hk, 0], v_smem.index(v_slot), v_ready.index(v_slot),
                                      BLOCK_N * HEAD_DIM * 2, zfill, zphase, k_end - k_row)
            else:
                mbarrier.expect(k_ready.index(slot), BLOCK_N * (HEAD_DIM + TAIL_DIM) * 2)
                tma.async_copy_global_to_shared(k_desc, [b, k_row, i_hk, 0], k_ready.index(slot),
                                                _tma_box(k_smem.index(slot), k_desc))
                if TAIL_DIM > 0:
                    tma.async_copy_global_to_shared(descs[7], [b, k_row, i_hk, HEAD_DIM], k_ready.index(slot),
                                                    _tma_box(smem[7].index(slot), descs[7]))
                if V_STAGES < NUM_STAGES:
                    mbarrier.wait(v_empty.index(v_slot), ((j // V_STAGES) & 1) ^ 1)
                mbarrier.expect(v_ready.index(v_slot), BLOCK_N * (HEAD_DIM + TAIL_DIM) * 2)
                tma.async_copy_global_to_shared(v_desc, [b, k_row, i_hk, 0], v_ready.index(v_slot),
                                                _tma_box(v_smem.index(v_slot), v_desc))
                if TAIL_DIM > 0:
                    tma.async_copy_global_to_shared(descs[8], [b, k_row, i_hk, HEAD_DIM], v_ready.index(v_slot),
                                                    _tma_box(smem[8].index(v_slot), descs[8]))

    @gluon.jit
    def _dq_consumer(smem, bars, shape, cu_seqlens, dq_out, windows, qk_scale, sm_scale, softcap_scale, alibi,
                     dropout, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
                     HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr,
                     IS_VARLEN: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                     TAIL_DIM: gl.constexpr, V_STAGES: gl.constexpr):
        """Eight warps, each warpgroup its own 64 of the BLOCK_M = 128 query rows x all BLOCK_N keys: the schedule in
        the module docstring, dS K from the warpgroup's own dS registers, one CTA barrier a key block (its products
        done, before its slot is reused). TAIL_DIM > 0: Q's, K's, V's and dO's columns past HEAD_DIM in tiles of
        their own (smem[6:10]), S and dP each the sum of two wgmma groups, dQ two accumulators, HEAD_DIM and TAIL_DIM
        wide.
        V_STAGES < NUM_STAGES: V's slot released once both warpgroups' dP is done (K's at the block's end)."""
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem = smem[:6]
        q_ready, do_ready, k_ready, v_ready, empty, v_empty = bars
        nheads_q, group, seqlen_q, seqlen_k = shape
        dtype: gl.constexpr = q_smem.dtype
        # S, dP [BLOCK_M, BLOCK_N] and dQ [BLOCK_M, D]: warpgroup w rows 64 w.. (warps [8, 1])
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        dqt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                             instr_shape=[16, max(TAIL_DIM, 8), 16])
        TAIL_MMAS: gl.constexpr = 1 if TAIL_DIM > 0 else 0       # each product's second wgmma group (the tail's)
        rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)      # one value per query (row)
        batch_entry = 0
        if HAS_ALIBI or HAS_DROPOUT:    # this program's batch entry (varlen: sequence), as _query_block's
            batch_entry = gl.program_id(0) // gl.cdiv(seqlen_q, BLOCK_M) // nheads_q
        rng = (0, 0, 0, 0, 1.0)
        if HAS_DROPOUT:         # (Philox key, offset, threshold << 24, 1 / (1 - p)): dropout.py's mask
            rng = _dropout_rng(dropout[0], dropout[1])
        b, q_start, k_start, seqlen_q, seqlen_k, i_h, m0, off, j0, n_blocks, live, _ = _query_block(
            cu_seqlens, seqlen_q, seqlen_k, nheads_q, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, IS_VARLEN, BLOCK_M,
            BLOCK_N)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
        if TAIL_DIM > 0:
            dqt = gl.zeros([BLOCK_M, TAIL_DIM], gl.float32, layout=dqt_layout)
        if live:
            mbarrier.wait(q_ready, 0)
            mbarrier.wait(do_ready, 0)
        lse2 = lse_smem.load(rows_layout)
        delta_scaled = delta_smem.load(rows_layout) * sm_scale
        if HAS_DROPOUT:     # P / (1 - p) from the exponential, so dS = P / (1 - p) (kept dP - (1 - p) delta)
            lse2 = lse2 - gl.log2(rng[4])
            delta_scaled = delta_scaled * (1.0 / rng[4])
        alibi_slope, alibi_q = 0.0, lse2            # (unused without ALiBi)
        if HAS_ALIBI:       # this program's query head's slope (in raw score units), its queries' indices from m0
            alibi_slope = _alibi_slope(alibi, batch_entry, i_h, qk_scale)
            alibi_q = gl.arange(0, BLOCK_M, layout=rows_layout).to(gl.float32)
        for j in range(n_blocks):
            slot = j % NUM_STAGES
            phase = (j // NUM_STAGES) & 1
            n0 = (j0 + j) * BLOCK_N
            mbarrier.wait(k_ready.index(slot), phase)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                s_tok = warpgroup_mma(smem[6], smem[7].index(slot).permute((1, 0)), s_tok, is_async=True)
            v_slot = j % V_STAGES
            mbarrier.wait(v_ready.index(v_slot), (j // V_STAGES) & 1)
            dp_tok = warpgroup_mma(do_smem, v_smem.index(v_slot).permute((1, 0)), zero_s, use_acc=False,
                                   is_async=True)
            if TAIL_DIM > 0:
                dp_tok = warpgroup_mma(smem[9], smem[8].index(v_slot).permute((1, 0)), dp_tok, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(s_tok, ))
            s = _softcap(s, softcap_scale, HAS_SOFTCAP)
            p, dtanh = _probs_rows(s, lse2, m0, n0, off, qk_scale, alibi_slope, alibi_q, HAS_SOFTCAP, HAS_ALIBI,
                                   BLOCK_N, s_layout)
            # (varlen: rows past the sequence's end need no mask here: their dQ rows are not stored)
            p = _mask_rows(p, m0, n0, seqlen_q, seqlen_k, off, windows, HAS_LEFT, HAS_RIGHT, False, BLOCK_M, BLOCK_N,
                           s_layout)
            p = _softcap_grad(p, dtanh, HAS_SOFTCAP)
            dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok, ))
            if V_STAGES < NUM_STAGES:
                gl.thread_barrier()         # both warpgroups' dP is done: V's slot is free
                mbarrier.arrive(v_empty.index(v_slot), count=1)
            if HAS_DROPOUT:     # dP's kept entries, the others 0 (p carries the 1 / (1 - p))
                keep = _dropout_keep(rng, batch_entry * nheads_q + i_h, m0, n0, BLOCK_M, BLOCK_N, s_layout, False)
                dp = gl.where(keep, dp, 0.0)
            # dS with the softmax scale folded in: dQ needs no final scaling
            ds = (p * (dp * sm_scale - gl.expand_dims(delta_scaled, 1))).to(dtype)
            ds_a = gl.convert_layout(ds, gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2))
            dq_tok = warpgroup_mma(ds_a, k_smem.index(slot), dq, is_async=True)
            if TAIL_DIM > 0:
                dqt_tok = warpgroup_mma(ds_a, smem[7].index(slot), dqt, is_async=True)
                dq, dqt = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, dqt_tok))
            else:
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ))
            gl.thread_barrier()             # every warp's products of this block are done: its slot is free
            mbarrier.arrive(empty.index(slot), count=1)
        _store_dq(dq, dq_out, b, q_start, i_h, m0, seqlen_q, 0, dq_layout, IS_VARLEN)
        if TAIL_DIM > 0:
            _store_dq(dqt, dq_out, b, q_start, i_h, m0, seqlen_q, HEAD_DIM, dqt_layout, IS_VARLEN)

    @gluon.jit
    def _store_dq(dq, dq_out, b, q_start, i_h, m0, seqlen_q, COL0: gl.constexpr, layout: gl.constexpr,
                  IS_VARLEN: gl.constexpr):
        """dQ [BLOCK_M, W] (layout) into columns COL0.. of rows m0.. of the sequence from row q_start (dq_out:
        pointer, strides, head_dim), rows past seqlen_q and columns past head_dim masked."""
        p_dq, stride_dq_b, stride_dq_s, stride_dq_h, head_dim = dq_out
        cols = COL0 + gl.arange(0, dq.shape[1], layout=gl.SliceLayout(0, layout))
        rows = m0 + gl.arange(0, dq.shape[0], layout=gl.SliceLayout(1, layout))
        offs = (i_h.to(gl.int64) * stride_dq_h + gl.expand_dims((q_start + rows).to(gl.int64) * stride_dq_s, 1)
                + gl.expand_dims(cols, 0))
        if not IS_VARLEN:           # (varlen: one batch entry)
            offs += b.to(gl.int64) * stride_dq_b
        gl.store(p_dq + offs, dq.to(p_dq.dtype.element_ty),
                 mask=gl.expand_dims(rows < seqlen_q, 1) & gl.expand_dims(cols < head_dim, 0))

    @gluon.jit
    def _flash_bwd_dq_hopper_kernel(
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, qt_desc, kt_desc, vt_desc, dot_desc,
        p_dq, stride_dq_b, stride_dq_s, stride_dq_h, head_dim, p_cu_seqlens_q, p_cu_seqlens_k,
        nheads_q, nheads_k, seqlen_q, seqlen_k, qk_scale, sm_scale, softcap_scale, p_alibi, stride_alibi_b, p_rng,
        dropout_p, window_left, window_right, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
        BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, HAS_ALIBI: gl.constexpr, HAS_DROPOUT: gl.constexpr,
        IS_VARLEN: gl.constexpr,
        BLOCK_M: gl.constexpr,
        BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr, Q_SMEM: gl.constexpr,
        KV_SMEM: gl.constexpr, TAIL_DIM: gl.constexpr, QT_SMEM: gl.constexpr,
        KVT_SMEM: gl.constexpr, V_STAGES: gl.constexpr, num_warps: gl.constexpr,
    ):
        # Host-side TMA descriptors as flash_bwd_hopper's: q, do [batch, seqlen_q, nheads_q, head_dim] (boxes
        # [1, BLOCK_M, 1, HEAD_DIM]), k, v [batch, seqlen_k, nheads_k, head_dim] (boxes [1, BLOCK_N, 1, HEAD_DIM]),
        # lse2, delta [batch * nheads_q, seqlen_q rounded up to BLOCK_M] fp32 (boxes [1, BLOCK_M]). dq (p_dq with its
        # strides; q's dtype or fp32) is written, not added to. IS_VARLEN: as flash_bwd_hopper's kernel (packed
        # tensors as batch 1, sequences bounded by p_cu_seqlens_q / _k, seqlen_q / _k the longest). TAIL_DIM > 0 (head
        # dims 129..192 as 128 + 32 / 64 columns): qt / kt / vt / dot_desc over q / k / v / dout with boxes TAIL_DIM
        # wide, loaded at column HEAD_DIM (= 128); else unused. Grid (cdiv(seqlen_q, BLOCK_M) * batch * nheads_q,).
        # num_warps = 8 is the consumer (the default partition); the producer warp is the worker.
        gl.static_assert(num_warps == 8)
        gl.static_assert(BLOCK_M == 128)     # two warpgroups of 64 query rows
        gl.static_assert(V_STAGES <= NUM_STAGES)
        gl.static_assert(TAIL_DIM == 0 or not IS_VARLEN)
        dtype: gl.constexpr = q_desc.dtype
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM)
        do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM)
        k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        v_smem = gl.allocate_shared_memory(dtype, [V_STAGES, BLOCK_N, HEAD_DIM], KV_SMEM)
        lse_smem = _alloc_vector_rows(1, BLOCK_M).index(0)
        delta_smem = _alloc_vector_rows(1, BLOCK_M).index(0)
        q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_ready, count=1)
        mbarrier.init(do_ready, count=1)
        for i in gl.static_range(NUM_STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            if i < V_STAGES:
                mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        if V_STAGES < NUM_STAGES:           # V in a ring of its own, released after dP (_dq_consumer)
            v_empty = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(V_STAGES):
                mbarrier.init(v_empty.index(i), count=1)
        else:
            v_empty = empty                  # V shares K's slots and their release
        # varlen: the producer zeroes rows past cu_seqlens[-1] (_load_zeroed): 24 registers spilled 32 bytes there
        PRODUCER_REGS: gl.constexpr = 48 if IS_VARLEN else 24
        if IS_VARLEN:       # the producer's own barrier for boxes it zeroes rows of (_hopper_common._zero_rows)
            zfill = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(zfill, count=1)
        else:
            zfill = q_ready                  # never used

        descs = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc)
        smem = (q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem)
        if TAIL_DIM > 0:        # the columns past HEAD_DIM of Q, K, V, dO: tiles like the main ones', TAIL_DIM wide
            descs = descs + (qt_desc, kt_desc, vt_desc, dot_desc)
            smem = smem + (gl.allocate_shared_memory(dtype, [BLOCK_M, TAIL_DIM], QT_SMEM),
                           gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, TAIL_DIM], KVT_SMEM),
                           gl.allocate_shared_memory(dtype, [V_STAGES, BLOCK_N, TAIL_DIM], KVT_SMEM),
                           gl.allocate_shared_memory(dtype, [BLOCK_M, TAIL_DIM], QT_SMEM))
        bars = (q_ready, do_ready, k_ready, v_ready, empty, v_empty)
        shape = (nheads_q, nheads_q // nheads_k, seqlen_q, seqlen_k)
        dq_out = (p_dq, stride_dq_b, stride_dq_s, stride_dq_h, head_dim)
        windows = (window_left, window_right)
        cu_seqlens = (p_cu_seqlens_q, p_cu_seqlens_k)
        gl.warp_specialize([
            (_dq_consumer, (smem, bars, shape, cu_seqlens, dq_out, windows, qk_scale, sm_scale, softcap_scale,
                            (p_alibi, stride_alibi_b), (p_rng, dropout_p), HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                            HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, IS_VARLEN, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES,
                            TAIL_DIM, V_STAGES)),
            (_dq_producer, (descs, smem, bars, shape, cu_seqlens, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT,
                            IS_VARLEN, BLOCK_M, BLOCK_N, HEAD_DIM, NUM_STAGES, TAIL_DIM, zfill, V_STAGES)),
        ], [1], [PRODUCER_REGS])

    _launch_dq = LaunchCache(_flash_bwd_dq_hopper_kernel)


# lse2 / delta rows: TMA boxes [1, BLOCK_M] fp32, unswizzled (also flash_bwd_hopper's).
_VEC_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2) if gluon is not None else None


def vector_geometry(vec, block_m):
    """(shape, strides, box, layout) of the lse2 / delta descriptors over flash_bwd_preprocess.hopper_backward_inputs's
    rows as given (contiguous [batch * nheads_q, rows], varlen [nheads_q, rows]; rows a multiple of block_m); boxes
    [1, block_m]."""
    entries, rows = vec.shape
    assert vec.is_contiguous() and rows % block_m == 0, (tuple(vec.shape), block_m)
    return [entries, rows], [rows, 1], [1, block_m], _VEC_LAYOUT

# TAIL_DIM -> config: 128 queries x 64 keys, split by queries over the warpgroups. At 129..192 (128 + 32 / 64
# columns) Q + dO 80 / 96 KB, K / V in two stages 80 / 96 KB; at 193..256 Q + dO 128 KB, K in two slots, V in one
# (225 KB of shared memory). Session 45 (`results/h100-2026-11-24-s45/c7`, `c9`): the whole backward 1.08-1.12x /
# 1.06-1.11x the 64-row pass split by keys (BLOCK_M=64, V_STAGES=NUM_STAGES).
DQ_CONFIGS = {0: dict(BLOCK_M=128, BLOCK_N=64, NUM_STAGES=2, V_STAGES=1, num_warps=8),
              32: dict(BLOCK_M=128, BLOCK_N=64, NUM_STAGES=2, V_STAGES=2, num_warps=8),
              64: dict(BLOCK_M=128, BLOCK_N=64, NUM_STAGES=2, V_STAGES=2, num_warps=8)}


def dq_config(tail: int) -> dict:
    """The dQ pass's config for flash_bwd_hopper's TAIL_DIM (0: head dims padded to 256)."""
    return dict(DQ_CONFIGS[tail])


def hopper_backward_dq(dout, q, k, v, lse2, delta, dq, *, qk_scale, sm_scale, window_left, window_right,
                       bottom_right, tail=0, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                       max_seqlen_k=0, softcap_scale=0.0, alibi_slopes=None, dropout_p=0.0, rng_state=None):
    """Write dq (shaped like q, contiguous; q's dtype or fp32) from validated inputs, lse2 / delta as
    flash_bwd_preprocess.hopper_backward_inputs makes them (rows a multiple of dq_config(tail)'s BLOCK_M), through the
    plan kept for this call signature. tail: 0 (head dims padded as kernel_head_dim says), or 32 / 64 (129..160 /
    161..192 as 128 + tail columns, flash_bwd_hopper's TAIL_DIM). Varlen, softcap_scale, alibi_slopes, dropout_p and
    rng_state as flash_bwd_hopper.hopper_backward."""
    varlen = None if cu_seqlens_q is None else (cu_seqlens_q.numel(), max_seqlen_q, max_seqlen_k)
    key = (q.shape, k.shape, q.stride(), k.stride(), v.stride(), dout.stride(), q.dtype, dq.dtype, window_left,
           window_right, bottom_right, softcap_scale > 0, alibi_slopes is not None, dropout_p > 0, tail,
           tuple(DQ_CONFIGS[tail].items()), tuple(lse2.shape), varlen, launch_device())
    plan = _PLANS.get(key, lambda: _DqPlan(q, k, v, dout, dq, lse2, window_left, window_right, bottom_right, tail,
                                           varlen, softcap_scale > 0, alibi_slopes is not None, dropout_p > 0))
    cu_q, cu_k = (lse2, lse2) if varlen is None else (cu_seqlens_q, cu_seqlens_k)
    alibi = (lse2, 0) if alibi_slopes is None else (alibi_slopes, alibi_batch_stride(alibi_slopes))
    dropout = (lse2 if rng_state is None else rng_state, float(dropout_p))
    plan(dout, q, k, v, lse2, delta, dq, qk_scale, sm_scale, softcap_scale, alibi, cu_q, cu_k, dropout)


_PLANS = PlanCache()


class _DqPlan:
    """Grid, descriptor geometry and constexprs of one call signature (as flash_bwd_hopper._BackwardPlan)."""

    def __init__(self, q, k, v, dout, dq, lse2, window_left, window_right, bottom_right, tail, varlen, softcap=False,
                 alibi=False, dropout=False):
        head_dim = q.shape[-1]
        kernel_dim = main_width(head_dim, tail)
        width = tail or kernel_dim
        nheads_q, nheads_k = q.shape[-2], k.shape[-2]
        cfg = dq_config(tail)
        block_m, block_n = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
        if varlen is None:
            batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        else:
            batch, seqlen_q, seqlen_k = varlen[0] - 1, varlen[1], varlen[2]

        def geometry(t, box, width=kernel_dim):
            entries, rows, heads, strides = packed_geometry(t, varlen)
            return sequence_geometry(entries, rows, heads, head_dim, strides, box, q.dtype, width)

        vec = vector_geometry(lse2, block_m)
        # q, k, v, dout, lse2, delta, then q, k, v, dout with the tail's boxes (unused without one)
        self.descriptors = [geometry(q, block_m), geometry(k, block_n), geometry(v, block_n), geometry(dout, block_m),
                            vec, vec, geometry(q, block_m, width), geometry(k, block_n, width),
                            geometry(v, block_n, width), geometry(dout, block_m, width)]
        self.sizes = (*packed_geometry(dq, varlen)[3][:3], head_dim)
        self.shape = (nheads_q, nheads_k, seqlen_q, seqlen_k)
        self.windows = (window_left, window_right)
        self.launch = Launch(
            _launch_dq, (cdiv(seqlen_q, block_m) * batch * nheads_q, ), self.descriptors,
            HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, BOTTOM_RIGHT=bottom_right, HAS_SOFTCAP=softcap,
            HAS_ALIBI=alibi, HAS_DROPOUT=dropout, IS_VARLEN=varlen is not None, BLOCK_M=block_m,
            BLOCK_N=block_n, HEAD_DIM=kernel_dim, Q_SMEM=_smem_layout([block_m, kernel_dim], q.dtype),
            KV_SMEM=_smem_layout([block_n, kernel_dim], q.dtype),
            TAIL_DIM=tail, QT_SMEM=_smem_layout([block_m, width], q.dtype),
            KVT_SMEM=_smem_layout([block_n, width], q.dtype), **cfg)

    def __call__(self, dout, q, k, v, lse2, delta, dq, qk_scale, sm_scale, softcap_scale, alibi, cu_q, cu_k, dropout):
        self.launch(q, k, v, dout, lse2, delta, q, k, v, dout, dq, *self.sizes, cu_q, cu_k, *self.shape, qk_scale,
                    sm_scale, softcap_scale, *alibi, *dropout, *self.windows)
