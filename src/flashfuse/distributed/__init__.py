"""flashfuse across GPUs: ring (context-parallel) FlashAttention over a sequence sharded across ranks, and
context parallelism for transformers models (``context_parallel``), and
helpers to train patched models under DDP / FSDP2 (see docs/distributed.md)."""

from .context_parallelism import (context_parallel, context_parallel_positions, context_parallel_shard,
                               remove_context_parallel)
from .ring_attention import ring_flash_attn_func, zigzag_shard, zigzag_unshard
from .training import (NVLS_OFF_ENV, disable_nvlink_multicast, fully_shard_transformer, num_items_in_batch,
                       nvlink_multicast_off)

__all__ = ["context_parallel", "context_parallel_positions", "context_parallel_shard", "remove_context_parallel",
           "ring_flash_attn_func", "zigzag_shard", "zigzag_unshard", "NVLS_OFF_ENV", "disable_nvlink_multicast", "nvlink_multicast_off",
           "fully_shard_transformer", "num_items_in_batch"]
