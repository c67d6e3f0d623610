"""Rotary position embedding as a module: cached cos/sin tables + the fused q/k kernel."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..ops._triton import next_power_of_2
from ..ops.rope import apply_rotary_emb_qk


class RotaryEmbedding(nn.Module):
    """Rotary position embedding for q and k in (batch, seqlen, nheads, headdim) layout.

    Args:
        dim: rotary dim (even, <= headdim; features past it pass through: partial rotary).
        base: theta_i = position * base^(-2i / dim), as GPT-NeoX / Llama / flash-attn.
        interleaved: False = GPT-NeoX pairs (x[i], x[i + dim/2]); True = GPT-J (x[2i], x[2i + 1]).
        device: where inv_freq (and then the tables) live.

    forward(q, k, seqlen_offset=0, position_ids=None) -> (q_rot, k_rot), q (batch, seqlen, nheads_q,
    headdim), k (batch, seqlen, nheads_k, headdim), both rotated in one kernel launch, in their dtype:
    - seqlen_offset int: token s sits at position s + seqlen_offset, read from fp32 cos/sin tables cached
      on the module and grown on demand (in doublings, so a decode loop recomputes them O(log n) times);
    - seqlen_offset (batch,) integer tensor, or position_ids (batch, seqlen): the tables are computed for
      exactly those positions (no host sync to learn how far to grow, so it also works under
      torch.compile and CUDA graphs).

    Example::

        rope = RotaryEmbedding(128, device="cuda")
        q, k = rope(q, k)                          # prefill, positions 0..seqlen-1
        q1, k1 = rope(q1, k1, seqlen_offset=past)  # decode
    """

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False, device=None):
        super().__init__()
        if not isinstance(dim, int) or dim <= 0 or dim % 2 != 0:
            raise ValueError(f"dim is {dim!r}; supported: an even rotary dim >= 2")
        if not base > 0:
            raise ValueError(f"base is {base!r}; supported: a positive number")
        self.dim, self.base, self.interleaved = dim, float(base), bool(interleaved)
        inv_freq = 1.0 / (self.base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cos_cached: Tensor | None = None
        self._sin_cached: Tensor | None = None

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, interleaved={self.interleaved}"

    def _angles(self, positions: Tensor) -> Tensor:
        """positions (...) -> angles (..., dim / 2), fp32: position * inv_freq (one rounding, as HF)."""
        return positions.to(torch.float32)[..., None] * self.inv_freq.to(positions.device)

    def _tables(self, seqlen: int, device) -> tuple[Tensor, Tensor]:
        cached = self._cos_cached
        if cached is None or cached.shape[0] < seqlen or cached.device != torch.device(device):
            angles = self._angles(torch.arange(next_power_of_2(seqlen), device=device))
            self._cos_cached, self._sin_cached = angles.cos(), angles.sin()
        return self._cos_cached, self._sin_cached

    def forward(self, q: Tensor, k: Tensor, seqlen_offset=0, position_ids: Tensor | None = None):
        seqlen = q.shape[1] if q.dim() == 4 else 0
        if position_ids is None and not isinstance(seqlen_offset, Tensor):
            if not isinstance(seqlen_offset, int) or seqlen_offset < 0:
                raise ValueError(f"seqlen_offset is {seqlen_offset!r}; supported: an int >= 0 or a (batch,) "
                                 "integer tensor")
            with torch.no_grad():
                cos, sin = self._tables(seqlen_offset + seqlen, q.device)
            return apply_rotary_emb_qk(q, k, cos, sin, self.interleaved, seqlen_offsets=seqlen_offset)
        if position_ids is None:
            position_ids = seqlen_offset[:, None] + torch.arange(seqlen, device=q.device)
        elif isinstance(seqlen_offset, Tensor) or seqlen_offset != 0:
            raise ValueError("position_ids and seqlen_offset were both given; pass one of them")
        if (position_ids.dim() != 2 or position_ids.shape[1] != seqlen
                or position_ids.shape[0] not in (1, q.shape[0])):
            raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}; expected (batch or 1, "
                             f"{seqlen}) for q of shape {tuple(q.shape)}")
        with torch.no_grad():
            angles = self._angles(position_ids).expand(q.shape[0], -1, -1)   # (batch, seqlen, dim / 2)
            cos, sin = angles.cos(), angles.sin()
        return apply_rotary_emb_qk(q, k, cos, sin, self.interleaved)
