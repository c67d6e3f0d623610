"""Rotary position embedding (RoPE), forward and backward, one Triton kernel.

Public functions:
- ``apply_rotary_emb``: flash-attn's ``flash_attn.layers.rotary.apply_rotary_emb`` (GPT-NeoX or GPT-J
  layout, partial rotary, int / per-sequence offsets, position ids, varlen, in place);
- ``apply_rotary_pos_emb``: a drop-in for HF transformers' ``modeling_llama.apply_rotary_pos_emb``
  (q and k rotated in one launch, GQA head counts, partial rotary as Phi-3 splits it).

Layers: kernel (``rope_details/_kernels.py``) -> launchers (``rotary_forward`` / ``rotary_backward``) ->
torch.library ops (``flashfuse::rotary``, ``flashfuse::rotary_`` in place, ``flashfuse::rotary_qk``) with
fake impls and autograd -> public functions. The plain PyTorch version is ``flashfuse.reference.rope``.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .._checks import check_same, check_tensor, last_dim_contiguous
from ._custom_op import FlashfuseOp
from ._triton import cdiv, next_power_of_2
from .rope_details._kernels import _rotary_kernel   # the math and the tiling are documented there

INT_DTYPES = (torch.int32, torch.int64)
MAX_GRID_BATCH = 65535        # CUDA's limit on grid dim 1, where the batch (or sequence) index lives

# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------

# Tile = [BLOCK_H heads, rotary + pass-through features] of one token, at most TILE_ELEMENTS elements:
# 1024 on 4 warps (8 elements per thread; 32-56 registers, no spills, ptxas sm_90), so many programs share
# an SM. H200, Llama shapes (16384 tokens, 32 q / 8 kv heads, hd 128, bf16), CUDA-graph timing, with one
# program per (token, tile) and a token's tiles in grid dim 2, so that each tile's sweep over all tokens
# re-read the 8 MB (batch, seqlen, 128) cos/sin tables: 84-87% of copy bandwidth on the HF op, 89-93%
# with L2-resident shared fp32 tables; 2048 / 4096-element tiles or 2 warps per 1K gave 74-83%. Now a
# program takes all its token's tiles (TILES_PER_PROGRAM = 0, Liger's one program per token: 91% on the
# same op), reads the cos/sin row once and keeps two tiles' loads in flight (PREFETCH).
TILE_ELEMENTS = 1024
WARPS_PER_1K = 4              # 4 warps per 1024 elements: 8 elements per thread
TILES_PER_PROGRAM = 0         # tiles of a token per program; 0 = all of them (one program per token)
PREFETCH = True


def _floor_pow2(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _strides(t: Tensor, varlen: bool):
    """(batch, seq, head) strides of x (batch, seqlen, nheads, d) or of varlen x (total, nheads, d)."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def rotary_forward(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, *, rotary_dim: int,
                   y: Optional[Tensor] = None, out_y: Optional[Tensor] = None, interleaved: bool = False,
                   conjugate: bool = False, cos_half_offset: int = 0, seqlen_offset: int = 0,
                   seqlen_offsets: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                   max_seqlen: int = 0, position_ids: Optional[Tensor] = None) -> None:
    """Write the rotation of x into out (and of y into out_y); out may be x itself (in place).

    x, out: (batch, seqlen, nheads_x, headdim_x), or (total, nheads_x, headdim_x) with cu_seqlens
    (batch + 1,) int32 and max_seqlen; y, out_y: the same with nheads_y, headdim_y (k of a q/k pair).
    cos, sin: (seqlen_ro, width) or (batch, seqlen_ro, width), last dim contiguous; a token's row is its
    position: position_ids (batch, seqlen) / (total,), else index + seqlen_offset (+ seqlen_offsets[b]).
    c1 = row[:rotary_dim/2], c2 = row[cos_half_offset:][:rotary_dim/2]. conjugate: the VJP (rotation by
    -theta). No checks here: the public functions validate.
    """
    varlen = cu_seqlens is not None
    batch = cu_seqlens.numel() - 1 if varlen else x.shape[0]
    seqlen = max_seqlen if varlen else x.shape[1]
    if batch == 0 or seqlen == 0:
        return
    heads_y, dim_y = (y.shape[-2], y.shape[-1]) if y is not None else (0, 0)
    copy_pass = out.data_ptr() != x.data_ptr() and max(x.shape[-1], dim_y) > rotary_dim
    block_k = next_power_of_2(rotary_dim // 2)
    block_p = next_power_of_2(max(x.shape[-1], dim_y) - rotary_dim) if copy_pass else 1
    width = 2 * block_k + (block_p if copy_pass else 0)
    block_h = min(next_power_of_2(max(x.shape[-2], heads_y)), _floor_pow2(TILE_ELEMENTS // width))
    num_warps = min(8, _floor_pow2(WARPS_PER_1K * block_h * width // 1024))
    tiles_x, tiles_y = cdiv(x.shape[-2], block_h), cdiv(heads_y, block_h)
    n_tiles = tiles_x + tiles_y
    tiles_per_program = n_tiles if TILES_PER_PROGRAM <= 0 else min(TILES_PER_PROGRAM, n_tiles)
    n_groups = cdiv(n_tiles, tiles_per_program)
    cos_b, cos_s = (cos.stride(0), cos.stride(1)) if cos.dim() == 3 else (0, cos.stride(0))
    sin_b, sin_s = (sin.stride(0), sin.stride(1)) if sin.dim() == 3 else (0, sin.stride(0))
    if position_ids is not None:
        pos_b, pos_s = (0, position_ids.stride(0)) if varlen else position_ids.stride()
    else:
        pos_b, pos_s = 0, 0
    y_, out_y_ = (y, out_y) if y is not None else (x, out)     # placeholders, unread when HAS_Y is False
    _rotary_kernel[(seqlen * n_groups, batch)](
        x, out, y_, out_y_, cos, sin,
        cu_seqlens if varlen else cos, seqlen_offsets if seqlen_offsets is not None else cos,
        position_ids if position_ids is not None else cos,
        seqlen, cos.shape[-2], x.shape[-2], heads_y, x.shape[-1], dim_y, rotary_dim, int(seqlen_offset),
        cos_half_offset, tiles_x, n_tiles, n_groups, tiles_per_program,
        *_strides(x, varlen), *_strides(out, varlen), *_strides(y_, varlen), *_strides(out_y_, varlen),
        cos_b, cos_s, sin_b, sin_s, pos_b, pos_s,
        INTERLEAVED=interleaved, CONJUGATE=conjugate, IS_VARLEN=varlen, HAS_Y=y is not None,
        HAS_OFFSETS=seqlen_offsets is not None, HAS_POSITION_IDS=position_ids is not None,
        COPY_PASS=copy_pass, PREFETCH=PREFETCH and tiles_per_program > 1, BLOCK_H=block_h, BLOCK_K=block_k,
        BLOCK_P=block_p, num_warps=num_warps)


def rotary_backward(dout: Tensor, cos: Tensor, sin: Tensor, dx: Tensor, **kwargs) -> None:
    """dx = VJP of rotary_forward: the same kernel with the transposed 2x2 blocks (rotation by -theta).
    Takes rotary_forward's keyword arguments (dy / dx_y for y / out_y)."""
    rotary_forward(dout, cos, sin, dx, conjugate=not kwargs.pop("conjugate", False), **kwargs)


# ----------------------------------------------------------------------------------------------------
# torch.library ops: one op per call under torch.compile. The backward of each functional op is the
# same op with conjugate flipped, so double backward works too.
# ----------------------------------------------------------------------------------------------------

def _rotary_impl(x: Tensor, cos: Tensor, sin: Tensor, seqlen_offsets: Optional[Tensor],
            cu_seqlens: Optional[Tensor], position_ids: Optional[Tensor], seqlen_offset: int,
            max_seqlen: int, interleaved: bool, conjugate: bool) -> Tensor:
    out = torch.empty_like(x)
    rotary_forward(x, cos, sin, out, rotary_dim=2 * cos.shape[-1], interleaved=interleaved,
                   conjugate=conjugate, seqlen_offset=seqlen_offset, seqlen_offsets=seqlen_offsets,
                   cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, position_ids=position_ids)
    return out


def _rotary_fake(x, cos, sin, seqlen_offsets, cu_seqlens, position_ids, seqlen_offset, max_seqlen, interleaved,
                 conjugate):
    return torch.empty_like(x)


def _rotary_setup(ctx, inputs, output):
    _x, cos, sin, seqlen_offsets, cu_seqlens, position_ids, *options = inputs
    ctx.save_for_backward(cos, sin, seqlen_offsets, cu_seqlens, position_ids)
    ctx.options = options


def _rotary_backward(ctx, dout):
    seqlen_offset, max_seqlen, interleaved, conjugate = ctx.options
    dx = _rotary(last_dim_contiguous(dout), *ctx.saved_tensors, seqlen_offset, max_seqlen, interleaved,
                 not conjugate)
    return (dx,) + (None,) * 9


# The backward calls the op itself (with the conjugate rotation), so double backward works too.
_rotary = FlashfuseOp("flashfuse::rotary", _rotary_impl, fake=_rotary_fake, setup_context=_rotary_setup,
                      backward=_rotary_backward)


@torch.library.custom_op("flashfuse::rotary_", mutates_args=("x",))
def _rotary_inplace(x: Tensor, cos: Tensor, sin: Tensor, seqlen_offsets: Optional[Tensor],
                    cu_seqlens: Optional[Tensor], position_ids: Optional[Tensor], seqlen_offset: int,
                    max_seqlen: int, interleaved: bool) -> None:
    rotary_forward(x, cos, sin, x, rotary_dim=2 * cos.shape[-1], interleaved=interleaved,
                   seqlen_offset=seqlen_offset, seqlen_offsets=seqlen_offsets, cu_seqlens=cu_seqlens,
                   max_seqlen=max_seqlen, position_ids=position_ids)


@_rotary_inplace.register_fake
def _(x, cos, sin, seqlen_offsets, cu_seqlens, position_ids, seqlen_offset, max_seqlen, interleaved):
    return None


class _RotaryInplace(torch.autograd.Function):
    """Autograd for the in-place op (torch.library takes no autograd formula for a mutating op):
    x is rotated in its own storage and marked dirty; the backward allocates dx (the incoming gradient
    may be shared with other consumers, so it is not overwritten)."""

    @staticmethod
    def forward(ctx, x, cos, sin, seqlen_offsets, cu_seqlens, position_ids, seqlen_offset, max_seqlen,
                interleaved):
        _rotary_inplace(x, cos, sin, seqlen_offsets, cu_seqlens, position_ids, seqlen_offset, max_seqlen,
                        interleaved)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin, seqlen_offsets, cu_seqlens, position_ids)
        ctx.options = (seqlen_offset, max_seqlen, interleaved)
        return x

    @staticmethod
    def backward(ctx, dout):
        seqlen_offset, max_seqlen, interleaved = ctx.options
        dx = _rotary(last_dim_contiguous(dout), *ctx.saved_tensors, seqlen_offset, max_seqlen, interleaved,
                     True)
        return (dx,) + (None,) * 8


def _rotary_qk_impl(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, seqlen_offsets: Optional[Tensor],
               position_ids: Optional[Tensor], seqlen_offset: int, rotary_dim: int, cos_half_offset: int,
               interleaved: bool, conjugate: bool, out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    q_out, k_out = torch.empty_like(q, dtype=out_dtype), torch.empty_like(k, dtype=out_dtype)
    rotary_forward(q, cos, sin, q_out, y=k, out_y=k_out, rotary_dim=rotary_dim, interleaved=interleaved,
                   conjugate=conjugate, cos_half_offset=cos_half_offset, seqlen_offset=seqlen_offset,
                   seqlen_offsets=seqlen_offsets, position_ids=position_ids)
    return q_out, k_out


def _rotary_qk_fake(q, k, cos, sin, seqlen_offsets, position_ids, seqlen_offset, rotary_dim, cos_half_offset,
                    interleaved, conjugate, out_dtype):
    return torch.empty_like(q, dtype=out_dtype), torch.empty_like(k, dtype=out_dtype)


def _rotary_qk_setup(ctx, inputs, output):
    q, _k, cos, sin, seqlen_offsets, position_ids, *options = inputs
    ctx.save_for_backward(cos, sin, seqlen_offsets, position_ids)
    ctx.options = options[:-1]
    ctx.in_dtype = q.dtype


def _rotary_qk_backward(ctx, dq_out, dk_out):
    cos, sin, seqlen_offsets, position_ids = ctx.saved_tensors
    seqlen_offset, rotary_dim, cos_half_offset, interleaved, conjugate = ctx.options
    dq, dk = _rotary_qk(last_dim_contiguous(dq_out), last_dim_contiguous(dk_out), cos, sin, seqlen_offsets,
                        position_ids, seqlen_offset, rotary_dim, cos_half_offset, interleaved, not conjugate,
                        ctx.in_dtype)
    return (dq, dk) + (None,) * 10


_rotary_qk = FlashfuseOp("flashfuse::rotary_qk", _rotary_qk_impl, fake=_rotary_qk_fake,
                         setup_context=_rotary_qk_setup, backward=_rotary_qk_backward)


# ----------------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------------

def _check_cos_sin(cos, sin, x, x_name):
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, ndims=(2, 3))
        check_same((x_name, name), (x, t), dtype=False)
        if t.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError(f"{name} requires grad; flashfuse's rotary embedding gives no gradient "
                                      "for the cos/sin tables (compute them under torch.no_grad())")
    if cos.shape != sin.shape:
        raise ValueError(f"cos has shape {tuple(cos.shape)} but sin has {tuple(sin.shape)}; they must match")
    return last_dim_contiguous(cos), last_dim_contiguous(sin)


def _check_rotary_dim(rotary_dim: int, what: str, headdims):
    if rotary_dim <= 0 or rotary_dim % 2 != 0:
        raise ValueError(f"rotary_dim is {rotary_dim} ({what}); supported: an even number >= 2")
    for name, headdim in headdims:
        if rotary_dim > headdim:
            raise ValueError(f"rotary_dim is {rotary_dim} ({what}) but {name} has headdim {headdim}; "
                             "rotary_dim must be <= headdim")


def _check_index(name, t, shape):
    check_tensor(name, t, ndims=(len(shape),), dtypes=INT_DTYPES)
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)}")


def _check_batch(batch):
    if batch > MAX_GRID_BATCH:
        raise ValueError(f"batch (number of sequences) is {batch}; supported: <= {MAX_GRID_BATCH}")


def _check_varlen(x, cu_seqlens, max_seqlen):
    check_tensor("cu_seqlens", cu_seqlens, ndims=(1,), dtypes=(torch.int32,))
    check_same(("x", "cu_seqlens"), (x, cu_seqlens), dtype=False)
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens has {cu_seqlens.numel()} entries; it needs nseq + 1 >= 2 (a leading 0, "
                         "then the running total of sequence lengths)")
    if max_seqlen is None:
        raise ValueError("max_seqlen is None; with cu_seqlens pass max_seqlen, an int >= the longest sequence")
    if not isinstance(max_seqlen, (int, torch.SymInt)) or max_seqlen < 0:
        raise ValueError(f"max_seqlen is {max_seqlen!r}; supported: an int >= the longest sequence")
    if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
        return  # the checks below read cu_seqlens (a host sync): skipped under torch.compile / CUDA graphs
    steps = torch.diff(cu_seqlens)
    stats = torch.stack([cu_seqlens[0], steps.min(), cu_seqlens[-1], steps.max()])
    first, min_step, last, max_step = stats.tolist()                      # one host sync for all checks
    if first != 0 or min_step < 0:
        raise ValueError(f"cu_seqlens must start at 0 and never decrease; got first={first}, "
                         f"smallest step={min_step}")
    if last > x.shape[0]:
        raise ValueError(f"cu_seqlens ends at {last} but x has only {x.shape[0]} rows")
    if max_step > max_seqlen:
        raise ValueError(f"max_seqlen is {max_seqlen} but a sequence in cu_seqlens has {max_step} tokens")


def _check_positions(x, x_name, cos, batch, seqlen, seqlen_offsets, position_ids):
    """-> (offsets tensor or None, int offset): where each token sits in the cos/sin table."""
    if isinstance(seqlen_offsets, torch.Tensor):
        _check_index("seqlen_offsets", seqlen_offsets, (batch,))
        check_same((x_name, "seqlen_offsets"), (x, seqlen_offsets), dtype=False)
        offsets, offset = seqlen_offsets, 0
    elif isinstance(seqlen_offsets, (int, torch.SymInt)) and not isinstance(seqlen_offsets, bool):
        offsets, offset = None, seqlen_offsets
        if position_ids is None and not 0 <= offset <= cos.shape[-2] - seqlen:
            raise ValueError(f"seqlen_offsets is {offset} and the longest sequence has {seqlen} tokens, but "
                             f"cos/sin have {cos.shape[-2]} positions; need 0 <= seqlen_offsets and "
                             "seqlen_offsets + seqlen <= seqlen_ro")
    else:
        raise TypeError(f"seqlen_offsets is a {type(seqlen_offsets).__name__}; supported: int or (batch,) "
                        "integer tensor")
    if position_ids is not None:
        if offsets is not None or offset != 0:
            raise ValueError("position_ids and seqlen_offsets were both given; pass one of them")
        _check_index("position_ids", position_ids, x.shape[:-2])
        check_same((x_name, "position_ids"), (x, position_ids), dtype=False)
    return offsets, offset


# ----------------------------------------------------------------------------------------------------
# Public functions
# ----------------------------------------------------------------------------------------------------

def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0, cu_seqlens=None,
                     max_seqlen=None, position_ids=None):
    """Rotary position embedding with flash-attn's ``apply_rotary_emb`` semantics, forward and backward.

    Shapes:
        x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens (packed varlen)
        cos, sin: (seqlen_ro, rotary_dim / 2), or per sequence (batch, seqlen_ro, rotary_dim / 2); any
            float dtype (fp32 tables give the most accurate result), no gradient
        returns: x's shape and dtype; features past rotary_dim (<= headdim) are copied unchanged

    Options:
        interleaved: False = GPT-NeoX pairs (x[i], x[i + rotary_dim/2]); True = GPT-J (x[2i], x[2i+1]).
        inplace: rotate x in its own storage and return it (x's last dim must be contiguous; x must not
            be a leaf that requires grad). The backward is the rotation by -theta either way.
        seqlen_offsets: int, or (batch,) int32/int64 tensor: token s of sequence b is at position
            s + offset (a KV cache's length at decode time).
        cu_seqlens: (batch + 1,) int32 cumulative lengths; then max_seqlen (int >= longest sequence)
            is required.
        position_ids: (batch, seqlen) (or (total,) with cu_seqlens) integer positions, instead of the
            offsets (packed sequences, left padding). A position outside [0, seqlen_ro) gives NaN.

    fp32 arithmetic, stored in x.dtype; any strides with a contiguous last dim (no copy).

    Example::

        cos, sin = flashfuse.reference.rope.rotary_tables(128, 4096, device="cuda")  # (4096, 64) fp32
        q = torch.randn(2, 1024, 32, 128, device="cuda", dtype=torch.bfloat16)
        q_rot = apply_rotary_emb(q, cos, sin)                              # positions 0..1023
        q_dec = apply_rotary_emb(q[:, :1], cos, sin, seqlen_offsets=1024)  # position 1024
    """
    varlen = cu_seqlens is not None
    layout = "(total, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)"
    check_tensor("x", x, ndims=(3,) if varlen else (4,))
    cos, sin = _check_cos_sin(cos, sin, x, "x")
    _check_rotary_dim(2 * cos.shape[-1], "2 * cos.shape[-1]", (("x", x.shape[-1]),))
    if varlen:
        _check_varlen(x, cu_seqlens, max_seqlen)
        batch, seqlen = cu_seqlens.numel() - 1, max_seqlen
    else:
        batch, seqlen = x.shape[0], x.shape[1]
        max_seqlen = 0
    _check_batch(batch)
    if cos.dim() == 3 and cos.shape[0] != batch:
        raise ValueError(f"cos has shape {tuple(cos.shape)}: a per-sequence table needs {batch} rows in dim 0 "
                         f"(x is {layout} with {batch} sequences)")
    offsets, offset = _check_positions(x, "x", cos, batch, seqlen, seqlen_offsets, position_ids)
    args = (cos, sin, offsets, cu_seqlens, position_ids, offset, max_seqlen, interleaved)
    if inplace:
        if x.stride(-1) != 1:
            raise ValueError(f"inplace=True needs x with a contiguous last dim; x has strides {x.stride()}")
        if x.requires_grad and torch.is_grad_enabled():
            return _RotaryInplace.apply(x, *args)
        _rotary_inplace(x, *args)
        return x
    return _rotary(last_dim_contiguous(x), *args, False)


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Drop-in for HF transformers' ``modeling_llama.apply_rotary_pos_emb``: q and k in one launch.

    Shapes (unsqueeze_dim=1, HF's attention layout; unsqueeze_dim=2 takes (batch, seqlen, nheads, D)):
        q: (batch, nheads_q, seqlen, headdim_q); k: (batch, nheads_k, seqlen, headdim_k) (GQA: any head
            counts); any strides with a contiguous last dim (HF's transposed views are not copied)
        cos, sin: (batch or 1, seqlen, rotary_dim), as HF's rotary embedding returns them (the two halves
            duplicated); or a (max_positions, rotary_dim) table with position_ids (batch or 1, seqlen),
            as transformers < 4.38 called it. With 3-D cos/sin, position_ids is ignored, as in HF.
        returns (q_embed, k_embed) shaped like q and k, dtype torch.promote_types(q, cos, sin) as HF's
            expression gives.

    Computes q * cos + rotate_half(q) * sin on the first rotary_dim = cos.shape[-1] features (rotate_half
    within them, as Phi-3 splits a partial rotary) and passes the rest through. Arithmetic in fp32 with
    one rounding, so bf16 results are at least as accurate as HF's. No gradient for cos/sin.

    Example::

        cos, sin = model.model.rotary_emb(hidden_states, position_ids)  # (batch, seqlen, head_dim)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)                     # q (batch, 32, seqlen, 128)
    """
    check_tensor("q", q, ndims=(4,))
    check_tensor("k", k, ndims=(4,))
    check_same(("q", "k"), (q, k))
    u = unsqueeze_dim + 4 if isinstance(unsqueeze_dim, int) and unsqueeze_dim < 0 else unsqueeze_dim
    if u not in (1, 2):
        raise ValueError(f"unsqueeze_dim is {unsqueeze_dim!r}; supported: 1 (q, k as (batch, nheads, seqlen, "
                         "headdim)) or 2 (q, k as (batch, seqlen, nheads, headdim))")
    q_, k_ = (q.transpose(1, 2), k.transpose(1, 2)) if u == 1 else (q, k)    # (batch, seqlen, nheads, d)
    batch, seqlen = q_.shape[:2]
    if tuple(k_.shape[:2]) != (batch, seqlen):
        raise ValueError(f"q has shape {tuple(q.shape)} and k has {tuple(k.shape)}; they must agree in batch "
                         "and seqlen")
    cos, sin = _check_cos_sin(cos, sin, q, "q")
    rotary_dim = cos.shape[-1]
    _check_rotary_dim(rotary_dim, "cos.shape[-1]", (("q", q.shape[-1]), ("k", k.shape[-1])))
    _check_batch(batch)
    if cos.dim() == 3:
        if cos.shape[1] != seqlen or cos.shape[0] not in (1, batch):
            raise ValueError(f"cos has shape {tuple(cos.shape)}; expected ({batch} or 1, {seqlen}, rotary_dim) "
                             f"for q of shape {tuple(q.shape)} with unsqueeze_dim={unsqueeze_dim}")
        cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
        position_ids = None
    else:
        if position_ids is None:
            raise ValueError(f"cos has shape {tuple(cos.shape)} (a position table); pass position_ids "
                             "(batch, seqlen), or cos/sin of shape (batch, seqlen, rotary_dim)")
        check_tensor("position_ids", position_ids, ndims=(2,), dtypes=INT_DTYPES)
        check_same(("q", "position_ids"), (q, position_ids), dtype=False)
        if position_ids.shape[1] != seqlen or position_ids.shape[0] not in (1, batch):
            raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}; expected ({batch} or 1, "
                             f"{seqlen})")
        position_ids = position_ids.expand(batch, -1)
    out_dtype = torch.promote_types(q.dtype, torch.promote_types(cos.dtype, sin.dtype))
    q_out, k_out = _rotary_qk(last_dim_contiguous(q_), last_dim_contiguous(k_), cos, sin, None, position_ids, 0,
                              rotary_dim, rotary_dim // 2, False, False, out_dtype)
    return (q_out.transpose(1, 2), k_out.transpose(1, 2)) if u == 1 else (q_out, k_out)


def apply_rotary_emb_qk(q, k, cos, sin, interleaved=False, seqlen_offsets=0, position_ids=None):
    """``apply_rotary_emb`` on q and k in one launch (what ``flashfuse.nn.RotaryEmbedding`` calls).

    Shapes: q (batch, seqlen, nheads_q, headdim_q), k (batch, seqlen, nheads_k, headdim_k) (GQA: any
    head counts); cos, sin (seqlen_ro, rotary_dim / 2) or (batch, seqlen_ro, rotary_dim / 2). Options as
    in ``apply_rotary_emb`` (no varlen, no in place). Returns (q_rot, k_rot) in q's and k's dtype.

    Example::

        cos, sin = flashfuse.reference.rope.rotary_tables(128, 4096, device="cuda")
        q_rot, k_rot = apply_rotary_emb_qk(q, k, cos, sin, seqlen_offsets=past_len)
    """
    check_tensor("q", q, ndims=(4,))
    check_tensor("k", k, ndims=(4,))
    check_same(("q", "k"), (q, k))
    batch, seqlen = q.shape[:2]
    if tuple(k.shape[:2]) != (batch, seqlen):
        raise ValueError(f"q has shape {tuple(q.shape)} and k has {tuple(k.shape)}; they must agree in batch "
                         "and seqlen")
    cos, sin = _check_cos_sin(cos, sin, q, "q")
    rotary_dim = 2 * cos.shape[-1]
    _check_rotary_dim(rotary_dim, "2 * cos.shape[-1]", (("q", q.shape[-1]), ("k", k.shape[-1])))
    _check_batch(batch)
    if cos.dim() == 3 and cos.shape[0] != batch:
        raise ValueError(f"cos has shape {tuple(cos.shape)}: a per-sequence table needs {batch} rows in dim 0")
    offsets, offset = _check_positions(q, "q", cos, batch, seqlen, seqlen_offsets, position_ids)
    return _rotary_qk(last_dim_contiguous(q), last_dim_contiguous(k), cos, sin, offsets, position_ids, offset,
                      rotary_dim, 0, interleaved, False, q.dtype)
