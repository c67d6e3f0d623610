"""Multi-GPU attention: ring (context-parallel) FlashAttention over a sequence sharded across ranks."""

from .ring_attention import ring_flash_attn_func, zigzag_shard, zigzag_unshard

__all__ = ["ring_flash_attn_func", "zigzag_shard", "zigzag_unshard"]
