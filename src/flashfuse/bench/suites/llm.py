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
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..harness import Case, Provider, Skip, Suite, dtype_name
from ..plots import Plot


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

def _liger(fn_name: str, *extra, **kwargs):
    """A Liger functional call; ``extra`` positional arguments go after the tensors (eps). Liger's norms
    default to writing dx over dy (in_place=True); the harness replays one dy, so they run out of place."""
    def call(*args):
        try:
            import liger_kernel.transformers.functional as lf
        except ImportError as exc:
            raise Skip(f"liger-kernel is not installed ({exc})") from exc
        return getattr(lf, fn_name)(*args, *extra, **kwargs)
    return call


def _ff(module: str, name: str, **kwargs):
    def call(*args):
        import importlib
        return getattr(importlib.import_module(f"flashfuse.ops.{module}"), name)(*args, **kwargs)
    return call


@dataclass
class Op:
    """inputs(params, dtype, device) -> tensors; eager(*inputs); flashfuse / liger callables (None: none);
    bytes_per_elem(mode) -> bytes moved in units of (numel of the main tensor x element size)."""
    inputs: Callable
    eager: Callable
    flashfuse: Callable
    liger: Callable | None
    shapes: tuple
    cpu_shapes: tuple
    modes: tuple = ("fwd", "fwd+bwd")
    traffic: dict | None = None          # mode -> multiple of the main tensor's bytes (memory-bound ops)
    flops: Callable | None = None        # (params, mode) -> FLOPs (matmul ops)
    prepare: Callable | None = None      # inputs -> call arguments, untimed (e.g. RoPE tables from positions)


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


NORM_SHAPES = (dict(M=16384, N=4096), dict(M=32768, N=8192))
NORM_CPU = (dict(M=37, N=123),)
OPS: dict[str, Op] = {
    # x (M, N) -> y: fwd reads x, writes y (2); backward reads x and dy, writes dx (3 more).
    "rms_norm": Op(_norm_inputs, rms_norm_eager, _ff("norm", "rms_norm"), _liger("liger_rms_norm", 1e-6, in_place=False),
                   NORM_SHAPES, NORM_CPU, traffic={"fwd": 2, "fwd+bwd": 5}),
    # x + r -> (y, s): reads 2, writes 2; backward reads s, dy, ds, writes dx (one tensor serves dx and dr).
    "add_rms_norm": Op(_add_norm_inputs, add_rms_norm_eager, _ff("norm", "rms_norm_add"),
                       _liger("liger_fused_add_rms_norm", 1e-6, in_place=False), NORM_SHAPES[:1], NORM_CPU,
                       traffic={"fwd": 4, "fwd+bwd": 8}),
    "layer_norm": Op(_ln_inputs, layer_norm_eager, _ff("norm", "layer_norm"), _liger("liger_layer_norm", 1e-5),
                     NORM_SHAPES, NORM_CPU, traffic={"fwd": 2, "fwd+bwd": 5}),
    # q and k read and written once (cos/sin are 1/(Hq+Hk) of that and are not counted).
    "rope": Op(_rope_inputs, rope_eager, _ff("rope", "apply_rotary_pos_emb"), _liger("liger_rope"),
               (dict(B=4, S=4096, Hq=32, Hk=8, D=128),), (dict(B=2, S=5, Hq=4, Hk=2, D=16),),
               traffic={"fwd": 2, "fwd+bwd": 4}, prepare=_rope_tables),
    # gate, up -> out: fwd reads 2 writes 1; backward reads gate, up, dout, writes dgate, dup.
    "swiglu": Op(_glu_inputs, swiglu_eager, _ff("glu", "swiglu"), _liger("liger_swiglu"),
                 (dict(M=16384, N=14336),), (dict(M=37, N=123),), traffic={"fwd": 3, "fwd+bwd": 8}),
    "geglu_tanh": Op(_glu_inputs, geglu_eager, _ff("glu", "geglu", approximate="tanh"), _liger("liger_geglu"),
                     (dict(M=16384, N=14336),), (dict(M=37, N=123),), traffic={"fwd": 3, "fwd+bwd": 8}),
    # The 4096 x 4096 -> 16384 GELU MLP up-projection, and Llama-3-8B's gated one.
    "linear_gelu": Op(_linear_inputs, linear_gelu_eager, _ff("matmul", "linear", activation="gelu_tanh"),
                      None, (dict(M=4096, K=4096, N=16384), dict(M=16384, K=4096, N=16384)),
                      (dict(M=37, K=45, N=29),), flops=_linear_flops),
    "linear_swiglu": Op(_gated_inputs, linear_swiglu_eager, None, None,
                        (dict(M=8192, K=4096, N=14336, gates=2),), (dict(M=37, K=45, N=29, gates=2),),
                        flops=_linear_flops),
    "flce": Op(_flce_inputs, flce_eager, _ff("cross_entropy", "fused_linear_cross_entropy"),
               _liger("liger_fused_linear_cross_entropy"), (dict(M=8192, K=2048, V=128256),),
               (dict(M=37, K=24, V=131),), modes=("fwd+bwd",), flops=_flce_flops),
}


def _linear_swiglu_ff(x, w_gate, w_up):
    from flashfuse.ops.matmul import linear
    return linear(x, w_gate, activation="swiglu", up_weight=w_up)


def _rms_norm_add_ff(x, r, w):
    from flashfuse.ops.norm import rms_norm
    return rms_norm(x, w, residual=r)


OPS["linear_swiglu"].flashfuse = _linear_swiglu_ff
OPS["add_rms_norm"].flashfuse = _rms_norm_add_ff


# ----------------------------------------------------------------------------------------------------
# Providers
# ----------------------------------------------------------------------------------------------------

_COMPILED: dict = {}


def _provider(which: str):
    def factory(case: Case, *inputs):
        op = OPS[case.params["op"]]
        if op.prepare is not None:
            inputs = op.prepare(*inputs)
        if which == "eager":
            fn = op.eager
        elif which == "compile":
            if op.eager not in _COMPILED:
                import torch._functorch.config
                torch._functorch.config.donated_buffer = False    # the harness replays one backward graph
                _COMPILED[op.eager] = torch.compile(op.eager, dynamic=False)
            fn = _COMPILED[op.eager]
        else:
            fn = op.flashfuse if which == "flashfuse" else op.liger
            if fn is None:
                raise Skip(f"no {which} implementation of {case.params['op']}")
        return lambda: fn(*inputs)
    return factory


class LLM(Suite):
    name = "llm"
    description = ("transformer-block kernels: RMSNorm/LayerNorm (+ residual add), RoPE, SwiGLU/GeGLU, fused "
                   "linear epilogues, fused linear cross entropy vs eager, torch.compile and Liger")
    baseline = "eager"
    metric = "gbps"
    plots = (Plot("pct_ceiling", "% of the ceiling (copy bandwidth or bf16 matmul)", "pct_ceiling", logx=False),
             Plot("speedup", "speedup vs eager PyTorch (x)", "speedup", logx=False),
             Plot("peak_mem_MiB", "peak memory beyond inputs (MiB)", "memory", logx=False))

    def providers(self, opts):
        return [
            Provider("flashfuse", _provider("flashfuse"), kind="flashfuse", description="flashfuse.ops.*"),
            Provider("eager", _provider("eager"), kind="baseline", description="PyTorch eager (HF's code)"),
            Provider("compile", _provider("compile"), needs_cuda=True,
                     description="torch.compile of the eager code, dynamic=False"),
            Provider("liger", _provider("liger"), needs_cuda=True, description="Liger-Kernel functional API"),
        ]

    def cases(self, opts):
        cases = []
        for dtype in opts.dtypes or (torch.bfloat16,):
            for op_name, op in OPS.items():
                for shape in (op.shapes if opts.gpu else op.cpu_shapes):
                    if opts.quick and shape is not (op.shapes if opts.gpu else op.cpu_shapes)[0]:
                        continue
                    for mode in op.modes:
                        cases.append(self._case(op_name, op, shape, dtype, mode))
        return cases

    @staticmethod
    def _case(op_name, op, shape, dtype, mode) -> Case:
        params = dict(op=op_name, **shape)
        dims = "x".join(str(v) for k, v in shape.items() if k != "gates")
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = flops = None
        if op.traffic:
            main = shape["B"] * shape["S"] * (shape["Hq"] + shape["Hk"]) * shape["D"] if op_name == "rope" \
                else shape["M"] * shape["N"]
            nbytes = op.traffic[mode] * main * elem
        if op.flops:
            flops = op.flops(shape, mode)
        return Case(name=f"{op_name} {mode} {dims} {dtype_name(dtype)}", params=params, dtype=dtype, mode=mode,
                    flops=flops, bytes=nbytes, group=f"{op_name} {mode} {dtype_name(dtype)}",
                    x=float(shape.get("M", shape.get("S", 1))), ceiling="matmul" if flops else "copy")

    def make_inputs(self, case, device):
        return OPS[case.params["op"]].inputs(case.params, case.dtype, device)

    def reference(self, case, *inputs):
        op = OPS[case.params["op"]]
        return op.eager(*(op.prepare(*inputs) if op.prepare else inputs))

    def check_case(self, case):
        """Norm/GLU/RoPE rows check at full size (cheap); matmul-like ones on fewer tokens."""
        p = case.params
        if "M" in p and ("K" in p or "V" in p):
            return case.replace(M=min(p["M"], 1024))
        return case
