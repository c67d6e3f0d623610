"""Triton kernels of ``flashfuse.linear``: a Hopper matmul with a fused epilogue, and the activation VJP.

Two kernels, each with a plain launcher:

- ``_linear_kernel`` (launcher ``linear_forward`` and ``matmul_act_grad``): one persistent matmul
  ``acc = x @ W^T`` whose epilogue either applies bias + activation (+ the GLU gate) in the forward, or,
  in the backward of a fused MLP, turns the matmul result ``dA = dY2 @ W2`` into ``dZ = dA * act'(Z)``
  (and recomputes ``A = act(Z)`` so the forward never has to keep it);
- ``_act_grad_kernel`` (launcher ``act_grad``): the same VJP as an elementwise kernel, for the backward of
  a single ``linear`` where dA is given.

Activations are small integers (``ACTIVATIONS``): triton 3.6 cannot compile string constexpr defaults.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from ..._env import INTERPRET
from .._triton import IN_INTERPRETER, cdiv, dot, ensure_tma_allocator, next_power_of_2, sm_count, tanh

ACTIVATIONS = {None: 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "relu": 4}
# Gated names -> the activation applied to the gate half.
GATED_ACTIVATIONS = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}


# ----------------------------------------------------------------------------------------------------
# Activations and their derivatives (fp32 in, fp32 out)
# ----------------------------------------------------------------------------------------------------
#   gelu       a = z Phi(z) = z/2 (1 + erf(z / sqrt2))          a' = Phi(z) + z phi(z),  phi(z) = e^{-z^2/2} / sqrt(2 pi)
#   gelu_tanh  a = z/2 (1 + t),  t = tanh(c (z + 0.044715 z^3)),  c = sqrt(2/pi)
#                                                                a' = (1 + t)/2 + z/2 (1 - t^2) c (1 + 3 * 0.044715 z^2)
#   silu       a = z s,  s = sigmoid(z)                          a' = s (1 + z (1 - s))
#   relu       a = max(z, 0)                                     a' = [z > 0]

# FAST (16-bit outputs on the GPU): tanh through the SFU's tanh.approx.f32 (one MUFU instruction, max
# relative error 2^-11, below bf16's 2^-8 / fp16's 2^-11 rounding of the result) instead of libdevice's
# ~20-instruction tanh; silu as z/2 (1 + tanh(z/2)) (= z sigmoid(z)) with the same instruction, one MUFU
# instead of an exp and a division. fp32 outputs keep the accurate forms (2 ulp). gelu (erf) has no
# cheaper exact form and is left as is.
#   gelu_tanh in FAST form: y = z (c + c 0.044715 z^2),  a = h + h t,  h = z/2: 4 FMAs + 1 MUFU.

@triton.jit
def _tanh(x, FAST: tl.constexpr):
    if IN_INTERPRETER or not FAST:
        return tanh(x)
    else:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _activate_and_grad(z, ACTIVATION: tl.constexpr, FAST: tl.constexpr):
    """(act(z), act'(z)) for z: fp32 block."""
    if ACTIVATION == 1:
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327
        return z * cdf, cdf + z * pdf
    elif ACTIVATION == 2:
        t = _tanh(z * (0.7978845608028654 + 0.0356774081363001 * z * z), FAST)
        da = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * z * z)
        return 0.5 * z * (1.0 + t), da
    elif ACTIVATION == 3:
        if FAST:
            s = 0.5 + 0.5 * _tanh(0.5 * z, FAST)
        else:
            s = tl.sigmoid(z)
        return z * s, s * (1.0 + z * (1.0 - s))
    elif ACTIVATION == 4:
        return tl.maximum(z, 0.0), tl.where(z > 0.0, 1.0, 0.0)
    else:
        return z, tl.full(z.shape, 1.0, tl.float32)


@triton.jit
def _activate(z, ACTIVATION: tl.constexpr, FAST: tl.constexpr):
    """act(z) alone (the forward epilogue needs no derivative)."""
    if ACTIVATION == 1:
        return 0.5 * z * (1.0 + tl.erf(z * 0.7071067811865476))
    elif ACTIVATION == 2:
        h = 0.5 * z
        return h + h * _tanh(z * (0.7978845608028654 + 0.0356774081363001 * z * z), FAST)
    elif ACTIVATION == 3:
        if FAST:
            h = 0.5 * z
            return h + h * _tanh(h, FAST)
        else:
            return z * tl.sigmoid(z)
    elif ACTIVATION == 4:
        return tl.maximum(z, 0.0)
    else:
        return z


@triton.jit
def _act_vjp(da, z, u, ACTIVATION: tl.constexpr, GATED: tl.constexpr, FAST: tl.constexpr):
    """VJP of h = act(z) [* u]: returns (h, dz, du); du is only meaningful when GATED.
    Plain:  h = act(z)        dz = da * act'(z)
    Gated:  h = act(z) * u    dz = da * u * act'(z),   du = da * act(z)"""
    a, da_dz = _activate_and_grad(z, ACTIVATION, FAST)
    if GATED:
        return a * u, da * u * da_dz, da * a
    else:
        return a, da * da_dz, da


# ----------------------------------------------------------------------------------------------------
# The matmul with a fused epilogue
# ----------------------------------------------------------------------------------------------------
# Shapes: x (M, K) rows with any row stride; W (N, K) = weight as F.linear stores it, ANY strides (a
# transposed view (K, N).t() of GPT-2's Conv1D weight too); out (M, N).
#
# Forward (BACKWARD=False):
#   z = x @ W^T + b                                     [BLOCK_M, BLOCK_N] fp32 accumulator
#   u = x @ Wu^T + bu                                   (GATED: a second accumulator, same x tile)
#   out = act(z) [* u];  pre = z, pre_up = u            (SAVE_PRE: kept for the backward)
# Backward of act, fused into the matmul that produces its input gradient (BACKWARD=True):
#   dA = x @ W^T      (x = dY2, W^T = W2: the fc2/down_proj input gradient of an MLP)
#   z, u loaded from pre / pre_up;  (out, dpre, dpre_up) = (h, dz, du) of _act_vjp: h = act(z) [* u] is
#   recomputed here so the forward need not keep it for fc2's weight gradient.
#
# Schedule: a persistent grid (one program per SM) walks the tiles in grouped order: GROUP_M row blocks
# share each column block of W while it is hot in L2 (tutorial 03's ordering). Operands come through TMA
# tensor descriptors (USE_TMA) or plain masked pointer loads (any alignment; Triton pipelines both with
# cp.async / TMA into NUM_STAGES shared buffers and issues wgmma on sm_90).

@triton.jit
def _epilogue(acc, acc_up, row0, col0, M, N, bias_ptr, bias_up_ptr,
              out_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr,
              out_desc, pre_desc, pre_up_desc, dpre_desc, dpre_up_desc,
              stride_out_m, stride_pre_m, stride_dpre_m,
              ACTIVATION: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_BIAS_UP: tl.constexpr,
              SAVE_PRE: tl.constexpr, BACKWARD: tl.constexpr, USE_TMA_OUT: tl.constexpr, FAST: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Epilogue of one [BLOCK_M, BLOCK_N] (sub)tile of fp32 accumulators at rows row0.., columns col0..
    Stores go through TMA descriptors (USE_TMA_OUT) or masked pointer stores. Addresses of the pointer
    path: an int64 scalar tile base plus int32 offsets inside the tile (a tensor of int64 offsets per
    element would take two registers each and spill)."""
    dtype = out_ptr.dtype.element_ty
    o_tm = tl.arange(0, BLOCK_M)                                                     # [BLOCK_M] in tile
    o_tn = tl.arange(0, BLOCK_N)                                                     # [BLOCK_N] in tile
    row0_64 = row0.to(tl.int64)
    m_n = o_tn < N - col0
    m_out = (o_tm < M - row0)[:, None] & m_n[None, :]                                # [BLOCK_M, BLOCK_N]
    o_pre = row0_64 * stride_pre_m + col0
    t_pre = o_tm[:, None] * stride_pre_m + o_tn[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + col0 + o_tn, mask=m_n, other=0.0).to(tl.float32)[None, :]
    if BACKWARD:
        if USE_TMA_OUT:
            b_z = pre_desc.load([row0, col0]).to(tl.float32)
        else:
            b_z = tl.load(pre_ptr + o_pre + t_pre, mask=m_out, other=0.0).to(tl.float32)
        b_u = b_z
        if GATED:
            if USE_TMA_OUT:
                b_u = pre_up_desc.load([row0, col0]).to(tl.float32)
            else:
                b_u = tl.load(pre_up_ptr + o_pre + t_pre, mask=m_out, other=0.0).to(tl.float32)
        b_h, b_dz, b_du = _act_vjp(acc, b_z, b_u, ACTIVATION, GATED, FAST)
        if USE_TMA_OUT:
            dpre_desc.store([row0, col0], b_dz.to(dtype))
            if GATED:
                dpre_up_desc.store([row0, col0], b_du.to(dtype))
        else:
            o_dpre = row0_64 * stride_dpre_m + col0
            t_dpre = o_tm[:, None] * stride_dpre_m + o_tn[None, :]
            tl.store(dpre_ptr + o_dpre + t_dpre, b_dz.to(dtype), mask=m_out)
            if GATED:
                tl.store(dpre_up_ptr + o_dpre + t_dpre, b_du.to(dtype), mask=m_out)
    else:
        if GATED:
            if HAS_BIAS_UP:
                acc_up += tl.load(bias_up_ptr + col0 + o_tn, mask=m_n, other=0.0).to(tl.float32)[None, :]
        if SAVE_PRE:
            if USE_TMA_OUT:
                pre_desc.store([row0, col0], acc.to(dtype))
                if GATED:
                    pre_up_desc.store([row0, col0], acc_up.to(dtype))
            else:
                tl.store(pre_ptr + o_pre + t_pre, acc.to(dtype), mask=m_out)
                if GATED:
                    tl.store(pre_up_ptr + o_pre + t_pre, acc_up.to(dtype), mask=m_out)
        b_h = _activate(acc, ACTIVATION, FAST)
        if GATED:
            b_h = b_h * acc_up
    if USE_TMA_OUT:
        out_desc.store([row0, col0], b_h.to(dtype))
    else:
        tl.store(out_ptr + row0_64 * stride_out_m + col0 + (o_tm[:, None] * stride_out_m + o_tn[None, :]),
                 b_h.to(dtype), mask=m_out)


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, wu_ptr, bias_ptr, bias_up_ptr,        # inputs (wu, bias_up: GATED forward only)
    out_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr,  # outputs / saved tensors (see above)
    M, N, K, M_BUCKET,                                  # M_BUCKET: autotune key only (next pow2 of M)
    stride_x_m, stride_w_n, stride_w_k, stride_wu_n, stride_wu_k,
    stride_out_m, stride_pre_m, stride_dpre_m,          # pre and pre_up share a row stride, as dpre/dpre_up
    ACTIVATION: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_BIAS_UP: tl.constexpr,
    SAVE_PRE: tl.constexpr, BACKWARD: tl.constexpr, USE_TMA: tl.constexpr, W_K_CONTIGUOUS: tl.constexpr,
    USE_TMA_OUT: tl.constexpr, FAST: tl.constexpr, FLATTEN: tl.constexpr, EPILOGUE_SPLIT: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_pid_in_group = GROUP_M * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    GATED_FWD: tl.constexpr = GATED and not BACKWARD

    if USE_TMA:
        # TMA zero-fills out-of-bounds rows / columns, so the main loop needs no masks.
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[stride_x_m, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        if W_K_CONTIGUOUS:  # W (N, K) row-major: the usual nn.Linear weight
            w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[stride_w_n, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
            if GATED_FWD:
                wu_desc = tl.make_tensor_descriptor(wu_ptr, shape=[N, K], strides=[stride_wu_n, 1],
                                                    block_shape=[BLOCK_N, BLOCK_K])
        else:  # W^T (K, N) row-major: Conv1D weights, or W2 read as W2^T in the MLP backward
            w_desc = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[stride_w_k, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
            if GATED_FWD:
                wu_desc = tl.make_tensor_descriptor(wu_ptr, shape=[K, N], strides=[stride_wu_k, 1],
                                                    block_shape=[BLOCK_K, BLOCK_N])
    # The epilogue works on [BLOCK_M, EPI_N] subtiles: with EPILOGUE_SPLIT, two halves of the tile one
    # after the other, so its fp32 temporaries (z, u, act, derivatives) need half the registers.
    EPI_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SPLIT else BLOCK_N
    out_desc, pre_desc, pre_up_desc, dpre_desc, dpre_up_desc = out_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr
    if USE_TMA_OUT:  # outputs (and the saved pre-activations) are ours: contiguous, (M, N) or (M, 2N)
        out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[stride_out_m, 1],
                                             block_shape=[BLOCK_M, EPI_N])
        if SAVE_PRE or BACKWARD:
            pre_desc = tl.make_tensor_descriptor(pre_ptr, shape=[M, N], strides=[stride_pre_m, 1],
                                                 block_shape=[BLOCK_M, EPI_N])
            if GATED:
                pre_up_desc = tl.make_tensor_descriptor(pre_up_ptr, shape=[M, N], strides=[stride_pre_m, 1],
                                                        block_shape=[BLOCK_M, EPI_N])
        if BACKWARD:
            dpre_desc = tl.make_tensor_descriptor(dpre_ptr, shape=[M, N], strides=[stride_dpre_m, 1],
                                                  block_shape=[BLOCK_M, EPI_N])
            if GATED:
                dpre_up_desc = tl.make_tensor_descriptor(dpre_up_ptr, shape=[M, N], strides=[stride_dpre_m, 1],
                                                         block_shape=[BLOCK_M, EPI_N])

    # Warp specialization (Hopper, triton >= 3.5): one producer warpgroup issues the TMA loads, num_warps
    # / 4 * 2 consumer warpgroups split the tile's rows for wgmma and the epilogue. The pass needs the
    # nested (not flattened) tile loop.
    FLAT: tl.constexpr = FLATTEN and not WARP_SPECIALIZE
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLAT,
                            warp_specialize=WARP_SPECIALIZE):
        # grouped ordering: consecutive tiles walk down GROUP_M row blocks before moving right
        group_id = tile_id // num_pid_in_group
        first_m = group_id * GROUP_M
        group_size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
        i_m = first_m + (tile_id % num_pid_in_group) % group_size_m
        i_n = (tile_id % num_pid_in_group) // group_size_m

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if GATED_FWD:
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if not USE_TMA:
            # int64 scalar tile bases plus int32 offsets inside the tile (the launcher keeps
            # BLOCK * stride < 2^31): a tensor of int64 offsets per element would double the registers.
            # Rows / columns past the edge are masked; the K tail loads zeros (they add nothing).
            o_tm = tl.arange(0, BLOCK_M)
            o_tn = tl.arange(0, BLOCK_N)
            o_k = tl.arange(0, BLOCK_K)
            m_xm = (o_tm < M - i_m.to(tl.int64) * BLOCK_M)[:, None]                   # [BLOCK_M, 1]
            m_wn = (o_tn < N - i_n * BLOCK_N)[None, :]                                 # [1, BLOCK_N]
            p_x = x_ptr + i_m.to(tl.int64) * BLOCK_M * stride_x_m
            p_w = w_ptr + i_n.to(tl.int64) * BLOCK_N * stride_w_n
            t_x = o_tm[:, None] * stride_x_m + o_k[None, :]                            # [BLOCK_M, BLOCK_K]
            t_w = o_k[:, None] * stride_w_k + o_tn[None, :] * stride_w_n               # [BLOCK_K, BLOCK_N]
            if GATED_FWD:
                p_wu = wu_ptr + i_n.to(tl.int64) * BLOCK_N * stride_wu_n
                t_wu = o_k[:, None] * stride_wu_k + o_tn[None, :] * stride_wu_n
        for ki in range(k_tiles):
            if USE_TMA:
                b_x = x_desc.load([i_m * BLOCK_M, ki * BLOCK_K])                    # [BLOCK_M, BLOCK_K]
                if W_K_CONTIGUOUS:
                    b_w = w_desc.load([i_n * BLOCK_N, ki * BLOCK_K]).T              # [BLOCK_K, BLOCK_N]
                    if GATED_FWD:
                        b_wu = wu_desc.load([i_n * BLOCK_N, ki * BLOCK_K]).T
                else:
                    b_w = w_desc.load([ki * BLOCK_K, i_n * BLOCK_N])
                    if GATED_FWD:
                        b_wu = wu_desc.load([ki * BLOCK_K, i_n * BLOCK_N])
            else:
                m_k = o_k < K - ki * BLOCK_K
                b_x = tl.load(p_x + t_x, mask=m_xm & m_k[None, :], other=0.0)
                b_w = tl.load(p_w + t_w, mask=m_k[:, None] & m_wn, other=0.0)
                p_x += BLOCK_K
                p_w += BLOCK_K * stride_w_k
                if GATED_FWD:
                    b_wu = tl.load(p_wu + t_wu, mask=m_k[:, None] & m_wn, other=0.0)
                    p_wu += BLOCK_K * stride_wu_k
            acc = dot(b_x, b_w, acc)
            if GATED_FWD:
                acc_up = dot(b_x, b_wu, acc_up)

        # ---- epilogue: everything below stays in registers until the stores ----
        if not GATED_FWD:
            acc_up = acc  # unused placeholder
        if EPILOGUE_SPLIT:
            acc_0, acc_1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, EPI_N)), (0, 2, 1)))
            up_0, up_1 = tl.split(tl.permute(tl.reshape(acc_up, (BLOCK_M, 2, EPI_N)), (0, 2, 1)))
            _epilogue(acc_0, up_0, i_m * BLOCK_M, i_n * BLOCK_N, M, N, bias_ptr, bias_up_ptr,
                      out_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr,
                      out_desc, pre_desc, pre_up_desc, dpre_desc, dpre_up_desc,
                      stride_out_m, stride_pre_m, stride_dpre_m, ACTIVATION, GATED, HAS_BIAS, HAS_BIAS_UP,
                      SAVE_PRE, BACKWARD, USE_TMA_OUT, FAST, BLOCK_M, EPI_N)
            _epilogue(acc_1, up_1, i_m * BLOCK_M, i_n * BLOCK_N + EPI_N, M, N, bias_ptr, bias_up_ptr,
                      out_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr,
                      out_desc, pre_desc, pre_up_desc, dpre_desc, dpre_up_desc,
                      stride_out_m, stride_pre_m, stride_dpre_m, ACTIVATION, GATED, HAS_BIAS, HAS_BIAS_UP,
                      SAVE_PRE, BACKWARD, USE_TMA_OUT, FAST, BLOCK_M, EPI_N)
        else:
            _epilogue(acc, acc_up, i_m * BLOCK_M, i_n * BLOCK_N, M, N, bias_ptr, bias_up_ptr,
                      out_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr,
                      out_desc, pre_desc, pre_up_desc, dpre_desc, dpre_up_desc,
                      stride_out_m, stride_pre_m, stride_dpre_m, ACTIVATION, GATED, HAS_BIAS, HAS_BIAS_UP,
                      SAVE_PRE, BACKWARD, USE_TMA_OUT, FAST, BLOCK_M, EPI_N)


# ----------------------------------------------------------------------------------------------------
# Elementwise VJP of the activation (backward of a single linear: dA = dY is given)
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _act_grad_kernel(
    dy_ptr, pre_ptr, pre_up_ptr, dpre_ptr, dpre_up_ptr,   # dy, z, u (M, N) in; dz, du (M, N) out
    M, N, stride_dy_m, stride_pre_m, stride_dpre_m,
    ACTIVATION: tl.constexpr, GATED: tl.constexpr, FAST: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    i_m, i_n = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)                                      # [BLOCK_M]
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)                                      # [BLOCK_N]
    mask = (o_m < M)[:, None] & (o_n < N)[None, :]
    o_pre = o_m[:, None] * stride_pre_m + o_n[None, :]
    b_dy = tl.load(dy_ptr + o_m[:, None] * stride_dy_m + o_n[None, :], mask=mask, other=0.0).to(tl.float32)
    b_z = tl.load(pre_ptr + o_pre, mask=mask, other=0.0).to(tl.float32)
    b_u = b_z
    if GATED:
        b_u = tl.load(pre_up_ptr + o_pre, mask=mask, other=0.0).to(tl.float32)
    _, b_dz, b_du = _act_vjp(b_dy, b_z, b_u, ACTIVATION, GATED, FAST)
    o_dpre = o_m[:, None] * stride_dpre_m + o_n[None, :]
    tl.store(dpre_ptr + o_dpre, b_dz.to(dpre_ptr.dtype.element_ty), mask=mask)
    if GATED:
        tl.store(dpre_up_ptr + o_dpre, b_du.to(dpre_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------------------------
# Config tables
# ----------------------------------------------------------------------------------------------------
# Hopper (sm_90: 228 KB shared memory per SM, 227 KB per block, 64K registers). A stage holds one x tile
# and one (two when gated) W tile; stages * stage bytes must leave room for the epilogue's layout
# conversion. Every config below was compiled offline for sm_90 with triton 3.6 (.gpu/cc_matmul.py): on
# the TMA path no spills and at most 181 KB of shared memory; the pointer fallback (rows not 16-byte
# aligned) spills a little in two variants (bf16 gated backward 248 B, fp32 forward <= 76 B). BLOCK_K = 64
# bf16 = 128 bytes, TMA's widest swizzle. GROUP_M = 8 (tutorial 03): 8 row blocks reuse each W column
# block from L2.
#
# Warp-specialized configs (ws=True, num_warps=4): triton 3.6's Hopper pass turns the tile loop into one
# producer warpgroup (TMA loads, few registers) and two 4-warp consumer warpgroups (64 rows of the tile
# each: wgmma + epilogue, registers raised by setmaxnreg), 12 warps in all. The producer keeps loading the
# next tile while the consumers run the epilogue, and the consumers never issue loads, which the
# single-partition kernel does between its wgmmas. ptxas (triton 3.6, sm_90a): no spills for the plain
# forward (464 B with erf-gelu + save_pre at 128 x 256), the gated forward at 128 x 64 and 128 x 128 / 3
# stages without save_pre (with save_pre + biases 128 x 128 exceeds 227 KB of shared memory: the
# autotuner drops it as out of resources), the backward at 128 x 64 (gated 316 B). The epilogue split
# (reshape/permute/split) does not survive the pass, so WS configs store whole tiles (TMA stores are
# asynchronous: they overlap the next tile's loads anyway).
# Measured on an H200 (session 4, benchmarks/NOTES.md): the plain forward's WS 128 x 256 runs 837 us at the
# 4096 x 4096 -> 16384 GELU shape (the split 8-warp 128 x 256: 818 us); the gated WS configs compiled but
# wrote inf (the two-accumulator epilogue does not survive the pass) and the WS backward was not verified,
# so only the plain forward list keeps WS configs.


def _config(block_m, block_n, block_k, warps, stages, split=True, ws=False):
    return triton.Config(dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                              EPILOGUE_SPLIT=split and not ws, WARP_SPECIALIZE=ws),
                         num_warps=warps, num_stages=stages)


CONFIGS_16BIT = [
    _config(128, 256, 64, 4, 3, ws=True),  # 3 x 48 KB operands + 64 KB output tile = 208 KB
    _config(128, 128, 64, 4, 4, ws=True),  # 4 x 32 KB + 32 KB
    _config(128, 256, 64, 8, 3),   # 2 warpgroups x 64x256 wgmma: the largest tile that fits 3 stages (144 KB)
    _config(128, 128, 64, 8, 4),   # 4 stages x 32 KB
    _config(128, 128, 64, 4, 4),
    _config(64, 256, 64, 4, 4),    # few tokens: 64-row tiles keep all 132 SMs busy
    _config(64, 128, 64, 4, 4),
]
CONFIGS_16BIT_GATED = [            # two W tiles and two accumulators per program
    _config(128, 128, 64, 8, 3),   # 3 x (16 + 2 x 16) KB = 144 KB; 2 x 64 fp32 accumulator registers per thread
    _config(128, 64, 64, 4, 4),
    _config(64, 128, 64, 4, 4),
]
CONFIGS_16BIT_BACKWARD = [        # the epilogue holds z, u, h, dz, du beside the accumulator: smaller tiles
    _config(128, 128, 64, 8, 4),   # (128 x 256 spills here: 2 x 64 fp32 temporaries per thread too many)
    _config(128, 128, 64, 8, 3),
    _config(128, 64, 64, 4, 4),    # 4 x 24 KB of operands + the TMA-loaded z / u tiles
    _config(64, 128, 64, 4, 4),
]
CONFIGS_FP32 = [                   # tf32x3: three tensor-core products per dot; 4-byte operands halve BLOCK_K
    _config(128, 128, 32, 8, 3),
    _config(64, 128, 32, 4, 3),
]
CONFIGS_FP32_SMALL = [             # gated / backward fp32: the hi/lo tf32 splits need registers too
    _config(64, 64, 32, 4, 3),
]
# Plain-pointer path (rows not 16-byte aligned, so no TMA): each load needs a [rows, BLOCK_K] tensor of
# addresses and masks in registers; only 8-warp configs stay free of spills there.
CONFIGS_POINTER = [_config(128, 128, 64, 8, 4)]
CONFIGS_POINTER_SMALL = [_config(128, 64, 64, 8, 3)]      # gated / backward
CONFIGS_POINTER_FP32 = [_config(128, 128, 32, 8, 3)]
CONFIGS_POINTER_FP32_SMALL = [_config(64, 64, 32, 8, 3)]
# The interpreter runs one deterministic small config: 32 rows/cols keep numpy fast and still give
# several tiles and K steps on the tests' odd shapes.
INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, EPILOGUE_SPLIT=True,
                          WARP_SPECIALIZE=False, num_warps=4,
                          num_stages=1)


def configs_for(dtype: torch.dtype, gated: bool, backward: bool, tma: bool = True) -> list:
    """The autotuner's candidates for one kernel variant (also what the offline compile check builds)."""
    if not tma:
        if dtype == torch.float32:
            return CONFIGS_POINTER_FP32_SMALL if gated or backward else CONFIGS_POINTER_FP32
        return CONFIGS_POINTER_SMALL if gated or backward else CONFIGS_POINTER
    if dtype == torch.float32:
        return CONFIGS_FP32_SMALL if gated or backward else CONFIGS_FP32
    if backward:
        return CONFIGS_16BIT_BACKWARD
    return CONFIGS_16BIT_GATED if gated else CONFIGS_16BIT


def _prune(configs, named_args, **kwargs):
    wanted = configs_for(named_args["x_ptr"].dtype, kwargs["GATED"], kwargs["BACKWARD"], kwargs["USE_TMA"])
    return [c for c in configs if any(c is w for w in wanted)]


_linear_tuned = triton.autotune(
    configs=(CONFIGS_16BIT + CONFIGS_16BIT_GATED + CONFIGS_16BIT_BACKWARD + CONFIGS_FP32 + CONFIGS_FP32_SMALL
             + CONFIGS_POINTER + CONFIGS_POINTER_SMALL + CONFIGS_POINTER_FP32 + CONFIGS_POINTER_FP32_SMALL),
    # M_BUCKET (next power of 2 of M), not M: a new token count re-tunes only when it crosses a power of 2
    key=["M_BUCKET", "N", "K", "ACTIVATION", "GATED", "BACKWARD", "USE_TMA", "W_K_CONTIGUOUS", "USE_TMA_OUT"],
    prune_configs_by={"early_config_prune": _prune},
)(_linear_kernel)

# Flattening the tile and K loops lets Triton's pipeliner prefetch the next tile during the epilogue
# (measured on an H200, bf16 4096 -> 16384 GELU: within 3% either way; kept on, the tutorial's choice).
FLATTEN = True

# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------


# The SFU forms of tanh / silu (see _tanh) for 16-bit results; a knob for benchmarks/tune_matmul.py.
FAST_MATH = True


def _fast(out) -> bool:
    """The activations' SFU forms are accurate enough for 16-bit results only."""
    return FAST_MATH and out.dtype in (torch.float16, torch.bfloat16)


def _tma_ok(*tensors) -> bool:
    """TMA needs 16-byte aligned base addresses and row strides and a unit last stride."""
    for t in tensors:
        if t is None:
            continue
        if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def _launch(x, w, wu, bias, bias_up, out, pre, pre_up, dpre, dpre_up, *, activation: int, gated: bool,
            save_pre: bool, backward: bool, config: dict | None = None):
    """One _linear_kernel launch. x (M, K) (last dim contiguous), w / wu (N, K) any strides."""
    M, K = x.shape
    N = out.shape[1]
    if M == 0 or N == 0:
        return
    w_k_contiguous = w.stride(1) == 1
    if gated and not backward:
        w_k_contiguous = w_k_contiguous and wu.stride(1) == 1
    w_tma = w if w_k_contiguous else w.t()
    wu_tma = (wu if w_k_contiguous else wu.t()) if gated and not backward else None
    use_tma = K > 0 and _tma_ok(x, w_tma, wu_tma)
    use_tma_out = _tma_ok(out, pre, pre_up, dpre, dpre_up)
    if use_tma or use_tma_out:
        ensure_tma_allocator()
    dummy = out
    args = (x, w, wu if wu is not None else w, bias if bias is not None else dummy,
            bias_up if bias_up is not None else dummy, out,
            pre if pre is not None else dummy, pre_up if pre_up is not None else dummy,
            dpre if dpre is not None else dummy, dpre_up if dpre_up is not None else dummy,
            M, N, K, next_power_of_2(M),
            x.stride(0), w.stride(0), w.stride(1),
            (wu if wu is not None else w).stride(0), (wu if wu is not None else w).stride(1),
            out.stride(0), pre.stride(0) if pre is not None else 0, dpre.stride(0) if dpre is not None else 0)
    flags = dict(ACTIVATION=activation, GATED=gated, HAS_BIAS=bias is not None,
                 HAS_BIAS_UP=bias_up is not None, SAVE_PRE=save_pre, BACKWARD=backward, USE_TMA=use_tma,
                 W_K_CONTIGUOUS=w_k_contiguous, USE_TMA_OUT=use_tma_out, FAST=_fast(out),
                 FLATTEN=FLATTEN and use_tma and not INTERPRET)  # flattened pointer loops spill (compile check)

    def grid(meta):
        tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
        return (tiles if INTERPRET else min(tiles, sm_count(x.device)),)

    if config is None and INTERPRET:
        config = INTERPRETER_CONFIG
    if config is not None:
        _linear_kernel[grid](*args, **flags, **config)
    else:
        _linear_tuned[grid](*args, **flags)


def linear_forward(x, weight, bias=None, *, activation: int = 0, up_weight=None, up_bias=None,
                   save_pre: bool = False, config: dict | None = None):
    """out = act(x W^T + b) [* (x Wu^T + bu)] for x (M, K), weight / up_weight (N, K) any strides.

    Returns (out (M, N), pre): pre is None, or with save_pre the pre-activations z (M, N), or for a gated
    layer one (M, 2N) buffer [z | u] (gate pre-activations, then up), as ``act_grad`` and
    ``matmul_act_grad`` take it."""
    M, N = x.shape[0], weight.shape[0]
    gated = up_weight is not None
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    pre = pre_up = None
    if save_pre:
        buf = torch.empty((M, 2 * N if gated else N), device=x.device, dtype=x.dtype)
        pre, pre_up = (buf[:, :N], buf[:, N:]) if gated else (buf, None)
    _launch(x, weight, up_weight, bias, up_bias, out, pre, pre_up, None, None, activation=activation,
            gated=gated, save_pre=save_pre, backward=False, config=config)
    return out, (None if pre is None else (buf if gated else pre))


def _split_pre(pre, gated: bool):
    n = pre.shape[1] // 2 if gated else pre.shape[1]
    return (pre[:, :n], pre[:, n:]) if gated else (pre, None)


def matmul_act_grad(dy, weight_t, pre, *, activation: int, gated: bool, config: dict | None = None):
    """MLP backward through fc2 and the activation in one matmul: dA = dy @ weight_t^T, then
    (dz [| du], h) = VJP of h = act(z) [* u] at the saved pre-activations.

    dy (M, K2) (fc2's output gradient), weight_t (N, K2) any strides (fc2.weight.t(): fc2.weight is
    (K2, N)), pre as ``linear_forward`` saved it. Returns (dpre like pre, h (M, N))."""
    M, N = dy.shape[0], weight_t.shape[0]
    z, u = _split_pre(pre, gated)
    h = torch.empty((M, N), device=dy.device, dtype=dy.dtype)
    dpre = torch.empty_like(pre, memory_format=torch.contiguous_format)
    dz, du = _split_pre(dpre, gated)
    _launch(dy, weight_t, None, None, None, h, z, u, dz, du, activation=activation, gated=gated,
            save_pre=False, backward=True, config=config)
    return dpre, h


def act_grad(dy, pre, *, activation: int, gated: bool):
    """Elementwise VJP of h = act(z) [* u]: dy (M, N) -> dpre like pre ((M, N), or (M, 2N) [dz | du])."""
    M, N = dy.shape
    z, u = _split_pre(pre, gated)
    dpre = torch.empty_like(pre, memory_format=torch.contiguous_format)
    dz, du = _split_pre(dpre, gated)
    if M == 0 or N == 0:
        return dpre
    # Memory-bound: 4096 elements per program (8 KB of bf16 per tensor) keep enough bytes in flight,
    # rows of up to 512 columns give 16-byte vector accesses per thread with 8 warps.
    block_n = min(next_power_of_2(N), 512)
    block_m = max(1, 4096 // block_n)
    grid = (cdiv(M, block_m), cdiv(N, block_n))
    _act_grad_kernel[grid](dy, z, u if u is not None else z, dz, du if du is not None else dz,
                           M, N, dy.stride(0), z.stride(0), dz.stride(0),
                           ACTIVATION=activation, GATED=gated, FAST=_fast(dz), BLOCK_M=block_m, BLOCK_N=block_n,
                           num_warps=8)
    return dpre
