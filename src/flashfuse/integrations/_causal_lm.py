"""The generic causal-LM forward that ``patch_transformers(cross_entropy=True)`` installs: in training with
labels, the base model up to the hidden states, then ``fused_linear_cross_entropy`` over a plain Linear
lm_head (the logits never exist); otherwise (inference, no labels, another head or loss function) HF's own
forward, unchanged."""

from __future__ import annotations

import dataclasses
import functools
import inspect

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.cross_entropy import fused_linear_cross_entropy


def _make_causal_lm_forward(original, softcap_attr, loss_mapping):
    """The generic forward, to bind to a model as a method (a bound method deep-copies with its model). The
    signature is read once here, not per call, which keeps the call path plain Python for torch.compile;
    ``functools.wraps`` keeps ``inspect.signature(model.forward)`` equal to HF's (``generate`` validates its
    kwargs against it)."""
    signature = inspect.signature(original)
    positional = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ][1:]  # drop self
    output_cls = signature.return_annotation
    output_fields = [f.name for f in dataclasses.fields(output_cls) if f.name not in ("loss", "logits")]
    causal_lm_loss = loss_mapping["ForCausalLM"]

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if len(args) > len(positional):
            raise TypeError(f"{type(self).__name__}.forward takes {len(positional)} positional arguments")
        arguments = dict(zip(positional, args))
        duplicated = arguments.keys() & kwargs.keys()
        if duplicated:
            raise TypeError(f"{type(self).__name__}.forward got multiple values for {sorted(duplicated)}")
        arguments.update(kwargs)
        # HF computes a loss only when `labels` is given (`shift_labels`, if also given, then replaces the shift)
        # ... and the head must be a plain Linear, whose weight is all there is to it (not a LoRA / quantized one)
        head = self.get_output_embeddings()
        fused = self.training and arguments.get("labels") is not None and type(head) is nn.Linear
        if not fused or _loss_function(self, loss_mapping) is not causal_lm_loss:
            return original(self, *args, **kwargs)

        labels = arguments.pop("labels", None)
        logits_to_keep = arguments.pop("logits_to_keep", 0)
        return_dict = arguments.pop("return_dict", None)  # as transformers' @can_return_tuple
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        # Everything else goes to the base model, as HF's forward passes its **kwargs on.
        outputs = getattr(self, self.base_model_prefix)(**arguments)
        hidden = _slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        loss = _causal_lm_loss(
            hidden,
            head.weight,
            getattr(head, "bias", None),
            labels,
            softcap=getattr(self.config, softcap_attr, None) if softcap_attr else None,
            shift_labels=arguments.get("shift_labels"),
            ignore_index=arguments.get("ignore_index", -100),
            num_items_in_batch=arguments.get("num_items_in_batch"),
        )
        fields = {name: getattr(outputs, name, None) for name in output_fields}
        output = output_cls(loss=loss, logits=None, **fields)
        return output if return_dict else output.to_tuple()

    return forward


def _loss_function(model, loss_mapping):
    """PreTrainedModel.loss_function without its warning for an unset loss_type (GPT-2's), which breaks
    torch.compile(fullgraph=True): the user's override, else the loss of model.loss_type, else ForCausalLMLoss."""
    override = getattr(model, "_loss_function", None)
    if override is not None:
        return override
    return loss_mapping.get(getattr(model, "loss_type", None), loss_mapping["ForCausalLM"])


def _slice_logits_to_keep(hidden: torch.Tensor, logits_to_keep) -> torch.Tensor:
    """transformers' slice of the positions whose logits are wanted: an int keeps the last n (0: all), a 1-D
    tensor holds positions, a 2-D integer tensor positions per sample, a 2-D bool tensor a mask."""
    if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.ndim == 2:
        if logits_to_keep.dtype == torch.bool:
            return hidden[logits_to_keep]
        return torch.take_along_dim(hidden, logits_to_keep[..., None], dim=1)
    if isinstance(logits_to_keep, int):
        logits_to_keep = slice(-logits_to_keep, None)
    return hidden[:, logits_to_keep, :]


def _causal_lm_loss(hidden, weight, bias, labels, softcap, shift_labels, ignore_index, num_items_in_batch):
    """transformers' ForCausalLMLoss on hidden states: tokens < n predict n (labels padded with ignore_index on
    the right, or `shift_labels` as given), mean over the non-ignored tokens, or sum / num_items_in_batch."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    hidden = hidden.reshape(-1, hidden.shape[-1])
    shift_labels = shift_labels.reshape(-1).to(hidden.device)
    if shift_labels.numel() != hidden.shape[0]:
        raise ValueError(
            f"labels: {shift_labels.numel()} label positions for {hidden.shape[0]} hidden positions (after "
            "logits_to_keep); they must match"
        )
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = fused_linear_cross_entropy(
        hidden, weight, shift_labels, ignore_index=ignore_index, reduction=reduction, softcap=softcap, bias=bias
    )
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss
