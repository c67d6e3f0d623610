"""Cross-entropy in plain PyTorch, readable like a textbook. Tests and benchmarks compare the Triton
kernel in ``ops/cross_entropy.py`` with these (autograd through them gives the reference gradients).

For one row of logits l (V classes) and its label y:

    z      = softcap * tanh(l / softcap)                 (Gemma 2's final logit softcapping; or z = l)
    log p  = z - logsumexp(z)                            (log-softmax)
    nll    = -log p_y
    smooth = -(1 / V) sum_c log p_c                      (cross-entropy against the uniform distribution)
    loss   = (1 - eps) * nll + eps * smooth              (eps = label_smoothing)

A row whose label is ignore_index has loss 0. Reductions: "sum" adds the rows, "mean" divides that sum
by the number of rows that are not ignored (0 / 0 = nan when all are), "none" keeps one loss per row.
This is exactly torch.nn.functional.cross_entropy(z, y, ignore_index=..., reduction=...,
label_smoothing=...); it is written out here so the formula the kernel implements can be read.

The fused linear version is the same loss on logits = hidden @ weight^T + bias.
"""

from __future__ import annotations

import torch


def cross_entropy_ref(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                      reduction: str = "mean", label_smoothing: float = 0.0, softcap=None) -> torch.Tensor:
    """logits (..., V), labels (...) -> loss: a scalar ("mean", "sum") or labels-shaped ("none").
    Computes in the logits' dtype promoted to at least fp32 (pass float64 for a reference)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    vocab = z.shape[-1]
    log_p = z - torch.logsumexp(z, dim=-1, keepdim=True)               # (..., V)
    keep = labels != ignore_index                                      # (...)
    safe_labels = torch.where(keep, labels, 0).long()
    nll = -log_p.gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)     # (...)
    smooth = -log_p.sum(-1) / vocab                                    # (...)
    loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    loss = torch.where(keep, loss, torch.zeros_like(loss))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / keep.sum()


def fused_linear_cross_entropy_ref(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                   ignore_index: int = -100, reduction: str = "mean",
                                   label_smoothing: float = 0.0, softcap=None, bias=None) -> torch.Tensor:
    """hidden (..., H), weight (V, H), bias (V,) or None: the loss of the full (materialized) logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return cross_entropy_ref(logits, labels, ignore_index, reduction, label_smoothing, softcap)
