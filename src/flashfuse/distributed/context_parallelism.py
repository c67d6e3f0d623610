"""Context parallelism for Hugging Face transformers models: train on sequences longer than one GPU holds.

Each rank of a process group holds a shard of every sequence (zig-zag by default, as ``ring_flash_attn_func``);
the attention layers run ring attention over the group, everything else (embeddings, norms, MLPs, the loss) is
per token and runs on the local shard unchanged. Memory per GPU falls with the group size: activations are
(batch, S / world, hidden) per layer, and the ring moves K/V, never a (S, S) score matrix::

    dist.init_process_group("nccl")
    model = patch_transformers(LlamaForCausalLM(config).cuda())   # optional; patch first
    context_parallel(model)                                       # attention -> ring attention over the group
    fully_shard_transformer(model)                                # FSDP2 (or DDP) over the same ranks
    batch = context_parallel_shard(input_ids, labels, model=model)   # this rank's tokens and targets
    loss = model(**batch).loss                                    # its share of the global mean
    (loss * dist.get_world_size()).backward()                     # FSDP2 / DDP average over ranks: undo that

What ``context_parallel(model, group, layout)`` changes (``remove_context_parallel`` undoes it; the models it
supports and refuses are in its docstring and ``_check_supported``):

- the attention implementation becomes ``"ring_context_parallel"`` (registered with transformers'
  AttentionInterface and AttentionMaskInterface): ``ring_flash_attn_func`` with the layer's causal flag, sliding
  window (on global positions), softcap and scale; GQA natively. Its mask function builds no mask: the ring
  applies causality and windows itself. Padding is refused (a 2-D attention_mask with zeros raises
  ValueError), since every rank's shard must be a piece of one sequence per row;
- a forward pre-hook on the model supplies ``position_ids``: the global positions of the local tokens (zig-zag:
  chunks r and 2W-1-r), so RoPE rotates each token by its place in the whole sequence. Passing position_ids
  yourself raises ValueError (packed sequences are not supported: the ring's mask knows one sequence per row);
  so does passing ``labels`` without ``shift_labels`` (the model would shift labels inside the shard, pairing
  the last token of a chunk with the first of the next, which is not its successor) and passing a KV cache
  (``use_cache`` is set to False: training only).

``context_parallel_shard(input_ids, labels, group, layout)`` cuts the global batch: this rank's input_ids, the
globally shifted labels cut the same way (``shift_labels``; ``labels`` is the same tensor, as HF computes a loss
only when labels is given), and ``num_items_in_batch``, the global count of target tokens. The loss per rank is
then its sum over that global count; the sum over ranks is the mean over the whole batch, and FSDP2 / DDP's
gradient average is undone by the ``* world`` before backward (the data-parallel convention of
``flashfuse.distributed.training``). Without a wrapper, all-reduce (sum) the gradients yourself. When the
context-parallel group is a subgroup (context x data parallel, the wrapper averaging over all ranks), multiply
by the context-parallel group's size instead: each group's losses then add up to its batch's mean, and the
wrapper averages those means over the data-parallel groups (or all-reduce num_items_in_batch over the
data-parallel ranks and keep the world size, for the mean over all targets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .ring_attention import LAYOUTS, ring_flash_attn_func

__all__ = ["RING_NAME", "context_parallel", "remove_context_parallel", "context_parallel_shard",
           "context_parallel_positions"]

# The attention implementation name registered with transformers. Without "flash" in it: transformers treats such
# names as flash-attention kernels (hub loading; models listing _compatible_flash_implementations swap in their own).
RING_NAME = "ring_context_parallel"


# ----------------------------------------------------------------------------------------------------
# Sharding a global batch
# ----------------------------------------------------------------------------------------------------

def _group_rank_world(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"group is {group!r} but torch.distributed is not initialised; call "
                         "torch.distributed.init_process_group(...) first (context parallelism needs a process group)")
    return dist.get_rank(group), dist.get_world_size(group)


def _check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout is {layout!r}; supported: 'zigzag' or 'contiguous'")


def _shard(x: torch.Tensor, rank: int, world: int, layout: str) -> torch.Tensor:
    """(batch, S, ...) -> this rank's (batch, S / world, ...) along dim 1."""
    if layout == "contiguous":
        return x.chunk(world, dim=1)[rank].contiguous()
    chunks = x.chunk(2 * world, dim=1)
    return torch.cat((chunks[rank], chunks[2 * world - 1 - rank]), dim=1)


def context_parallel_positions(local_len: int, rank: int, world: int, layout: str = "zigzag",
                               device=None) -> torch.Tensor:
    """The global positions (local_len,) int64 of rank ``rank``'s tokens: zig-zag chunks rank and
    2 * world - 1 - rank of local_len / 2 tokens each, or contiguous [rank * local_len, (rank + 1) * local_len)."""
    _check_layout(layout)
    if layout == "contiguous":
        return torch.arange(rank * local_len, (rank + 1) * local_len, device=device)
    if local_len % 2:
        raise ValueError(f"the local sequence has {local_len} tokens; the zig-zag layout needs an even number "
                         "(two chunks per rank): make the global length a multiple of 2 * world_size")
    c = local_len // 2
    first = torch.arange(rank * c, (rank + 1) * c, device=device)
    return torch.cat((first, first + (2 * world - 1 - 2 * rank) * c))


def context_parallel_shard(input_ids: torch.Tensor, labels: torch.Tensor | None = None, group=None,
                           layout: str | None = None, ignore_index: int = -100, model: nn.Module | None = None
                           ) -> dict:
    """This rank's part of a global batch for a ``context_parallel`` model.

    input_ids: (batch, S) the whole sequences, the same on every rank of ``group``; S a multiple of
        2 * world_size (zig-zag) or of world_size (contiguous).
    labels: (batch, S) unshifted, as HF takes them (token t's label is predicted at t - 1), or None (no loss).
    model: the ``context_parallel`` model the batch is for: the group and layout are taken from it (a layout or
        group given as well must agree). Without it: ``group`` (None: the default group) and ``layout``
        (None: "zigzag"), which must be the model's.
    ignore_index: the label of positions without a target (the pad of the last position and what is not
        counted); it must be the loss's (HF's causal-LM loss: -100).

    Returns a dict to pass as ``model(**batch)``: ``input_ids`` (batch, S / world); with labels also
    ``shift_labels`` (batch, S / world): the targets shifted over the WHOLE sequence (the last position gets
    ``ignore_index``), then sharded like the tokens; ``labels``, the same tensor (HF's forward computes a loss
    only when labels is given, and then uses shift_labels as they are); and ``num_items_in_batch``, the global
    number of targets (int64 tensor, no collective: every rank has the global batch).

    Example::

        batch = context_parallel_shard(ids, labels=ids)
        loss = model(**batch).loss            # sum over this rank's targets / all targets
    """
    if model is not None:
        state = getattr(model, "_flashfuse_context_parallel", None)
        if state is None:
            raise ValueError(f"model ({type(model).__name__}) is not context parallel; call context_parallel(model)")
        if layout is not None and layout != state.ring.layout:
            raise ValueError(f"layout is {layout!r} but the model is context parallel with layout "
                             f"{state.ring.layout!r}; leave layout=None to take the model's")
        if group is not None and group is not state.ring.group:
            raise ValueError("group is not the process group the model is context parallel over; leave "
                             "group=None to take the model's")
        layout, group = state.ring.layout, state.ring.group
    layout = "zigzag" if layout is None else layout
    _check_layout(layout)
    rank, world = _group_rank_world(group)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (batch, seqlen) tensor, got {type(input_ids).__name__} "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    seqlen = input_ids.shape[1]
    parts = 2 * world if layout == "zigzag" else world
    if seqlen % parts:
        raise ValueError(f"input_ids has {seqlen} tokens per sequence; layout {layout!r} on {world} ranks needs "
                         f"a multiple of {parts}: pad the batch (labels {ignore_index}) to a multiple")
    batch = {"input_ids": _shard(input_ids, rank, world, layout)}
    if labels is not None:
        if not isinstance(labels, torch.Tensor) or labels.shape != input_ids.shape:
            raise ValueError(f"labels must have input_ids' shape {tuple(input_ids.shape)}, got "
                             f"{tuple(getattr(labels, 'shape', ()))}")
        shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=ignore_index)
        local = _shard(shifted, rank, world, layout)
        batch.update(labels=local, shift_labels=local,
                     num_items_in_batch=(shifted != ignore_index).sum().to(torch.int64))
    return batch


# ----------------------------------------------------------------------------------------------------
# The attention and mask functions registered as RING_NAME
# ----------------------------------------------------------------------------------------------------

@dataclass
class _Ring:
    """What one context-parallel model's attention layers need (stored on each attention module)."""
    group: object
    layout: str


def ring_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask, scaling: float | None = None, dropout: float = 0.0,
                           sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers attention function of ``context_parallel`` models: ring attention over the module's group.

    query (batch, nheads_q, L, headdim), key / value (batch, nheads_k, L, headdim): this rank's L tokens, in
    transformers' layout. Returns ``(out (batch, L, nheads_q, headdim), None)``."""
    from ..integrations.hf_attention import _window

    ring = getattr(module, "_flashfuse_ring", None)
    if ring is None:
        raise RuntimeError(f"{type(module).__name__} runs attn_implementation={RING_NAME!r} but was not set up "
                           "by flashfuse.distributed.context_parallel(model): call it on the model")
    if attention_mask is not None:
        raise ValueError("context parallel attention got an attention mask; it supports unpadded sequences "
                         "(causal / sliding-window patterns only, applied by the ring itself)")
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("context parallel attention does not return attention weights")
    for name in ("s_aux", "position_bias"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"context parallel attention does not support {name} (this model needs it)")
    for name in ("cu_seq_lens_q", "cu_seq_lens_k", "cu_seqlens", "max_length_q", "max_length_k"):
        if kwargs.get(name) is not None:
            raise ValueError(f"context parallel attention got {name}: packed sequences are not supported (one "
                             "sequence per row; a packed row would attend across its documents)")
    if value.shape[-1] != query.shape[-1]:
        raise NotImplementedError(f"value head dim {value.shape[-1]} != query head dim {query.shape[-1]}: not "
                                  "supported by context parallel attention")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal = bool(is_causal)
    if sliding_window is None:          # some models (Qwen2-MoE) set it on the module and leave it to the mask
        sliding_window = getattr(module, "sliding_window", None)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))      # (batch, L, heads, headdim) views
    out = ring_flash_attn_func(q, k, v, group=ring.group, causal=causal, softmax_scale=scaling,
                               window_size=_window(sliding_window, causal),
                               softcap=0.0 if softcap is None else float(softcap), layout=ring.layout,
                               dropout_p=float(dropout))
    return out, None


def ring_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0, mask_function=None,
              attention_mask: torch.Tensor | None = None, local_size: int | None = None, config=None, **kwargs):
    """transformers mask function of "ring_context_parallel": never a mask (the ring applies causality and the window
    on global positions); a 2-D padding mask with zeros or a chunked-attention pattern raises."""
    if local_size is not None and local_size != getattr(config, "sliding_window", None):
        raise NotImplementedError(f"chunked attention (local_size={local_size}) is not supported by context "
                                  "parallel attention; sliding windows are")
    if attention_mask is not None and attention_mask.dim() == 2:
        if torch.compiler.is_compiling():
            raise ValueError("context parallel: pass attention_mask=None (padding is not supported)")
        if not bool(attention_mask[:, kv_offset:kv_offset + kv_length].all()):
            raise ValueError("context parallel: attention_mask has padding (zeros); every row must be one "
                             "unpadded sequence (pad labels with -100 instead and keep the tokens attended)")
    elif attention_mask is not None:
        raise ValueError(f"context parallel: got a {attention_mask.dim()}-D attention_mask; pass None or an "
                         "all-ones (batch, seqlen) mask")
    return None


def _register() -> None:
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(RING_NAME, ring_attention_forward)
    AttentionMaskInterface.register(RING_NAME, ring_mask)


# ----------------------------------------------------------------------------------------------------
# Installing and removing
# ----------------------------------------------------------------------------------------------------

@dataclass
class _State:
    ring: _Ring
    rank: int
    world: int
    previous_impl: str
    hook: object = None
    modules: list = field(default_factory=list)


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules that call transformers' attention interface: attention classes with a config."""
    return [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "config")]


# RoPE variants whose frequencies depend on the largest position in the call: each rank would see its own.
_POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")


def _rope_types(config) -> set:
    """Every rope_type named in the config's rope_parameters / rope_scaling (also per layer type)."""
    found = set()
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(config, name, None)
        if not isinstance(params, dict):
            continue
        for entry in [params, *(v for v in params.values() if isinstance(v, dict))]:
            kind = entry.get("rope_type", entry.get("type"))
            if isinstance(kind, str):
                found.add(kind)
    return found


def _check_supported(model: nn.Module) -> None:
    """Refuse what context parallelism would train silently wrong (ValueError / NotImplementedError)."""
    import inspect

    name = type(model).__name__
    if not hasattr(model, "set_attn_implementation"):
        raise ValueError(f"context_parallel takes a transformers PreTrainedModel, got {name}")
    if getattr(model, "_flashfuse_context_parallel", None) is not None:
        raise ValueError("context_parallel: the model is already context parallel (remove_context_parallel first)")
    if not getattr(model, "_supports_context_parallel", True):
        raise NotImplementedError(f"context_parallel: {name} declares it cannot run context parallel "
                                  "(_supports_context_parallel = False, e.g. attention sinks)")
    config = model.config.get_text_config()
    if config is not model.config:
        raise NotImplementedError(f"context_parallel: {name} is a composite (multimodal) model; only text models "
                                  "are supported (their vision towers would be sharded as if text)")
    layer_types = getattr(config, "layer_types", None) or ()
    other = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if other:
        raise NotImplementedError(f"context_parallel: {name} has {other} layers; only attention layers (full or "
                                  "sliding window) exchange the sequence across ranks (a recurrent or convolution "
                                  "layer would only see its rank's shard)")
    bad = sorted(_rope_types(config) & set(_POSITION_DEPENDENT_ROPE))
    if bad:
        raise NotImplementedError(f"context_parallel: rope_type {bad[0]!r} picks its frequencies from the largest "
                                  "position in the call, which differs per rank; supported: the position-"
                                  "independent types (default, linear, llama3, yarn, ...)")
    if "position_ids" not in inspect.signature(model.forward).parameters:
        raise ValueError(f"context_parallel: {name}.forward takes no position_ids (it numbers tokens from 0 on "
                         "every rank); supported: models whose forward accepts position_ids (Llama-style)")
    if not _attention_modules(model):
        raise ValueError(f"context_parallel: found no attention module (a class named *Attention with a config) "
                         f"in {name}")


def _pre_hook(state: _State):
    def hook(module, args, kwargs):
        impl = module.config._attn_implementation
        if impl != RING_NAME:
            raise ValueError(f"context parallel: the attention implementation is now {impl!r}, not {RING_NAME!r} "
                             "(set_attn_implementation or patch_transformers / unpatch_transformers after "
                             "context_parallel?): each rank would attend only to its shard. Call "
                             "remove_context_parallel, change the model, then context_parallel again")
        for name in ("position_ids", "cache_position"):
            if kwargs.get(name) is not None:
                raise ValueError(f"context parallel: do not pass {name}; the model gives each token its global "
                                 "position from the layout (packed sequences are not supported)")
        if kwargs.get("past_key_values") is not None:
            raise ValueError("context parallel: past_key_values given; context parallelism is for training "
                             "(no KV cache): pass use_cache=False or nothing")
        if kwargs.get("labels") is not None and kwargs.get("shift_labels") is None:
            raise ValueError("context parallel: labels without shift_labels would be shifted inside the shard; "
                             "pass context_parallel_shard(input_ids, labels)'s shift_labels too")
        if kwargs.get("shift_labels") is not None and kwargs.get("num_items_in_batch") is None:
            raise ValueError("context parallel: shift_labels without num_items_in_batch would average each rank's "
                             "targets on its own (ranks hold different counts); pass context_parallel_shard's "
                             "num_items_in_batch too")
        tokens = args[0] if args else kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        if tokens is None:
            raise ValueError("context parallel: pass input_ids or inputs_embeds")
        local_len = tokens.shape[1]
        positions = context_parallel_positions(local_len, state.rank, state.world, state.ring.layout,
                                               device=tokens.device)
        kwargs["position_ids"] = positions.unsqueeze(0).expand(tokens.shape[0], -1)
        kwargs["use_cache"] = False
        return args, kwargs
    return hook


def context_parallel(model: nn.Module, group=None, layout: str = "zigzag") -> nn.Module:
    """Make a transformers model train context-parallel over ``group`` (every rank holds a shard of each
    sequence; see the module docstring). In place; returns the model.

    model: a transformers PreTrainedModel (patched by ``patch_transformers`` or not: patch FIRST; before FSDP2 /
        DDP wrapping, or DDP's ``.module``). Supported: text models whose forward takes position_ids and whose
        layers are attention (full or sliding window) with a position-independent RoPE; anything else raises.
    group: the process group (None: the default group).
    layout: "zigzag" (balanced under a causal mask; the default) or "contiguous"; shard the batch with
        ``context_parallel_shard(..., model=model)`` (it takes the layout and group from the model).

    Example::

        context_parallel(model)
        loss = model(**context_parallel_shard(ids, labels=ids, model=model)).loss
    """
    _check_layout(layout)
    _check_supported(model)
    rank, world = _group_rank_world(group)
    _register()
    modules = _attention_modules(model)
    state = _State(ring=_Ring(group, layout), rank=rank, world=world,
                   previous_impl=model.config._attn_implementation, modules=modules)
    model.set_attn_implementation(RING_NAME)
    if model.config._attn_implementation != RING_NAME:     # transformers may keep another one (with a warning)
        impl = model.config._attn_implementation
        model.set_attn_implementation(state.previous_impl)
        raise NotImplementedError(f"context_parallel: {type(model).__name__} kept attention implementation "
                                  f"{impl!r} instead of {RING_NAME!r}; it cannot run ring attention")
    for m in modules:
        m._flashfuse_ring = state.ring
    state.hook = model.register_forward_pre_hook(_pre_hook(state), with_kwargs=True)
    model._flashfuse_context_parallel = state
    return model


def remove_context_parallel(model: nn.Module) -> nn.Module:
    """Undo ``context_parallel``: the previous attention implementation, no position hook. Returns the model."""
    state = getattr(model, "_flashfuse_context_parallel", None)
    if state is None:
        raise ValueError("remove_context_parallel: the model is not context parallel")
    state.hook.remove()
    for m in state.modules:
        del m._flashfuse_ring
    model.set_attn_implementation(state.previous_impl)
    del model._flashfuse_context_parallel
    return model
