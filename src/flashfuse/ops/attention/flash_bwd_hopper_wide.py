"""The dK / dV consumer of flash_bwd_hopper's kernel at head dims above 128 (DQ_PASS: flash_bwd_dq_hopper's pass writes
dQ), Gluon, Hopper; moved out of flash_bwd_hopper.py's row-layout consumer (session 44).

Per step, 64 queries against the program's 64 keys (the two warpgroups take 32 keys each of S and dP, and half of the
head dim each of dK and dV):

    S  = Q K^T, dP = dO V^T     [BLOCK_M, BLOCK_N]   wgmma, async
    P  = exp2(S * scale * log2(e) - lse2)             -> p_smem (bf16; dV's A operand, read transposed)
    dV += P^T dO                [BLOCK_N, D]         issued as soon as P is stored; dP still running
    dS = P * (dP - delta) * scale                     -> ds_smem
    dK += dS^T Q                [BLOCK_N, D]

Three CTA barriers per step: P stored, dS stored, the step's products done (then the slot is released). Keeping step
i's dV / dK in flight while step i + 1's S / dP are issued (P and dS in two tiles each, the slot released behind the
next step's P barrier) measured 1.2-1.25x slower: an accumulator in flight across the loop's back edge makes ptxas
serialize every wgmma of the kernel (C7514 / C7515; benchmarks/NOTES.md, sessions 34 and 44).

TAIL_DIM > 0 (head dims 129..192 as 128 + 32 / 64 columns): Q's, K's, V's and dO's columns past HEAD_DIM in tiles of
their own (smem[8:12]), S and dP each the sum of two wgmma groups, dK and dV two accumulators each, HEAD_DIM and
TAIL_DIM wide, stored from registers."""

from __future__ import annotations

from .flash_fwd_hopper import gluon

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from .flash_bwd_dq_hopper import _mask_rows
    from .flash_bwd_hopper_stores import _store_dkdv, _store_dkdv_rows
    from .flash_bwd_hopper_tiles import _key_block, _step

    @gluon.jit
    def _bwd_consumer_wide(descs, smem, p_smem, ds_smem, bars, shape, cu_seqlens, fp32_out, windows, qk_scale,
                           sm_scale, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, BOTTOM_RIGHT: gl.constexpr,
                           IS_VARLEN: gl.constexpr, FP32_GRADS: gl.constexpr, BLOCK_M: gl.constexpr,
                           BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, NUM_STAGES: gl.constexpr,
                           TAIL_DIM: gl.constexpr):
        """Eight warps: the schedule in the module docstring. p_smem, ds_smem: [BLOCK_M, BLOCK_N]."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dk_desc, dv_desc = descs[:9]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem = smem[:6]
        kv_ready, q_ready, do_ready, empty = bars
        nheads_q, nheads_k, group, seqlen_q, seqlen_k = shape
        dtype: gl.constexpr = q_smem.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                            instr_shape=[16, HEAD_DIM // 2, 16])
        kvt_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                             instr_shape=[16, max(TAIL_DIM // 2, 8), 16])
        TAIL_MMAS: gl.constexpr = 1 if TAIL_DIM > 0 else 0       # each product's second wgmma group (the tail's)
        rows_layout: gl.constexpr = gl.SliceLayout(1, s_layout)      # one value per query (row)
        b, q_start, k_start, seqlen_q, seqlen_k, i_hk, n0, off, m_first, n_steps, live, _ = _key_block(
            cu_seqlens, seqlen_q, seqlen_k, nheads_k, windows, HAS_LEFT, HAS_RIGHT, BOTTOM_RIGHT, IS_VARLEN, BLOCK_M,
            BLOCK_N)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
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
            mbarrier.wait(q_ready.index(slot), phase)
            s_tok = warpgroup_mma(q, k_smem.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                s_tok = warpgroup_mma(smem[8].index(slot), smem[9].permute((1, 0)), s_tok, is_async=True)
            mbarrier.wait(do_ready.index(slot), phase)
            dp_tok = warpgroup_mma(do, v_smem.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if TAIL_DIM > 0:
                dp_tok = warpgroup_mma(smem[11].index(slot), smem[10].permute((1, 0)), dp_tok, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(s_tok, ))
            lse2 = lse_smem.index(slot).load(rows_layout)
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
            p = _mask_rows(p, m0, n0, seqlen_q, seqlen_k, off, windows, HAS_LEFT, HAS_RIGHT, IS_VARLEN, BLOCK_M,
                           BLOCK_N, s_layout)
            p_smem.store(p.to(dtype))
            fence_async_shared()
            gl.thread_barrier()             # P's rows from both warpgroups are in p_smem
            dv_tok = warpgroup_mma(p_smem.permute((1, 0)), do, dv, is_async=True)
            if TAIL_DIM > 0:
                dvt_tok = warpgroup_mma(p_smem.permute((1, 0)), smem[11].index(slot), dvt, is_async=True)
            dp = warpgroup_mma_wait(num_outstanding=1 + TAIL_MMAS, deps=(dp_tok, ))  # dV still running
            delta = delta_smem.index(slot).load(rows_layout)
            ds = (p * (dp * sm_scale - gl.expand_dims(delta * sm_scale, 1))).to(dtype)
            ds_smem.store(ds)
            fence_async_shared()
            gl.thread_barrier()             # dS from both warpgroups is in ds_smem
            dk_tok = warpgroup_mma(ds_smem.permute((1, 0)), q, dk, is_async=True)
            if TAIL_DIM > 0:
                dkt_tok = warpgroup_mma(ds_smem.permute((1, 0)), smem[8].index(slot), dkt, is_async=True)
                dv, dk, dvt, dkt = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok, dvt_tok, dkt_tok))
            else:
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv_tok, dk_tok))
            gl.thread_barrier()             # every product of the step is done: the slot, p_smem and ds_smem are free
            mbarrier.arrive(empty.index(slot), count=1)
        if live:
            if TAIL_DIM > 0:            # both parts from registers (K / V's tiles are HEAD_DIM wide)
                _store_dkdv_rows(dk, dv, fp32_out, b, k_start, i_hk, n0, seqlen_k, 0, kv_layout, IS_VARLEN)
                _store_dkdv_rows(dkt, dvt, fp32_out, b, k_start, i_hk, n0, seqlen_k, HEAD_DIM, kvt_layout,
                                 IS_VARLEN)
            else:
                _store_dkdv(dk, dv, k_smem, v_smem, dk_desc, dv_desc, fp32_out, b, k_start, i_hk, n0, seqlen_k,
                            kv_layout, FP32_GRADS, IS_VARLEN, BLOCK_N, HEAD_DIM)
