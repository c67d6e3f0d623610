"""Gated linear units: ``swiglu(gate, up) = silu(gate) * up`` and ``geglu(gate, up) = gelu(gate) * up``.

The elementwise half of a gated MLP (Llama/Mistral/Qwen: SwiGLU; Gemma: GeGLU). It moves bytes and does
almost no arithmetic, so it is judged by one number: the fraction of copy bandwidth it reaches. Each
kernel reads every input element once and writes every output element once, computing in fp32.

Layers, top to bottom: public functions (argument checks) -> torch.library ops ``flashfuse::glu_fwd`` /
``flashfuse::glu_bwd`` with fake implementations and an autograd formula (``torch.compile(fullgraph=True)``
sees one op; eager calls run the same functions without the dispatcher, see ``_custom_op.py``) ->
launchers ``glu_forward`` / ``glu_backward`` -> one forward and one backward kernel, the activation
picked by a constexpr. The plain PyTorch reference is ``reference/glu.py``.

gate and up may be views with a row stride, e.g. the two halves of a fused projection
``proj[..., :I]`` and ``proj[..., I:]``: the kernels take a row stride per tensor and copy nothing. The
backward saves only gate and up (not the activation) and recomputes act(gate), which costs no extra
memory traffic: gate must be read anyway for act'(gate).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import IN_INTERPRETER, cdiv, next_power_of_2

# Activation codes (a constexpr picks the formula; ints, not strings: string constexpr defaults fail to
# compile on triton 3.6).
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
SILU: tl.constexpr = tl.constexpr(0)
GELU: tl.constexpr = tl.constexpr(1)
GELU_TANH: tl.constexpr = tl.constexpr(2)

LOG2E = 1.0 / math.log(2.0)
K_TANH = math.sqrt(2.0 / math.pi)                      # GELU's tanh approximation: tanh(K (g + C g^3))
C_TANH = 0.044715
# exp(x) = 2^(x log2 e): constants below carry the log2(e) factor so each exp is one ex2.
NEG_LOG2E: tl.constexpr = tl.constexpr(-LOG2E)
TANH_A: tl.constexpr = tl.constexpr(-2.0 * K_TANH * LOG2E)          # -2 K log2 e
TANH_B: tl.constexpr = tl.constexpr(-2.0 * K_TANH * C_TANH * LOG2E)  # -2 K C log2 e
TANH_DA: tl.constexpr = tl.constexpr(2.0 * K_TANH)                   # d(2y)/dg = 2K + 6KC g^2
TANH_DB: tl.constexpr = tl.constexpr(6.0 * K_TANH * C_TANH)
# exp(-x) in sigmoid(x) = 1 / (1 + exp(-x)) stops at 2^126 (x < -87.3): finite, so s (1 - s) = s^2 e is
# never 0 * inf = NaN, and sigmoid there is <= 2^-126 (0 once flushed) instead of ~0. NaN inputs still
# give NaN: act = g * s and act' carry g.
MAX_EXP2: tl.constexpr = tl.constexpr(126.0)
INV_SQRT_2: tl.constexpr = tl.constexpr(1.0 / math.sqrt(2.0))
INV_SQRT_2PI: tl.constexpr = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))
NEG_HALF_LOG2E: tl.constexpr = tl.constexpr(-0.5 * LOG2E)
# Numerical Recipes' erfcc: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0, with a fractional
# error below 1.2e-7 for every z (a Chebyshev fit). P's coefficients, lowest degree first; below they are
# scaled by log2(e) (one ex2) and the constant term absorbs the 1/2 of Phi = erfc / 2 (log2(1/2) = -1).
_ERFCC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
          1.48851587, -0.82215223, 0.17087277)
P0: tl.constexpr = tl.constexpr(_ERFCC[0] * LOG2E - 1.0)
P1: tl.constexpr = tl.constexpr(_ERFCC[1] * LOG2E)
P2: tl.constexpr = tl.constexpr(_ERFCC[2] * LOG2E)
P3: tl.constexpr = tl.constexpr(_ERFCC[3] * LOG2E)
P4: tl.constexpr = tl.constexpr(_ERFCC[4] * LOG2E)
P5: tl.constexpr = tl.constexpr(_ERFCC[5] * LOG2E)
P6: tl.constexpr = tl.constexpr(_ERFCC[6] * LOG2E)
P7: tl.constexpr = tl.constexpr(_ERFCC[7] * LOG2E)
P8: tl.constexpr = tl.constexpr(_ERFCC[8] * LOG2E)
P9: tl.constexpr = tl.constexpr(_ERFCC[9] * LOG2E)

# Launch shape. A program handles BLOCK consecutive columns of one row; the grid is flat over
# (row, column block), so any number of rows fits (a 2-D grid's y dimension stops at 65535).
# BLOCK = next_pow2(n_cols) capped at MAX_BLOCK, with 8 elements per thread (NUM_WARPS = BLOCK / 256):
# one 16-byte load per input per thread in bf16/fp16, two in fp32. At MAX_BLOCK = 2048 (8 warps) a
# program keeps 8 KiB (bf16) of loads in flight, and an SM holds 8 such programs (64 warps), ~64 KiB,
# about 3x the bytes-in-flight that HBM3e needs per SM (4.8 TB/s x ~600 ns latency / 132 SMs ~ 22 KB).
# 2048 also divides the common intermediate sizes (14336 = 7 x 2048, 8192, 28672), so every block is a
# full, unmasked one there. Measured on an H200 (bf16, 16384 x 14336, SiLU): BLOCK 1024..8192 with 4..16
# warps all reach 99-102% of copy bandwidth forward and backward, except 1024 with 8 warps (93% forward).
MAX_BLOCK = 2048
ELEMENTS_PER_THREAD = 8


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------
#
# Forward, per element (g = gate, u = up, in fp32):
#     h = act(g) * u
#     silu(g)      = g * s,                                       s = sigmoid(g) = 1 / (1 + exp(-g))
#     gelu(g)      = g * Phi(g),                                  Phi(g) = (1 + erf(g / sqrt 2)) / 2
#                                                                        = erfc(-g / sqrt 2) / 2
#     gelu_tanh(g) = g * (1 + t) / 2 = g * sigmoid(2y),           t = tanh(y), y = sqrt(2/pi) (g + 0.044715 g^3)
#
# Backward (VJP), given dh:
#     du = dh * act(g)
#     dg = dh * u * act'(g)
#     silu'(g)      = s (1 + g (1 - s))
#     gelu'(g)      = Phi(g) + g phi(g),                          phi(g) = exp(-g^2 / 2) / sqrt(2 pi)
#     gelu_tanh'(g) = (1 + t) / 2 + g / 2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 g^2)
#                   = s + g s (1 - s) 2 sqrt(2/pi) (1 + 3 * 0.044715 g^2),           s = sigmoid(2y)
#
# The kernels are bound by memory only while the math stays under ~45 instructions per element (an H200
# SM issues 128 thread-instructions per clock and must finish ~2.7 elements per clock at copy speed).
# Measured there (bf16, 16384 x 14336, forward): SiLU with tl.exp and `1 / x` 102% of copy bandwidth;
# exact GELU through tl.erf (libdevice erff, which branches) 84.6%; GELU with the tanh helper 92%. So:
# - exp and 1/x compile to single MUFU instructions (ex2.approx.ftz, rcp.approx.ftz: 2 and 1 ulp, results
#   below 2^-126 flush to 0) instead of tl.exp / IEEE division with their range fix-ups (~8 instructions);
#   the interpreter uses numpy's exp2 and division;
# - gelu_tanh uses (1 + tanh(y)) / 2 = sigmoid(2y): no tanh, and accurate in the left tail;
# - Phi(g) = erfc(-g / sqrt 2) / 2 by Numerical Recipes' erfcc, branch-free: fractional error < 1.2e-7
#   everywhere plus fp32 rounding of the exponent (|g|^2 / 2 * 2^-24 relative: 3e-6 at g = -5), more
#   accurate in the left tail than fp32 (1 + erf(g / sqrt 2)) / 2, which cancels there.
# With these, every activation measured 100-102% of copy bandwidth forward and 95-102% backward (same
# H200, same shape; gate/up as halves of a fused projection or as separate contiguous tensors).
# act(g) is recomputed from g in the backward (never saved). Module constants multiply tensors from the
# right (tensor * CONST): in triton 3.9's interpreter, CONST * tensor passed on to a jitted function fails.


@triton.jit
def _exp2(x):
    """2^x, one MUFU.EX2 (flush-to-zero) when compiled."""
    if IN_INTERPRETER:
        return tl.exp2(x)
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _rcp(x):
    """1 / x, one MUFU.RCP (flush-to-zero) when compiled."""
    if IN_INTERPRETER:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _activation(g, BACKWARD: tl.constexpr, ACTIVATION: tl.constexpr):
    """act(g), and act'(g) when BACKWARD (else 0), for a block of fp32 values."""
    act_grad = 0.0
    if ACTIVATION == SILU:
        e = _exp2(tl.minimum(g * NEG_LOG2E, MAX_EXP2))                    # exp(-g)
        s = _rcp(1.0 + e)                                                 # sigmoid(g)
        act = g * s
        if BACKWARD:
            act_grad = s * (1.0 + g * (e * s))                            # 1 - s = e s, no cancellation
    elif ACTIVATION == GELU:
        q = g * g
        t = _rcp(1.0 + tl.abs(g) * (0.5 * INV_SQRT_2))                   # t = 1 / (1 + z / 2)
        p = t * P9 + P8
        p = p * t + P7
        p = p * t + P6
        p = p * t + P5
        p = p * t + P4
        p = p * t + P3
        p = p * t + P2
        p = p * t + P1
        p = p * t + P0
        half_erfc = t * _exp2(q * NEG_HALF_LOG2E + p)                    # erfc(z) / 2 = Phi(-|g|)
        cdf = tl.where(g < 0, half_erfc, 1.0 - half_erfc)                # Phi(g)
        act = g * cdf
        if BACKWARD:
            act_grad = cdf + g * _exp2(q * NEG_HALF_LOG2E) * INV_SQRT_2PI
    else:
        q = g * g
        e = _exp2(tl.minimum(g * (q * TANH_B + TANH_A), MAX_EXP2))       # exp(-2y)
        s = _rcp(1.0 + e)                                                 # sigmoid(2y) = (1 + tanh y) / 2
        act = g * s
        if BACKWARD:
            act_grad = s + g * (s * s * e) * (q * TANH_DB + TANH_DA)     # s (1 - s) = s^2 e
    return act, act_grad


@triton.jit
def _glu_fwd_kernel(
    p_gate, p_up, p_out,                          # gate, up, out: (n_rows, n_cols), last dim contiguous
    n_cols, n_col_blocks,
    stride_gate_row, stride_up_row, stride_out_row,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):
    i_pid = tl.program_id(0)
    i_row = (i_pid // n_col_blocks).to(tl.int64)
    i_blk = i_pid % n_col_blocks
    o_col = i_blk * BLOCK + tl.arange(0, BLOCK)                           # [BLOCK]
    p_g = p_gate + i_row * stride_gate_row + o_col
    p_u = p_up + i_row * stride_up_row + o_col
    p_o = p_out + i_row * stride_out_row + o_col
    # Full blocks go unmasked: a mask is known to be constant over 16-byte groups only when Triton can
    # prove n_cols % 16 == 0, otherwise masked accesses split into scalar ones. Only a row's last, partial
    # block takes the masked path.
    if (i_blk + 1) * BLOCK <= n_cols:
        b_g = tl.load(p_g).to(tl.float32)                                 # [BLOCK]
        b_u = tl.load(p_u).to(tl.float32)
        b_act, _ = _activation(b_g, False, ACTIVATION)
        tl.store(p_o, (b_act * b_u).to(p_out.dtype.element_ty))
    else:
        m_col = o_col < n_cols
        b_g = tl.load(p_g, mask=m_col, other=0.0).to(tl.float32)
        b_u = tl.load(p_u, mask=m_col, other=0.0).to(tl.float32)
        b_act, _ = _activation(b_g, False, ACTIVATION)
        tl.store(p_o, (b_act * b_u).to(p_out.dtype.element_ty), mask=m_col)


@triton.jit
def _glu_bwd_kernel(
    p_dout, p_gate, p_up, p_dgate, p_dup,         # all (n_rows, n_cols), last dim contiguous
    n_cols, n_col_blocks,
    stride_dout_row, stride_gate_row, stride_up_row, stride_dgate_row, stride_dup_row,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):
    i_pid = tl.program_id(0)
    i_row = (i_pid // n_col_blocks).to(tl.int64)
    i_blk = i_pid % n_col_blocks
    o_col = i_blk * BLOCK + tl.arange(0, BLOCK)                           # [BLOCK]
    p_dh = p_dout + i_row * stride_dout_row + o_col
    p_g = p_gate + i_row * stride_gate_row + o_col
    p_u = p_up + i_row * stride_up_row + o_col
    p_dg = p_dgate + i_row * stride_dgate_row + o_col
    p_du = p_dup + i_row * stride_dup_row + o_col
    if (i_blk + 1) * BLOCK <= n_cols:                                     # full block: unmasked (see fwd)
        b_dh = tl.load(p_dh).to(tl.float32)                               # [BLOCK]
        b_g = tl.load(p_g).to(tl.float32)
        b_u = tl.load(p_u).to(tl.float32)
        b_act, b_act_grad = _activation(b_g, True, ACTIVATION)
        tl.store(p_dg, (b_dh * b_u * b_act_grad).to(p_dgate.dtype.element_ty))
        tl.store(p_du, (b_dh * b_act).to(p_dup.dtype.element_ty))
    else:
        m_col = o_col < n_cols
        b_dh = tl.load(p_dh, mask=m_col, other=0.0).to(tl.float32)
        b_g = tl.load(p_g, mask=m_col, other=0.0).to(tl.float32)
        b_u = tl.load(p_u, mask=m_col, other=0.0).to(tl.float32)
        b_act, b_act_grad = _activation(b_g, True, ACTIVATION)
        tl.store(p_dg, (b_dh * b_u * b_act_grad).to(p_dgate.dtype.element_ty), mask=m_col)
        tl.store(p_du, (b_dh * b_act).to(p_dup.dtype.element_ty), mask=m_col)


# ----------------------------------------------------------------------------------------------------
# Launchers (no argument checks: the public functions below do them)
# ----------------------------------------------------------------------------------------------------

def _launch_config(n_cols: int, block: int | None = None, num_warps: int | None = None):
    """(BLOCK, num_warps) for rows of n_cols (overrides are for tuning sweeps)."""
    block = block or min(next_power_of_2(n_cols), MAX_BLOCK)
    num_warps = num_warps or min(max(block // (32 * ELEMENTS_PER_THREAD), 1), 8)
    return block, num_warps


def _as_rows(t: Tensor, n_cols: int) -> Tensor:
    """(..., n_cols) -> (n_rows, n_cols) with one row stride: a view whenever the leading dims merge
    (contiguous tensors, column slices such as proj[..., :I]); a copy only otherwise, or when the last
    dim is strided."""
    t = last_dim_contiguous(t)
    try:
        return t.view(-1, n_cols)
    except RuntimeError:
        return t.reshape(-1, n_cols)


def glu_forward(gate: Tensor, up: Tensor, activation: str, out: Tensor | None = None, *,
                block: int | None = None, num_warps: int | None = None) -> Tensor:
    """out = act(gate) * up. gate, up: (..., n_cols) of one shape and dtype, any strides; activation in
    ACTIVATIONS. out (optional): a (..., n_cols) buffer of gate's dtype whose leading dims merge into one
    row stride (a new contiguous tensor by default). Returns out."""
    if out is None:
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n_cols = gate.shape[-1]
    if gate.numel() == 0:
        return out
    g2, u2, o2 = _as_rows(gate, n_cols), _as_rows(up, n_cols), out.view(-1, n_cols)
    n_rows = g2.shape[0]
    BLOCK, warps = _launch_config(n_cols, block, num_warps)
    n_col_blocks = cdiv(n_cols, BLOCK)
    _glu_fwd_kernel[(n_rows * n_col_blocks,)](
        g2, u2, o2, n_cols, n_col_blocks, g2.stride(0), u2.stride(0), o2.stride(0),
        ACTIVATION=ACTIVATIONS[activation], BLOCK=BLOCK, num_warps=warps)
    return out


def glu_backward(dout: Tensor, gate: Tensor, up: Tensor, activation: str, dgate: Tensor | None = None,
                 dup: Tensor | None = None, *, block: int | None = None,
                 num_warps: int | None = None) -> tuple[Tensor, Tensor]:
    """(dgate, dup) = (dout * up * act'(gate), dout * act(gate)), act recomputed from gate. All inputs
    (..., n_cols), any strides; dgate/dup: optional output buffers as in glu_forward."""
    if dgate is None:
        dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if dup is None:
        dup = torch.empty(up.shape, dtype=up.dtype, device=up.device)
    n_cols = gate.shape[-1]
    if gate.numel() == 0:
        return dgate, dup
    dh2, g2, u2 = (_as_rows(t, n_cols) for t in (dout, gate, up))
    dg2, du2 = dgate.view(-1, n_cols), dup.view(-1, n_cols)
    n_rows = g2.shape[0]
    BLOCK, warps = _launch_config(n_cols, block, num_warps)
    n_col_blocks = cdiv(n_cols, BLOCK)
    _glu_bwd_kernel[(n_rows * n_col_blocks,)](
        dh2, g2, u2, dg2, du2, n_cols, n_col_blocks,
        dh2.stride(0), g2.stride(0), u2.stride(0), dg2.stride(0), du2.stride(0),
        ACTIVATION=ACTIVATIONS[activation], BLOCK=BLOCK, num_warps=warps)
    return dgate, dup


# ----------------------------------------------------------------------------------------------------
# torch.library ops
# ----------------------------------------------------------------------------------------------------

def _glu_fwd_impl(gate: Tensor, up: Tensor, activation: str) -> Tensor:
    return glu_forward(gate, up, activation)


def _glu_fwd_fake(gate, up, activation):
    return gate.new_empty(gate.shape)


def _glu_bwd_impl(dout: Tensor, gate: Tensor, up: Tensor, activation: str) -> tuple[Tensor, Tensor]:
    return glu_backward(dout, gate, up, activation)


def _glu_bwd_fake(dout, gate, up, activation):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_context(ctx, inputs, output):
    gate, up, activation = inputs
    ctx.activation = activation
    ctx.save_for_backward(gate, up)                   # never the activation: the backward recomputes it


def _backward(ctx, dout):
    gate, up = ctx.saved_tensors
    dgate, dup = _glu_bwd(dout, gate, up, ctx.activation)
    return dgate, dup, None


# Eager calls on plain tensors skip the custom-op dispatcher; torch.compile sees the custom ops.
_glu_bwd = FlashfuseOp("flashfuse::glu_bwd", _glu_bwd_impl, fake=_glu_bwd_fake)
_glu_fwd = FlashfuseOp("flashfuse::glu_fwd", _glu_fwd_impl, fake=_glu_fwd_fake,
                       setup_context=_setup_context, backward=_backward)


# ----------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------

def _check(gate, up):
    check_tensor("gate", gate)
    check_tensor("up", up)
    check_same(("gate", "up"), (gate, up))
    if gate.dim() == 0:
        raise ValueError("gate is a 0-dim tensor; supported: shape (..., intermediate) with at least 1 dim")
    if gate.shape != up.shape:
        raise ValueError(f"up has shape {tuple(up.shape)} but gate has {tuple(gate.shape)}; they must "
                         "have the same shape (no broadcasting)")


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU: ``silu(gate) * up`` (Llama, Mistral, Qwen MLPs), forward and backward in Triton.

    Shapes: gate, up (..., intermediate), one shape, dtype (fp16, bf16, fp32) and device. Any strides
    whose leading dims merge into one row stride are read in place, e.g. the halves of a fused
    projection (no copies). Computes in fp32, returns a new contiguous tensor of gate's shape and dtype.
    The backward saves gate and up only and recomputes silu(gate).

    Example::

        proj = x @ w_gate_up.T                         # (batch, seqlen, 2 * intermediate)
        gate, up = proj.chunk(2, dim=-1)
        h = swiglu(gate, up)                           # (batch, seqlen, intermediate)
    """
    _check(gate, up)
    return _glu_fwd(gate, up, "silu")


def geglu(gate: Tensor, up: Tensor, approximate: str = "none") -> Tensor:
    """GeGLU: ``gelu(gate) * up`` (Gemma MLPs), forward and backward in Triton.

    approximate: "none" (exact GELU, g * (1 + erf(g / sqrt 2)) / 2) or "tanh" (the tanh approximation),
    as ``torch.nn.functional.gelu``. Shapes, dtypes, strides and outputs as in ``swiglu``.

    Example::

        gate, up = gate_proj(x), up_proj(x)            # (batch, seqlen, intermediate) each
        h = geglu(gate, up, approximate="tanh")        # Gemma's gelu_pytorch_tanh
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate is {approximate!r}; supported: 'none' (exact erf GELU) or 'tanh'")
    _check(gate, up)
    return _glu_fwd(gate, up, "gelu" if approximate == "none" else "gelu_tanh")
