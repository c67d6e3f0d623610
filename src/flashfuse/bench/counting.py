"""FLOP and byte counts that turn a suite's timings into TFLOP/s and GB/s (re-exported by ``harness``)."""

from __future__ import annotations


def attention_flops(batch, nheads, seqlen_q, seqlen_k, headdim, causal=False, mode="fwd") -> float:
    """flash-attn's convention: forward 4*B*H*Sq*Sk*D (two matmuls), x0.5 causal, backward 2.5x forward."""
    fwd = 4.0 * batch * nheads * seqlen_q * seqlen_k * headdim * (0.5 if causal else 1.0)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd}[mode]


def attention_bytes(batch, nheads, seqlen_q, seqlen_k, headdim, elem_size, mode="fwd") -> float:
    """Each input read once, each output written once: fwd q,k,v -> o; bwd q,k,v,o,do -> dq,dk,dv."""
    q = batch * nheads * seqlen_q * headdim * elem_size
    kv = batch * nheads * seqlen_k * headdim * elem_size
    fwd, bwd = 2 * q + 2 * kv, 4 * q + 4 * kv
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def elementwise_bytes(numel: int, elem_size: int, n_inputs: int, n_outputs: int = 1) -> float:
    return float(numel * elem_size * (n_inputs + n_outputs))
