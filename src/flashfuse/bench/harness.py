"""The benchmark harness every suite reuses (protocol: ../shared/BENCHMARKING.md).

A suite (``Suite`` subclass) says *what* to run:

- ``cases(opts)``: a list of ``Case`` (row name, shape params, dtype, mode fwd / bwd / fwd+bwd, FLOPs and
  bytes, plot panel ``group`` and x value);
- ``providers(opts)``: a list of ``Provider`` (name, a factory that binds a case's inputs into a callable,
  which kind of peer it is, whether it needs CUDA, when it is too slow or too big to run);
- ``make_inputs(case, device)`` (random normal tensors in the suite's "canonical" layout) and
  ``reference(case, *inputs)`` (plain PyTorch, called on inputs upcast to ``ref_dtype``).

The harness says *how*: for each case and provider it checks correctness first (on ``check_case(case)``,
which may be a reduced copy, error ||out - ref|| / ||ref|| against a dtype-aware tolerance; outputs and, for
the backward modes, every input gradient), then runs the full case once (peak memory, finite outputs) and
times it (``timing.bench_ms``: ``triton.testing.do_bench(warmup=25, rep=100, return_mode="median")``).
Failures never stop a run: a wrong answer is a WRONG row (not timed), ``torch.cuda.OutOfMemoryError`` an OOM
row (memory is freed and the run goes on), any other exception an ERROR row with its message, a CUDA-only
provider on a CPU machine an N/A row.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch

from .counting import attention_bytes, attention_flops, elementwise_bytes  # noqa: F401 (the suites' API)
from .timing import (CPU_COPY_BYTES, CPU_MATMUL_N, CPU_TIMED_CALLS, GPU_COPY_BYTES,  # noqa: F401 (API)
                     GPU_MATMUL_N, _free_memory, bench_ms, cpu_name, measure_ceilings)

MODES = ("fwd", "bwd", "fwd+bwd")
KINDS = ("flashfuse", "baseline", "peer")   # ours; plain PyTorch (speedups are measured against it); others
STATUSES = ("OK", "WRONG", "OOM", "ERROR", "N/A", "SKIP")
NA_ON_CPU = "n/a on CPU (needs CUDA)"
CPU_NOTE = ("CPU run (Triton interpreter): timings mean nothing; this run only checks that every "
            "provider gives the right answer")

# Relative-error tolerances ||out - ref|| / ||ref|| against an fp32/fp64 reference. About 4 units of
# roundoff of the dtype (bf16 eps 2^-7, fp16 eps 2^-10): an exact algorithm that rounds its inputs,
# scores and output lands at 1-1.5 eps (naive bf16 attention measures 6e-3, fp16 8e-4), while a wrong
# kernel is off by 1e-1 or more. fp32 gets fp16's bound: GPU matmuls may run fp32 as tf32, whose
# mantissa is fp16's 10 bits.
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 4e-3, torch.float64: 1e-10}



# ----------------------------------------------------------------------------------------------------
# What a suite declares
# ----------------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One benchmark configuration: a row of the table for each provider.

    ``params`` holds the shape (JSON-able values); ``flops`` and ``bytes`` are the work of one call in
    this case's mode (None when not meaningful); ``group`` is the plot panel and ``x`` the x value in it;
    ``providers`` restricts which providers apply (None: all of the suite's).
    """
    name: str
    params: dict
    dtype: torch.dtype
    mode: str = "fwd"
    flops: float | None = None
    bytes: float | None = None
    group: str = ""
    x: float | None = None
    ceiling: str | None = None        # "matmul" | "copy" | None (whichever bounds the roofline)
    providers: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")

    def key(self) -> tuple:
        return (tuple(sorted(self.params.items())), str(self.dtype), self.mode)

    def replace(self, **params) -> "Case":
        """A copy with some shape params changed (the reduced copy used for correctness checks)."""
        return replace(self, params={**self.params, **params})


@dataclass
class Call:
    """What a provider factory returns: the forward callable bound to one case's inputs.

    ``fn()`` returns a tensor or a tuple of tensors. ``leaves`` are the tensors to differentiate with
    respect to in the backward modes, in the order of the suite's floating-point inputs. A provider that
    works in another layout gives ``to_canon`` (its layout -> the suite's, applied to every output and every
    gradient; a view, not a copy) and ``from_canon`` (the suite's layout -> its own, applied to dout).
    """
    fn: Callable[[], Any]
    leaves: tuple = ()
    to_canon: Callable[[torch.Tensor], torch.Tensor] | None = None
    from_canon: Callable[[torch.Tensor], torch.Tensor] | None = None


class Skip(Exception):
    """Raise in a factory when the provider cannot run this case by design (a row SKIP with the reason)."""


@dataclass
class Provider:
    """One implementation. ``factory(case, *inputs)`` returns a ``Call`` (or a bare callable, whose
    leaves are then the floating-point inputs); it builds whatever is per-shape (layout copies, masks,
    compiled callables) so that none of it is timed. ``skip(case)`` returns a reason not to run a case
    (too slow, too much memory) or None. ``default=False`` providers run only when named in --providers."""
    name: str
    factory: Callable[..., Any]
    kind: str = "peer"
    needs_cuda: bool = False
    skip: Callable[[Case], str | None] | None = None
    default: bool = True
    description: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")


@dataclass
class Options:
    """What the CLI asked for. ``dtypes`` / ``providers`` None: the suite's defaults."""
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    quick: bool = False
    dtypes: tuple[torch.dtype, ...] | None = None
    providers: tuple[str, ...] | None = None
    only: str | None = None
    progress: bool = True
    cuda_graph: bool = False     # time CUDA-graph replays (GPU only): no host overhead in the numbers
    rounds: int = 1              # timings per row, the case's providers in a new order each round; ms = median

    @property
    def gpu(self) -> bool:
        return self.device.startswith("cuda")


class Suite:
    """Base class of a suite; override ``cases``, ``providers``, ``make_inputs`` and ``reference``."""
    name = ""
    description = ""
    baseline: str | tuple[str, ...] | None = None   # provider speedups are measured against; a tuple: the
                                                     # first of them with a row in the case (one per group)
    metric = "tflops"                    # the table's main number: "tflops", "gbps" or "ms"
    plots: tuple = ()                    # plots.Plot entries, one PNG each
    rep_ms = 100                         # do_bench's time budget; calls of ~100 ms need more for a median

    def cases(self, opts: Options) -> list[Case]:
        raise NotImplementedError

    def providers(self, opts: Options) -> list[Provider]:
        raise NotImplementedError

    def make_inputs(self, case: Case, device: str) -> tuple:
        raise NotImplementedError

    def reference(self, case: Case, *inputs):
        raise NotImplementedError

    def ref_dtype(self, case: Case, device: str) -> torch.dtype:
        return torch.float32 if device.startswith("cuda") else torch.float64

    def run_rows(self, runner: "Runner", progress) -> list["Row"] | None:
        """Hook for a suite that cannot run its (case, provider) pairs in this process (``distributed`` spawns
        one process per rank): return every selected row (``runner.select(self)``), with ``progress.update(1)``
        per row, and the Runner fills speedups and returns them. None (the default): the Runner runs the pairs."""
        return None

    def check_case(self, case: Case) -> Case:
        """The case on which correctness is checked (override to check large cases on a reduced copy)."""
        return case

    def tolerance(self, case: Case) -> float:
        return TOLERANCE[case.dtype]

    def cuda_graph(self, case: Case) -> bool:
        """Whether this case is timed as CUDA-graph replays whatever --cuda-graph says (e.g. decode steps,
        which serving always captures)."""
        return False


# ----------------------------------------------------------------------------------------------------
# torch.compile'd peers
# ----------------------------------------------------------------------------------------------------

def allow_recompiles(limit: int = 64) -> None:
    """Let one torch.compile'd callable serve every shape of a sweep (dynamic=False: one graph per shape).
    Dynamo's default of 8 graphs per code object would silently fall back to eager after the eighth shape.
    Also turns off donated buffers: the harness replays one compiled backward graph (retain_graph=True),
    which a backward that donates its saved buffers refuses (seen with torch 2.11)."""
    import torch._dynamo
    import torch._functorch.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
    torch._functorch.config.donated_buffer = False


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc) and "CUDA" in str(exc))


def _message(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:limit]


# ----------------------------------------------------------------------------------------------------
# Running one provider on one case
# ----------------------------------------------------------------------------------------------------

def _tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _float_inputs(inputs) -> list[int]:
    return [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _as_call(bound, inputs) -> Call:
    if isinstance(bound, Call):
        return bound
    return Call(fn=bound, leaves=tuple(inputs[i] for i in _float_inputs(inputs)))


def _provider_douts(call: Call, douts: tuple) -> tuple:
    from_canon = call.from_canon or (lambda t: t)
    return tuple(from_canon(d).contiguous() for d in douts)


def _step(call: Call, mode: str, pdouts: tuple | None = None):
    """One untimed call of the whole mode: the forward, then (bwd modes) the gradients of every leaf.
    ``pdouts``: output gradients in the provider's layout; None draws random ones like the outputs.
    Returns (outputs, gradients, pdouts), in the provider's layout."""
    if mode == "fwd":
        with torch.no_grad():
            return _tuple(call.fn()), (), ()
    outs = _tuple(call.fn())
    if pdouts is None:
        pdouts = tuple(torch.randn_like(o) for o in outs)
    grads = tuple(torch.autograd.grad(outs, call.leaves, pdouts))
    return outs, grads, pdouts


def _timed(call: Call, mode: str, pdouts: tuple = (), cuda_graph: bool = False):
    """The callable that do_bench times. bwd alone: the forward runs once here, the graph is kept and
    only torch.autograd.grad(out, inputs, dout, retain_graph=True) is timed. ``pdouts`` empty: random
    output gradients shaped like this forward's outputs. ``cuda_graph`` (bwd alone): that forward runs on a side
    stream, since the autograd engine puts each backward kernel on its forward's stream, and kernels on the legacy
    default stream cannot join do_bench_cudagraph's capture (the attention bwd rows were ERRORs, session 27); the
    engine's event waits bring a side stream into it."""
    if mode == "fwd":
        def fwd():
            with torch.no_grad():
                return call.fn()
        return fwd
    outs = None
    if mode == "bwd" and cuda_graph:
        forward_stream = torch.cuda.Stream()
        forward_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(forward_stream):
            outs = _tuple(call.fn())
        torch.cuda.current_stream().wait_stream(forward_stream)
    elif mode == "bwd" or not pdouts:
        outs = _tuple(call.fn())
    if not pdouts:
        pdouts = tuple(torch.randn_like(o) for o in outs)
    if mode == "bwd":
        return lambda: torch.autograd.grad(outs, call.leaves, pdouts, retain_graph=True)
    outs = None
    return lambda: torch.autograd.grad(_tuple(call.fn()), call.leaves, pdouts)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN or inf when out has them; absolute when ref is 0)."""
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from the reference's {tuple(ref.shape)}")
    diff = torch.linalg.vector_norm(out.double() - ref.double()).item()
    norm = torch.linalg.vector_norm(ref.double()).item()
    return diff / norm if norm > 0 else diff


@dataclass
class Row:
    """One (case, provider) result; ``to_json`` is what results.json stores."""
    suite: str
    case: str
    provider: str
    kind: str
    status: str
    dtype: str
    mode: str
    group: str
    x: float | None
    params: dict
    message: str = ""
    rel_error: float | None = None
    tolerance: float | None = None
    check_params: dict | None = None
    ms: float | None = None
    flops: float | None = None
    bytes: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    ceiling: str | None = None
    pct_ceiling: float | None = None
    pct_roofline: float | None = None
    peak_mem_bytes: int | None = None
    ms_rounds: list | None = None         # each round's ms (Options.rounds); ms is their median
    speedup: float | None = None          # baseline ms / this ms, same case
    vs_best_peer: float | None = None     # best peer ms / this ms (flashfuse rows)
    wall_s: float | None = None           # seconds the row took (check, compile, timing): GPU-time budget

    def to_json(self) -> dict:
        d = asdict(self)
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
            torch.float64: "fp64"}.get(dtype, str(dtype).replace("torch.", ""))


class Runner:
    """Runs suites under one set of options and ceilings; caches correctness checks across cases."""

    def __init__(self, opts: Options, ceilings: dict):
        self.opts, self.ceilings = opts, ceilings
        self._checks: dict = {}       # (provider, reduced case key) -> (status, message, err, tol)
        self._ref_key, self._ref = None, None

    # -- selection ------------------------------------------------------------------------------------
    def select(self, suite: Suite) -> tuple[list[Case], list[Provider]]:
        providers = suite.providers(self.opts)
        if self.opts.providers is not None:
            providers = [p for p in providers if p.name in self.opts.providers]
        else:
            providers = [p for p in providers if p.default]
        cases = suite.cases(self.opts)
        if self.opts.only:
            pattern = re.compile(self.opts.only)
            cases = [c for c in cases if pattern.search(c.name)]
        return cases, providers

    def run(self, suite: Suite, progress=None, on_case=None) -> list[Row]:
        """Rows of every (case, provider); ``on_case(rows_so_far)`` after each case (partial saves)."""
        rows = suite.run_rows(self, progress)
        if rows is not None:               # the suite ran its rows itself (Suite.run_rows)
            by_case: dict = {}
            for row in rows:
                by_case.setdefault(row.case, []).append(row)
            for case_rows in by_case.values():
                self._relative(suite, case_rows)
            if on_case is not None:
                on_case(rows)
            return rows
        cases, providers = self.select(suite)
        rows = []
        for case in cases:
            case_rows, inputs = [], None
            for prov in providers:
                if case.providers is not None and prov.name not in case.providers:
                    continue
                if progress is not None:
                    progress.set_description(f"{suite.name}: {case.name} [{prov.name}]")
                start = time.perf_counter()
                row = self._row(suite, case, prov)
                if row.status == "":
                    if inputs is None:     # the checked inputs when the check ran on the case itself
                        inputs = self._ref[0] if self._ref_key == case.key() else self._inputs(suite, case)
                    self._measure(case, prov, inputs, row, checked=row.check_params is None,
                                  rep_ms=suite.rep_ms, cuda_graph=self.opts.cuda_graph or suite.cuda_graph(case))
                row.wall_s = time.perf_counter() - start
                case_rows.append(row)
                if progress is not None:
                    progress.update(1)
            if self.opts.rounds > 1 and inputs is not None:
                self._more_rounds(suite, case, providers, case_rows, inputs)
            inputs = None
            _free_memory(self.opts.gpu)
            self._relative(suite, case_rows)
            rows += case_rows
            if on_case is not None:
                on_case(rows)
        return rows

    def _inputs(self, suite: Suite, case: Case) -> tuple:
        """Seeded random inputs; floating-point ones become leaves that require grad in the bwd modes."""
        torch.manual_seed(0)
        inputs = tuple(suite.make_inputs(case, self.opts.device))
        if case.mode != "fwd":
            for i in _float_inputs(inputs):
                inputs[i].requires_grad_(True)
        return inputs

    # -- one row ----------------------------------------------------------------------------------------
    def _row(self, suite: Suite, case: Case, prov: Provider) -> Row:
        """The row with its status decided up to timing: N/A, SKIP, WRONG/ERROR/OOM from the check, or ''."""
        row = Row(suite=suite.name, case=case.name, provider=prov.name, kind=prov.kind, status="",
                  dtype=dtype_name(case.dtype), mode=case.mode, group=case.group, x=case.x,
                  params=dict(case.params), flops=case.flops, bytes=case.bytes)
        if prov.needs_cuda and not self.opts.gpu:
            row.status, row.message = "N/A", NA_ON_CPU
            return row
        reason = prov.skip(case) if prov.skip is not None else None
        if reason:
            row.status, row.message = "SKIP", reason
            return row
        check = suite.check_case(case)
        if check.key() != case.key():
            row.check_params = dict(check.params)
        row.status, row.message, row.rel_error, row.tolerance = self._check(suite, check, prov)
        if row.status == "OK":
            row.status = ""
        return row

    def _reference(self, suite: Suite, case: Case):
        """Inputs, reference outputs (+ input gradients) and douts of a check case; the last one is kept."""
        if self._ref_key == case.key():
            return self._ref
        self._ref_key = self._ref = None
        inputs = self._inputs(suite, case)
        ref_dtype = suite.ref_dtype(case, self.opts.device)
        floats = _float_inputs(inputs)
        backward = case.mode != "fwd"
        ref_in = [t.detach().to(ref_dtype).requires_grad_(backward) if i in floats else t
                  for i, t in enumerate(inputs)]
        with torch.set_grad_enabled(backward):
            ref_out = _tuple(suite.reference(case, *ref_in))
        torch.manual_seed(1)
        douts = tuple(torch.randn(o.shape, device=o.device, dtype=case.dtype) for o in ref_out)
        refs = tuple(o.detach() for o in ref_out)
        if backward:
            grads = torch.autograd.grad(ref_out, [ref_in[i] for i in floats], [d.to(ref_dtype) for d in douts])
            refs += tuple(g.detach() for g in grads)
        self._ref_key, self._ref = case.key(), (inputs, refs, douts)
        return self._ref

    def _check(self, suite: Suite, check: Case, prov: Provider):
        """(status, message, rel. error, tolerance) of a provider on a check case, cached."""
        key = (prov.name, check.key())
        if key not in self._checks:
            self._checks[key] = self._check_once(suite, check, prov)
        return self._checks[key]

    def _check_once(self, suite: Suite, check: Case, prov: Provider):
        tol = suite.tolerance(check)
        status, message, err = "OK", "", None
        try:
            inputs, refs, douts = self._reference(suite, check)
            call = _as_call(prov.factory(check, *inputs), inputs)
            outs, grads, _ = _step(call, check.mode, _provider_douts(call, douts))
            to_canon = call.to_canon or (lambda t: t)
            outs = [to_canon(t) for t in outs + grads]
            if len(outs) != len(refs):
                raise ValueError(f"{len(outs)} outputs and gradients, the reference has {len(refs)}")
            errs = [rel_error(o, r) for o, r in zip(outs, refs)]
            bad = [i for i, e in enumerate(errs) if not e <= tol]     # NaN is never <= tol
            err = max(errs, key=lambda e: e if math.isfinite(e) else math.inf)
            if bad:
                what = "output" if len(errs) == 1 else f"output/gradient #{bad[0]} of {len(errs)}"
                status, message = "WRONG", f"{what}: rel. error {errs[bad[0]]:.3g} > tolerance {tol:.3g}"
        except Skip as exc:
            status, message = "SKIP", str(exc)
        except Exception as exc:          # noqa: BLE001 -- a failing provider is a row, never a crash
            if _is_oom(exc):
                status, message = "OOM", "out of memory in the correctness check"
                self._ref_key = self._ref = None
            else:
                status, message = "ERROR", _message(exc)
        call = outs = None
        if status in ("OOM", "ERROR"):
            _free_memory(self.opts.gpu)
        return status, message, (err if err is not None and math.isfinite(err) else None), tol

    def _measure(self, case: Case, prov: Provider, inputs, row: Row, checked: bool, rep_ms: int = 100,
                 cuda_graph: bool = False) -> None:
        """Full-size run: peak memory and finite outputs from one untimed call, then the timing.
        On the CPU, when the check ran on this very case (``checked``), its call stands for the untimed
        one: there is no peak memory to read, and the interpreter is slow."""
        gpu = self.opts.gpu
        status = message = None
        outs = grads = pdouts = ()
        try:
            call = _as_call(prov.factory(case, *inputs), inputs)
            torch.manual_seed(1)
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            if gpu or not checked:
                outs, grads, pdouts = _step(call, case.mode)
            if gpu:
                torch.cuda.synchronize()
                row.peak_mem_bytes = int(torch.cuda.max_memory_allocated() - base)
            finite = all(bool(torch.isfinite(t).all()) for t in outs + grads)
            outs = grads = None
            if not finite:
                status, message = "WRONG", "non-finite values (NaN/inf) in the full-size run"
            else:
                row.ms = bench_ms(_timed(call, case.mode, pdouts, gpu and cuda_graph), gpu, rep_ms=rep_ms,
                                  cuda_graph=cuda_graph)
                row.ms_rounds = [row.ms]
                status = "OK"
        except Skip as exc:
            status, message = "SKIP", str(exc)
        except Exception as exc:          # noqa: BLE001 -- a failing provider is a row, never a crash
            status, message = ("OOM", "out of memory") if _is_oom(exc) else ("ERROR", _message(exc))
        call = outs = grads = pdouts = None
        if status in ("OOM", "ERROR"):
            _free_memory(gpu)
        row.status, row.message = status, message or ""
        if row.status == "OK":
            self._rates(case, row)

    def _more_rounds(self, suite: Suite, case: Case, providers: list[Provider], rows: list[Row], inputs) -> None:
        """Options.rounds: each timed row timed rounds - 1 more times, the providers rotated (reversed every other
        round), ms the median: a GPU at its power cap moves its clocks over seconds (an H100 in session 42:
        1450-1820 MHz), so one timing per row puts a few % between the providers of one case."""
        by_name = {p.name: p for p in providers}
        timed = [r for r in rows if r.status == "OK"]
        if not timed:
            return
        cuda_graph = self.opts.cuda_graph or suite.cuda_graph(case)
        for i in range(1, self.opts.rounds):
            order = timed[i % len(timed):] + timed[:i % len(timed)]
            for row in reversed(order) if i % 2 else order:
                try:
                    call = _as_call(by_name[row.provider].factory(case, *inputs), inputs)
                    torch.manual_seed(1)
                    row.ms_rounds.append(bench_ms(_timed(call, case.mode, (), self.opts.gpu and cuda_graph),
                                                  self.opts.gpu, rep_ms=suite.rep_ms, cuda_graph=cuda_graph))
                except Exception as exc:      # noqa: BLE001 -- timed once already; keep what was measured
                    row.message = f"round {i + 1}: {_message(exc)}"
                call = None
        for row in timed:
            row.ms = statistics.median(row.ms_rounds)
            self._rates(case, row)

    def _rates(self, case: Case, row: Row) -> None:
        seconds = row.ms * 1e-3
        peak_tflops = self.ceilings["matmul_TFLOPS"]
        peak_gbps = self.ceilings["copy_GBps"]
        bounds = {}
        if case.flops:
            row.tflops = case.flops / seconds / 1e12
            bounds["matmul"] = case.flops / (peak_tflops * 1e12)
        if case.bytes:
            row.gbps = case.bytes / seconds / 1e9
            bounds["copy"] = case.bytes / (peak_gbps * 1e9)
        if bounds:
            binding = max(bounds, key=bounds.get)
            row.pct_roofline = 100.0 * bounds[binding] / seconds
            row.ceiling = case.ceiling if case.ceiling in bounds else binding
            row.pct_ceiling = 100.0 * bounds[row.ceiling] / seconds

    @staticmethod
    def _relative(suite: Suite, rows: list[Row]) -> None:
        """Speedup over the suite's baseline and, for flashfuse rows, over the best peer of the case."""
        timed = {r.provider: r.ms for r in rows if r.status == "OK"}
        names = (suite.baseline,) if isinstance(suite.baseline, str) else tuple(suite.baseline or ())
        name = next((n for n in names if any(r.provider == n for r in rows)), None)
        base = timed.get(name)
        peers = [r.ms for r in rows if r.status == "OK" and r.kind == "peer"]
        for r in rows:
            if r.status != "OK":
                continue
            if base is not None:
                r.speedup = base / r.ms
            if r.kind == "flashfuse" and peers:
                r.vs_best_peer = min(peers) / r.ms


class _NoProgress:
    """Stands in for a tqdm bar."""
    set_description = update = close = staticmethod(lambda *args: None)


def progress_bar(total: int, enabled: bool = True):
    """A tqdm bar on stderr (only on a terminal: tqdm's disable=None), or a silent stand-in."""
    if not enabled:
        return _NoProgress()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoProgress()
    return tqdm(total=total, unit="row", disable=None, leave=False, dynamic_ncols=True)


def run_suites(suites: list[Suite], opts: Options, ceilings: dict, on_case=None) -> list[Row]:
    """Every suite's rows, in order, under one progress bar; ``on_case(all rows so far)`` after each case."""
    runner = Runner(opts, ceilings)
    selected = [runner.select(s) for s in suites]
    total = sum(1 for cases, provs in selected for c in cases for p in provs
                if c.providers is None or p.name in c.providers)
    bar = progress_bar(total, opts.progress)
    done: list[Row] = []
    try:
        for suite in suites:
            done += runner.run(suite, bar, None if on_case is None else (lambda rows: on_case(done + rows)))
        return done
    finally:
        bar.close()
