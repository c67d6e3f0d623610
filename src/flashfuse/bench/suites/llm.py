"""``llm``: the transformer-block kernels (norms, RoPE, GLU, fused linear, fused linear cross entropy) against
PyTorch eager, torch.compile of the same eager code, and Liger-Kernel, all in one run.

Every op is one entry of ``OPS``: how to make its inputs, its eager PyTorch form (also the reference, run on
inputs upcast to fp32 on the GPU / fp64 on the CPU, and what torch.compile compiles), the flashfuse and
Liger calls, and its work: bytes for the memory-bound ops (each input read once, each output written once;
the backward reads x and dy and writes dx), FLOPs for the matmul ones. Shapes are the protocol's
(BENCHMARKING.md): norms (16384, 4096) and (32768, 8192); RoPE and GLU at Llama-3-8B sizes over 16384 tokens;
the 4096 x 4096 -> 16384 GELU MLP of the issue; cross entropy at Llama-3's vocab 128256 over 8192 tokens.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F

from ._ops import Op, OpSuite, flashfuse_op, liger


# ----------------------------------------------------------------------------------------------------
# Eager forms (the references too)
# ----------------------------------------------------------------------------------------------------

def rms_norm_eager(x, w, eps=1e-6):
    """HF LlamaRMSNorm: statistics in fp32, cast to x's dtype, then the weight."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def add_rms_norm_eager(x, r, w, eps=1e-6):
    s = x + r
    return rms_norm_eager(s, w, eps), s


def layer_norm_eager(x, w, b, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], w, b, eps)


def rope_eager(q, k, cos, sin):
    """HF apply_rotary_pos_emb: q, k (B, H, S, D); cos, sin (B, S, D) with duplicated halves."""
    def rotate_half(t):
        t1, t2 = t.chunk(2, dim=-1)
        return torch.cat((-t2, t1), dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def swiglu_eager(gate, up):
    return F.silu(gate) * up


def geglu_eager(gate, up):
    return F.gelu(gate, approximate="tanh") * up


def linear_gelu_eager(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def linear_swiglu_eager(x, w_gate, w_up):
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


def flce_eager(h, w, labels):
    """What HF's causal-LM head does: the full logits, upcast to fp32, then cross entropy."""
    logits = F.linear(h, w)
    return F.cross_entropy(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, labels)


# ----------------------------------------------------------------------------------------------------
# The ops
# ----------------------------------------------------------------------------------------------------

def _rows(p, dtype, device):
    return (torch.randn(p["M"], p["N"], device=device, dtype=dtype),)


def _norm_inputs(p, dtype, device):
    x = torch.randn(p["M"], p["N"], device=device, dtype=dtype)
    return x, 1.0 + 0.1 * torch.randn(p["N"], device=device, dtype=dtype)


def _add_norm_inputs(p, dtype, device):
    x, w = _norm_inputs(p, dtype, device)
    return x, torch.randn_like(x), w


def _ln_inputs(p, dtype, device):
    x, w = _norm_inputs(p, dtype, device)
    return x, w, 0.1 * torch.randn_like(w)


def _rope_inputs(p, dtype, device):
    """q, k as HF holds them (views of (B, S, H, D)) and the position ids; the cos/sin tables are no
    differentiable input, so they are built from the positions outside the timed call (``_rope_tables``)."""
    B, S, Hq, Hk, D = p["B"], p["S"], p["Hq"], p["Hk"], p["D"]
    q = torch.randn(B, S, Hq, D, device=device, dtype=dtype).transpose(1, 2)
    k = torch.randn(B, S, Hk, D, device=device, dtype=dtype).transpose(1, 2)
    return q, k, torch.arange(S, device=device).expand(B, S)


def _rope_tables(q, k, position_ids):
    """HF LlamaRotaryEmbedding (theta 500000): cos/sin (B, S, D) with duplicated halves, in q's dtype."""
    D = q.shape[-1]
    with torch.no_grad():
        inv_freq = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=q.device, dtype=torch.float64) / D))
        freqs = position_ids[..., None].double() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return q, k, emb.cos().to(q.dtype), emb.sin().to(q.dtype)


def _glu_inputs(p, dtype, device):
    return tuple(torch.randn(p["M"], p["N"], device=device, dtype=dtype) for _ in range(2))


def _linear_inputs(p, dtype, device):
    x = torch.randn(p["M"], p["K"], device=device, dtype=dtype)
    w = torch.randn(p["N"], p["K"], device=device, dtype=dtype) / math.sqrt(p["K"])
    return x, w, 0.1 * torch.randn(p["N"], device=device, dtype=dtype)


def _gated_inputs(p, dtype, device):
    x = torch.randn(p["M"], p["K"], device=device, dtype=dtype)
    return (x,) + tuple(torch.randn(p["N"], p["K"], device=device, dtype=dtype) / math.sqrt(p["K"])
                        for _ in range(2))


def _flce_inputs(p, dtype, device):
    h = torch.randn(p["M"], p["K"], device=device, dtype=dtype)
    w = torch.randn(p["V"], p["K"], device=device, dtype=dtype) / math.sqrt(p["K"])
    labels = torch.randint(0, p["V"], (p["M"],), device=device)
    labels[::7] = -100       # some ignored positions (padding / prompt tokens), as in real batches
    return h, w, labels


def _linear_flops(p, mode):
    fwd = 2.0 * p["M"] * p["N"] * p["K"] * p.get("gates", 1)
    return fwd * (3 if mode == "fwd+bwd" else 1)


def _flce_flops(p, mode):
    fwd = 2.0 * p["M"] * p["V"] * p["K"]
    return fwd * (3 if mode == "fwd+bwd" else 1)


def _linear_swiglu_ff(x, w_gate, w_up):
    from flashfuse.ops.matmul import linear
    return linear(x, w_gate, activation="swiglu", up_weight=w_up)


def _rms_norm_add_ff(x, r, w):
    from flashfuse.ops.norm import rms_norm
    return rms_norm(x, w, residual=r)


def _rope_numel(p):
    return p["B"] * p["S"] * (p["Hq"] + p["Hk"]) * p["D"]


def _fewer_tokens(p):
    """Matmul-like rows check on at most 1024 tokens (the fp32 reference at full size is slow)."""
    return dict(M=min(p["M"], 1024))


NORM_SHAPES = (dict(M=16384, N=4096), dict(M=32768, N=8192))
NORM_CPU = (dict(M=37, N=123),)
OPS: dict[str, Op] = {
    # x (M, N) -> y: fwd reads x, writes y (2); backward reads x and dy, writes dx (3 more).
    "rms_norm": Op(_norm_inputs, rms_norm_eager, flashfuse_op("norm", "rms_norm"), liger("liger_rms_norm", 1e-6, in_place=False),
                   NORM_SHAPES, NORM_CPU, traffic={"fwd": 2, "fwd+bwd": 5}),
    # x + r -> (y, s): reads 2, writes 2; backward reads s, dy, ds, writes dx (one tensor serves dx and dr).
    "add_rms_norm": Op(_add_norm_inputs, add_rms_norm_eager, _rms_norm_add_ff,
                       liger("liger_fused_add_rms_norm", 1e-6, in_place=False), NORM_SHAPES[:1], NORM_CPU,
                       traffic={"fwd": 4, "fwd+bwd": 8}),
    "layer_norm": Op(_ln_inputs, layer_norm_eager, flashfuse_op("norm", "layer_norm"), liger("liger_layer_norm", 1e-5),
                     NORM_SHAPES, NORM_CPU, traffic={"fwd": 2, "fwd+bwd": 5}),
    # q and k read and written once (cos/sin are 1/(Hq+Hk) of that and are not counted).
    "rope": Op(_rope_inputs, rope_eager, flashfuse_op("rope", "apply_rotary_pos_emb"), liger("liger_rope"),
               (dict(B=4, S=4096, Hq=32, Hk=8, D=128),), (dict(B=2, S=5, Hq=4, Hk=2, D=16),),
               traffic={"fwd": 2, "fwd+bwd": 4}, prepare=_rope_tables, numel=_rope_numel),
    # gate, up -> out: fwd reads 2 writes 1; backward reads gate, up, dout, writes dgate, dup.
    "swiglu": Op(_glu_inputs, swiglu_eager, flashfuse_op("glu", "swiglu"), liger("liger_swiglu"),
                 (dict(M=16384, N=14336),), (dict(M=37, N=123),), traffic={"fwd": 3, "fwd+bwd": 8}),
    "geglu_tanh": Op(_glu_inputs, geglu_eager, flashfuse_op("glu", "geglu", approximate="tanh"), liger("liger_geglu"),
                     (dict(M=16384, N=14336),), (dict(M=37, N=123),), traffic={"fwd": 3, "fwd+bwd": 8}),
    # The 4096 x 4096 -> 16384 GELU MLP up-projection, and Llama-3-8B's gated one.
    "linear_gelu": Op(_linear_inputs, linear_gelu_eager, flashfuse_op("matmul", "linear", activation="gelu_tanh"),
                      None, (dict(M=4096, K=4096, N=16384), dict(M=16384, K=4096, N=16384)),
                      (dict(M=37, K=45, N=29),), flops=_linear_flops, check=_fewer_tokens),
    "linear_swiglu": Op(_gated_inputs, linear_swiglu_eager, _linear_swiglu_ff, None,
                        (dict(M=8192, K=4096, N=14336, gates=2),), (dict(M=37, K=45, N=29, gates=2),),
                        flops=_linear_flops, check=_fewer_tokens),
    "flce": Op(_flce_inputs, flce_eager, flashfuse_op("cross_entropy", "fused_linear_cross_entropy"),
               liger("liger_fused_linear_cross_entropy"), (dict(M=8192, K=2048, V=128256),),
               (dict(M=37, K=24, V=131),), modes=("fwd+bwd",), flops=_flce_flops,
               check=_fewer_tokens),
}


class LLM(OpSuite):
    name = "llm"
    description = ("transformer-block kernels: RMSNorm/LayerNorm (+ residual add), RoPE, SwiGLU/GeGLU, fused "
                   "linear epilogues, fused linear cross entropy vs eager, torch.compile and Liger")
    eager_description = "PyTorch eager (HF's code)"
    ops = OPS
