"""Training a patched model with torch.distributed: DDP and FSDP2 (``torch.distributed.fsdp.fully_shard``).

flashfuse's ops take plain tensors; both wrappers hand them plain tensors, so a patched model trains under
either with nothing more than the order below (tests/test_distributed_training.py checks the losses, the first
step's gradients and the parameters after 3 AdamW steps against single-process training on the same global
batch)::

    disable_nvlink_multicast()                      # before init_process_group (children inherit os.environ)
    dist.init_process_group("nccl")
    model = LlamaForCausalLM(config).to(device)
    patch_transformers(model)                       # FIRST patch ...
    fully_shard_transformer(model)                  # ... THEN shard (or: model = DDP(model))
    n = num_items_in_batch(labels)                  # the global count of target tokens
    loss = model(ids, labels=labels, num_items_in_batch=n).loss
    (loss * dist.get_world_size()).backward()       # both wrappers average gradients over ranks

Order (found by running both, kept by the tests):

- FSDP2: ``patch_transformers`` must run BEFORE ``fully_shard``. fully_shard replaces each parameter by a
  sharded DTensor and remembers the module that owns it; before every forward it all-gathers the parameter and
  sets the plain, unsharded tensor on THAT module. patch_transformers swaps the norm modules for new flashfuse
  modules holding the same Parameter objects, so after fully_shard the new modules are not the ones FSDP
  updates: they would keep the sharded DTensor (the first norm failed with "got mixed torch.Tensor and
  DTensor"), so patch_transformers / unpatch_transformers refuse a sharded model with a ValueError.
  (The MLPs would survive, as the fused MLP keeps HF's own Linear children, but the norms do not.) For the same
  reason ``unpatch_transformers`` must not run on a sharded model. Patched first, every flashfuse op sees the
  unsharded plain tensors in forward and backward: no op needs to know about DTensor.
- DDP: either order works. DDP keeps references to the Parameter objects, which patching does not replace, and
  its gradient hooks sit on those parameters; patch ``ddp.module`` (the wrapper has no ``config``).
- FSDP2 granularity: shard per decoder layer or coarser, never a Linear on its own. The fused MLPs and the
  fused linear cross entropy read the weights of HF's Linear children (gate/up/down_proj, lm_head) without
  calling them, so the forward hook of a Linear sharded as its own unit never runs: an MLP projection stays a
  DTensor shard and the MLP fails ("aten.mm.default got mixed torch.Tensor and DTensor"); an lm_head sharded
  alone becomes an FSDPLinear, no longer a plain Linear, so the patched forward falls back to HF's loss (correct,
  but the (tokens, vocab) logits are materialized again). ``fully_shard_transformer`` keeps the lm_head in the
  root's unit.

Loss normalization: HF's causal-LM loss is the mean over a rank's non-ignored target tokens. Both wrappers
average gradients over ranks, which equals single-process training on the global batch only when every rank
holds the same number of target tokens. With padding or masked prompts pass ``num_items_in_batch`` (the global
count, `num_items_in_batch`) and multiply the loss by the world size before backward, as HF's Trainer does.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn

__all__ = ["NVLS_OFF_ENV", "disable_nvlink_multicast", "nvlink_multicast_off", "fully_shard_transformer",
           "num_items_in_batch"]

# NVLink SHARP (multicast objects on the NVSwitch) is used by NCCL's NVLS algorithms, torch's symmetric memory
# and NVSHMEM when they find it. On shared multi-GPU hosts a program using it can put the host's GPUs out of
# service for a long time, so these machines keep it off; each library reads its variable when it initializes.
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def disable_nvlink_multicast(environ=None) -> dict:
    """Set ``NVLS_OFF_ENV`` (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1) in
    ``environ`` (default ``os.environ``) and return it.

    Call it before ``torch.distributed.init_process_group`` (NCCL reads the variable when it creates a
    communicator). Processes started afterwards with ``multiprocessing`` (spawn or fork) or ``subprocess``
    without an ``env=`` inherit ``os.environ``; pass a child's own environment dict to set them there too.

    Example::

        disable_nvlink_multicast()
        subprocess.run(cmd, env=disable_nvlink_multicast(dict(os.environ, CUDA_VISIBLE_DEVICES="0,1")))
    """
    environ = os.environ if environ is None else environ
    environ.update(NVLS_OFF_ENV)
    return environ


@contextlib.contextmanager
def nvlink_multicast_off():
    """``disable_nvlink_multicast()`` for the ``with`` block only: processes spawned inside inherit NVLS_OFF_ENV;
    the caller's values of those variables are restored afterwards (set or unset as they were).

    Example::

        with nvlink_multicast_off():
            torch.multiprocessing.spawn(worker, nprocs=2)
    """
    saved = {k: os.environ.get(k) for k in NVLS_OFF_ENV}
    disable_nvlink_multicast()
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Modules of the classes HF lists in ``_no_split_modules`` (the decoder layers), outermost first."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def fully_shard_transformer(model: nn.Module, **fsdp_kwargs) -> nn.Module:
    """FSDP2 for a (patched) transformers model: one ``fully_shard`` unit per decoder layer, then the root.

    model: a transformers PreTrainedModel, already patched with ``patch_transformers`` (see the module
        docstring for why the patch comes first) and already on its device.
    fsdp_kwargs: passed to every ``fully_shard`` call (``mesh``, ``reshard_after_forward``, ``mp_policy``,
        ``offload_policy``, ...).

    The decoder layers are the modules whose class is in ``model._no_split_modules`` (``LlamaDecoderLayer``
    for Llama): each layer's parameters are all-gathered just before it runs and freed after (the peak holds
    one layer unsharded, not the model). The root unit holds the embeddings, the final norm and the lm_head:
    the fused cross entropy reads ``lm_head.weight`` directly, and tied embeddings share one parameter. Returns
    the model (fully_shard works in place).

    Example::

        model = patch_transformers(LlamaForCausalLM(config).cuda())
        fully_shard_transformer(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    sharded = [name for name, p in model.named_parameters() if isinstance(p, DTensor)]
    if sharded:
        raise ValueError(
            f"fully_shard_transformer: model already has DTensor parameters ({sharded[0]}, ...): shard it once, "
            "after patch_transformers(model)"
        )
    layers = _decoder_layers(model)
    if not layers:
        raise ValueError(
            f"fully_shard_transformer: {type(model).__name__} names no decoder-layer class in _no_split_modules "
            f"(got {getattr(model, '_no_split_modules', None)!r}); apply fully_shard to its layers yourself"
        )
    for layer in layers:
        fully_shard(layer, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    return model


def num_items_in_batch(labels: torch.Tensor, ignore_index: int = -100, group=None) -> torch.Tensor:
    """The number of target tokens of the causal-LM loss summed over the ranks of ``group`` (all-reduce).

    labels: (batch, seqlen) this rank's labels, unshifted, as passed to the model. The loss predicts token t+1
    from token t, so the targets are ``labels[:, 1:]`` (HF pads the shifted labels with ``ignore_index``). Pass
    the result as ``num_items_in_batch``: each rank's loss is then its sum over the global count, their sum is
    the global mean, and multiplying the loss by the world size before backward undoes the wrappers' gradient
    average. Returns an int64 tensor on the labels' device (one collective; no host sync).
    """
    import torch.distributed as dist

    if not isinstance(labels, torch.Tensor) or labels.dim() < 2:
        raise ValueError(f"labels must be a (batch, seqlen) tensor, got {type(labels).__name__} "
                         f"{tuple(getattr(labels, 'shape', ()))}")
    count = (labels[..., 1:] != ignore_index).sum().to(torch.int64)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, group=group)
    return count
