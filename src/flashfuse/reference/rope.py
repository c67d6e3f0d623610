"""Rotary position embedding (RoPE) in plain PyTorch, the textbook version the kernels are checked against.

A token at position p has its feature pairs (a_i, b_i), i < rotary_dim / 2, turned by the angle
theta_i = p * base^(-2i / rotary_dim):

    a'_i = a_i cos(theta_i) - b_i sin(theta_i)
    b'_i = b_i cos(theta_i) + a_i sin(theta_i)

Which features form a pair is the layout:
- GPT-NeoX ("half", interleaved=False): a_i = x[i], b_i = x[i + rotary_dim / 2];
- GPT-J (interleaved=True):              a_i = x[2i], b_i = x[2i + 1].
Features past rotary_dim pass through unchanged (partial rotary, e.g. Phi-3, GPT-NeoX's rotary_pct).

Two calling conventions are covered:
- flash-attn's ``apply_rotary_emb``: x (batch, seqlen, nheads, headdim) or varlen (total, nheads, headdim),
  cos/sin tables (seqlen_ro, rotary_dim / 2) [or (batch, seqlen_ro, rotary_dim / 2)] indexed by position;
- HF transformers' ``apply_rotary_pos_emb``: cos/sin (batch, seqlen, rotary_dim) already gathered per token,
  the two halves duplicated, applied as ``x * cos + rotate_half(x) * sin``.
"""

from __future__ import annotations

import torch


def rotary_tables(rotary_dim: int, seqlen: int, base: float = 10000.0, device=None):
    """cos, sin of shape (seqlen, rotary_dim / 2), fp32: row p holds cos/sin(p * base^(-2i / rotary_dim))."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim))
    angles = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """The partner of each feature with the sign of the rotation: (a, b) -> (-b, a) pair by pair."""
    if interleaved:
        a, b = x[..., ::2], x[..., 1::2]
        return torch.stack((-b, a), dim=-1).flatten(-2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rotate(x, cos, sin, interleaved):
    """x (..., headdim) with cos/sin (..., rotary_dim / 2) broadcastable: rotate the first rotary_dim."""
    rotary_dim = 2 * cos.shape[-1]
    if interleaved:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    else:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((x_rot * cos + rotate_half(x_rot, interleaved) * sin, x_pass), dim=-1)


def apply_rotary_emb_ref(x, cos, sin, interleaved=False, seqlen_offsets=0, cu_seqlens=None,
                         position_ids=None):
    """flash-attn's apply_rotary_emb, one sequence at a time. Computes in x's dtype (pass float64).

    The token at index s of sequence b sits at position ``position_ids[b, s]`` if given, else
    ``s + seqlen_offsets[b]`` (an int offset applies to every sequence). cos/sin rows are picked by
    position, from the shared table (seqlen_ro, rotary_dim / 2) or from sequence b's own table.
    """
    varlen = cu_seqlens is not None
    starts = cu_seqlens.tolist() if varlen else None
    batch = len(starts) - 1 if varlen else x.shape[0]
    out = []
    for b in range(batch):
        xb = x[starts[b]:starts[b + 1]] if varlen else x[b]                    # (seqlen_b, nheads, headdim)
        seqlen = xb.shape[0]
        if position_ids is not None:
            pos = position_ids[starts[b]:starts[b + 1]] if varlen else position_ids[b]
        else:
            offset = seqlen_offsets[b] if isinstance(seqlen_offsets, torch.Tensor) else seqlen_offsets
            pos = torch.arange(seqlen, device=x.device) + offset
        table_cos, table_sin = (cos[b], sin[b]) if cos.dim() == 3 else (cos, sin)
        c, s = table_cos[pos.long()].to(x.dtype), table_sin[pos.long()].to(x.dtype)  # (seqlen_b, rotary/2)
        out.append(_rotate(xb, c[:, None, :], s[:, None, :], interleaved))
    return torch.cat(out) if varlen else torch.stack(out)


def apply_rotary_pos_emb_ref(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """HF transformers' apply_rotary_pos_emb (Llama), with partial rotary split as Phi-3 does it.

    cos/sin (batch, seqlen, rotary_dim) (or a (max_positions, rotary_dim) table indexed by position_ids,
    as transformers < 4.38 did); rotary_dim = cos.shape[-1] <= headdim; the rest of headdim passes
    through. Output dtype follows torch's promotion of x and cos, as HF's expression gives.
    """
    if position_ids is not None and cos.dim() == 2:
        cos, sin = cos[position_ids], sin[position_ids]
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rotary_dim = cos.shape[-1]

    def embed(x):
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        y = x_rot * cos + rotate_half(x_rot) * sin
        return torch.cat((y, x_pass.to(y.dtype)), dim=-1)

    return embed(q), embed(k)
