"""Loss modules (drop-ins for LLM training loops)."""

from __future__ import annotations

import torch

from ..ops.cross_entropy import fused_linear_cross_entropy


class FusedLinearCrossEntropyLoss(torch.nn.Module):
    """cross_entropy(hidden @ weight^T + bias, labels) without materializing the logits.

    forward(hidden, weight, labels, bias=None): hidden (N, H) or (batch, seqlen, H); weight (V, H) (pass
    the lm_head's weight, e.g. ``model.lm_head.weight``); labels (N,) or (batch, seqlen) int64/int32,
    already shifted for causal LM (this module does not shift). Returns an fp32 scalar for "mean"/"sum",
    fp32 labels-shaped losses for "none". Options as torch.nn.CrossEntropyLoss, plus softcap (Gemma 2's
    final_logit_softcapping). No parameters: the weight belongs to the model.

    Example::

        loss_fn = FusedLinearCrossEntropyLoss(ignore_index=-100)
        loss = loss_fn(hidden[:, :-1], model.lm_head.weight, input_ids[:, 1:])
    """

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 softcap: float | None = None):
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.softcap = softcap

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        return fused_linear_cross_entropy(hidden, weight, labels, ignore_index=self.ignore_index,
                                          reduction=self.reduction, label_smoothing=self.label_smoothing,
                                          softcap=self.softcap, bias=bias)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, softcap={self.softcap}")
