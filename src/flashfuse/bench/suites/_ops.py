"""What the op suites (``llm``, ``diffusion``) share: an op is one ``Op`` entry of a table, and ``OpSuite``
turns a table into cases and providers.

An ``Op`` says how to make its inputs, its eager PyTorch form (also the reference, run on inputs upcast to
fp32 on the GPU / fp64 on the CPU, and what torch.compile compiles), the flashfuse call and, where one
exists, the Liger call, and its work: bytes for the memory-bound ops (a multiple of the main tensor: each
input read once, each output written once), FLOPs for the matmul ones.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from ..harness import Case, Provider, Skip, Suite, allow_recompiles, dtype_name
from ..plots import Plot


@dataclass
class Op:
    inputs: Callable                     # (params, dtype, device) -> tensors
    eager: Callable                      # (*call args) -> output(s): the reference and torch.compile's input
    flashfuse: Callable | None
    liger: Callable | None
    shapes: tuple                        # GPU shapes (dicts of params); --quick takes the first
    cpu_shapes: tuple                    # interpreter shapes
    modes: tuple = ("fwd", "fwd+bwd")
    traffic: dict | None = None          # mode -> multiple of the main tensor's bytes (memory-bound ops)
    flops: Callable | None = None        # (params, mode) -> FLOPs (matmul ops)
    prepare: Callable | None = None      # inputs -> call arguments, untimed (e.g. RoPE tables from positions)
    numel: Callable | None = None        # params -> elements of the main tensor (default M x N)
    check: Callable | None = None        # params -> params of the reduced correctness-check copy


def liger(fn_name: str, *extra, **kwargs):
    """A Liger functional call; ``extra`` positional arguments go after the tensors (eps). Liger's norms
    default to writing dx over dy (in_place=True); the harness replays one dy, so they run out of place."""
    def call(*args):
        try:
            import liger_kernel.transformers.functional as lf
        except ImportError as exc:
            raise Skip(f"liger-kernel is not installed ({exc})") from exc
        return getattr(lf, fn_name)(*args, *extra, **kwargs)
    return call


def flashfuse_op(module: str, name: str, **kwargs):
    """flashfuse.ops.<module>.<name>(*args, **kwargs), imported at call time (the suite lists without it)."""
    def call(*args):
        return getattr(importlib.import_module(f"flashfuse.ops.{module}"), name)(*args, **kwargs)
    return call


_COMPILED: dict = {}


def _factory(which: str):
    def factory(case: Case, *inputs):
        op = case_op(case)
        if op.prepare is not None:
            inputs = op.prepare(*inputs)
        if which == "eager":
            fn = op.eager
        elif which == "compile":
            if op.eager not in _COMPILED:
                allow_recompiles()   # one compiled function per op serves every case of the table
                _COMPILED[op.eager] = torch.compile(op.eager, dynamic=False)
            fn = _COMPILED[op.eager]
        else:
            fn = op.flashfuse if which == "flashfuse" else op.liger
            if fn is None:
                raise Skip(f"no {which} implementation of {case.params['op']}")
        return lambda: fn(*inputs)
    return factory


_TABLES: dict[str, dict[str, Op]] = {}


def case_op(case: Case) -> Op:
    return _TABLES[case.params["suite"]][case.params["op"]]


class OpSuite(Suite):
    """A suite over a table of ops (``ops``), against eager, torch.compile and Liger."""
    ops: dict[str, Op] = {}
    baseline = "eager"
    metric = "gbps"
    plots = (Plot("pct_ceiling", "% of the ceiling (copy bandwidth or bf16 matmul)", "pct_ceiling", logx=False),
             Plot("speedup", "speedup vs eager PyTorch (x)", "speedup", logx=False),
             Plot("peak_mem_MiB", "peak memory beyond inputs (MiB)", "memory", logx=False))
    eager_description = "PyTorch eager"
    has_liger = True

    def __init__(self):
        _TABLES[self.name] = self.ops

    def providers(self, opts):
        provs = [
            Provider("flashfuse", _factory("flashfuse"), kind="flashfuse", description="flashfuse.ops.*"),
            Provider("eager", _factory("eager"), kind="baseline", description=self.eager_description),
            Provider("compile", _factory("compile"), needs_cuda=True,
                     description="torch.compile of the eager code, dynamic=False"),
        ]
        if self.has_liger:
            provs.append(Provider("liger", _factory("liger"), needs_cuda=True,
                                  description="Liger-Kernel functional API"))
        return provs

    def cases(self, opts):
        cases = []
        for dtype in opts.dtypes or (torch.bfloat16,):
            for op_name, op in self.ops.items():
                shapes = op.shapes if opts.gpu else op.cpu_shapes
                for shape in shapes[:1] if opts.quick else shapes:
                    for mode in op.modes:
                        cases.append(self._case(op_name, op, shape, dtype, mode))
        return cases

    def _case(self, op_name, op, shape, dtype, mode) -> Case:
        params = dict(suite=self.name, op=op_name, **shape)
        dims = "x".join(str(v) for k, v in shape.items() if not isinstance(v, str) and k != "gates")
        tags = "".join(f" {v}" for v in shape.values() if isinstance(v, str))
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = flops = None
        if op.traffic:
            main = op.numel(shape) if op.numel else shape["M"] * shape["N"]
            nbytes = op.traffic[mode] * main * elem
        if op.flops:
            flops = op.flops(shape, mode)
        return Case(name=f"{op_name} {mode} {dims}{tags} {dtype_name(dtype)}", params=params, dtype=dtype,
                    mode=mode, flops=flops, bytes=nbytes, group=f"{op_name} {mode} {dtype_name(dtype)}",
                    x=float(next(v for v in shape.values() if not isinstance(v, str))),
                    ceiling="matmul" if flops else "copy")

    def make_inputs(self, case, device):
        return case_op(case).inputs(case.params, case.dtype, device)

    def reference(self, case, *inputs):
        op = case_op(case)
        return op.eager(*(op.prepare(*inputs) if op.prepare else inputs))

    def check_case(self, case):
        op = case_op(case)
        return case.replace(**op.check(case.params)) if op.check else case
