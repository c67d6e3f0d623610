"""``FlashfuseAttnProcessor``: diffusers' attention processors on flashfuse's attention kernels (used by
``patch_diffusers``; importing this module does not import diffusers)."""

from __future__ import annotations

import torch

from .._checks import FLOAT_DTYPES
from .._env import INTERPRET
from ..ops.attention.interface import flash_attn_func, scaled_dot_product_attention

_MAX_HEAD_DIM = 256  # flashfuse attention's head-dim limit


def _kernel_ok(t: torch.Tensor) -> bool:
    """Whether flashfuse's kernels take t: a float16/bfloat16/float32 CUDA tensor (any CPU tensor in the
    interpreter)."""
    return t.dtype in FLOAT_DTYPES and (t.is_cuda or INTERPRET)


def _rescale(x: torch.Tensor, factor) -> torch.Tensor:
    """x / factor, without a kernel for diffusers' usual factor 1.0 (x / 1.0 == x exactly)."""
    return x if factor == 1 else x / factor


class FlashfuseAttnProcessor:
    """Attention processor on flashfuse's kernels, with the contract of diffusers' ``AttnProcessor2_0``
    (``legacy=False``: softmax scale 1/sqrt(head_dim), norm_q / norm_k applied) or ``AttnProcessor``
    (``legacy=True``: softmax scale ``attn.scale``, no qk norms, additive float masks only).

    ``original`` is the processor it stands in for: inputs no kernel takes go to it, and `unpatch_diffusers`
    puts it back. Example::

        attn.set_processor(FlashfuseAttnProcessor(attn.processor))
    """

    def __init__(self, original=None, legacy: bool = False):
        if original is None:
            from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

            original = AttnProcessor() if legacy else AttnProcessor2_0()
        self.original = original
        self.legacy = legacy

    def _runs_original(self, attn, hidden_states, attention_mask, args, kwargs) -> bool:
        if args or kwargs.get("scale") is not None or not _kernel_ok(hidden_states):
            return True
        if attn.to_k is None or attn.to_out is None:
            return True
        head_dim = attn.to_k.out_features // attn.heads
        if head_dim > _MAX_HEAD_DIM or (attn.to_q.out_features // attn.heads) != head_dim:
            return True
        return attention_mask is not None and self.legacy and not attention_mask.is_floating_point()

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        if self._runs_original(attn, hidden_states, attention_mask, args, kwargs):
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)
        input_ndim = hidden_states.ndim
        if input_ndim == 4:
            batch_size, channel, height, width = hidden_states.shape
            hidden_states = hidden_states.view(batch_size, channel, height * width).transpose(1, 2)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            # (batch * heads, seqlen_q or 1, seqlen_k) -> (batch, heads, seqlen_q or 1, seqlen_k)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)

        query = attn.to_q(hidden_states)
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        elif attn.norm_cross:
            encoder_hidden_states = attn.norm_encoder_hidden_states(encoder_hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)

        head_dim = key.shape[-1] // attn.heads
        # (batch, seq, heads, head_dim): views of the projections, the layout flash_attn_func reads in place
        query = query.view(batch_size, -1, attn.heads, head_dim)
        key = key.view(batch_size, -1, attn.heads, head_dim)
        value = value.view(batch_size, -1, attn.heads, head_dim)
        if not self.legacy:  # norms over head_dim: the same on (b, s, h, d) as on diffusers' (b, h, s, d)
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
        scale = attn.scale if self.legacy else None
        if attention_mask is None:
            hidden_states = flash_attn_func(query, key, value, softmax_scale=scale)
        else:
            hidden_states = scaled_dot_product_attention(
                query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=attention_mask,
                scale=scale,
            ).transpose(1, 2)  # (b, h, s, d) transposed view of a (b, s, h, d) buffer
        hidden_states = hidden_states.reshape(batch_size, -1, attn.heads * head_dim).to(query.dtype)

        hidden_states = attn.to_out[0](hidden_states)  # linear proj
        hidden_states = attn.to_out[1](hidden_states)  # dropout
        if input_ndim == 4:
            hidden_states = hidden_states.transpose(-1, -2).reshape(batch_size, channel, height, width)
        if attn.residual_connection:
            hidden_states = hidden_states + residual
        return _rescale(hidden_states, attn.rescale_output_factor)
