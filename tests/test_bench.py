"""The benchmark harness (flashfuse.bench): counters, ceilings, the correctness gate, OOM/ERROR/N/A rows,
results.json, plots, and the attention suite's cases and checks. CPU tier: fake providers and tiny sizes."""

import dataclasses
import io
import json
import math

import pytest
import torch

from flashfuse.bench import harness
from flashfuse.bench.harness import (
    Call, Case, Options, Provider, Runner, Skip, Suite, attention_bytes, attention_flops, elementwise_bytes,
    measure_ceilings,
)
from flashfuse.bench.plots import Plot, write_plots
from flashfuse.bench.report import environment, print_report, write_json
from flashfuse.bench.suites import SUITES, attention, get_suite

CPU = Options(device="cpu", progress=False)
# Fixed ceilings so rates are checkable without measuring anything.
CEILINGS = {"device": "test", "cpu": True, "copy_bytes": 1 << 20, "copy_ms": 1.0, "copy_GBps": 100.0,
            "matmul_n": 64, "matmul_dtype": "bfloat16", "matmul_ms": 1.0, "matmul_TFLOPS": 2.0, "note": "test"}


# ----------------------------------------------------------------------------------------------------
# A fake suite: out = x * y + x over N elements, with providers that fail in every way a real one can
# ----------------------------------------------------------------------------------------------------

class _WrongGrad(torch.autograd.Function):
    """Right forward (x * y + x), wrong backward (drops the + x term's gradient)."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y + x

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


def _good(case, x, y):
    return lambda: x * y + x


def _transposed(case, x, y):
    """Works in a (cols, rows) layout: exercises to_canon / from_canon for outputs, grads and dout."""
    xt, yt = (t.detach().t().contiguous().requires_grad_(t.requires_grad) for t in (x, y))
    return Call(lambda: xt * yt + xt, leaves=(xt, yt), to_canon=lambda t: t.t(), from_canon=lambda t: t.t())


def _raise(exc):
    def factory(case, x, y):
        def fn():
            raise exc
        return fn
    return factory


def _oom_at_full_size(case, x, y):
    """Fine on the reduced check copy, out of memory on the full case."""
    if case.params["rows"] > FakeSuite.CHECK_ROWS:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 TiB")
    return lambda: x * y + x


def _skip_in_factory(case, x, y):
    raise Skip("not for this shape")


class FakeSuite(Suite):
    name = "fake"
    baseline = "good"
    metric = "gbps"
    plots = (Plot("gbps", "GB/s", "gbps"), Plot("ms", "ms", "ms", logy=True))
    CHECK_ROWS = 4

    def providers(self, opts):
        return [
            Provider("good", _good, kind="baseline"),
            Provider("oom", _raise(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB"))),
            Provider("after-oom", _good, kind="peer"),
            Provider("wrong", lambda c, x, y: (lambda: 1.5 * (x * y + x)), kind="flashfuse"),
            Provider("nan", lambda c, x, y: (lambda: (x * y + x) * torch.nan), kind="flashfuse"),
            Provider("error", _raise(RuntimeError("boom: kernel exploded\nsecond line")), kind="flashfuse"),
            Provider("cuda-only", _good, needs_cuda=True),
            Provider("skipped", _good, skip=lambda case: "too big" if case.params["rows"] > 4 else None),
            Provider("skip-in-factory", _skip_in_factory),
            Provider("transposed", _transposed, kind="flashfuse"),
            Provider("wrong-grad", lambda c, x, y: (lambda: _WrongGrad.apply(x, y)), kind="flashfuse"),
            Provider("oom-full", _oom_at_full_size, kind="flashfuse"),
            Provider("hidden", _good, default=False),
        ]

    def cases(self, opts):
        return [Case(name=f"{mode} rows={rows}", params={"rows": rows, "cols": 3}, dtype=torch.float32,
                     mode=mode, flops=2.0 * rows * 3, bytes=elementwise_bytes(rows * 3, 4, 2), group=mode, x=rows)
                for mode in ("fwd", "bwd", "fwd+bwd") for rows in (4, 8)]

    def make_inputs(self, case, device):
        shape = (case.params["rows"], case.params["cols"])
        return torch.randn(shape, device=device), torch.randn(shape, device=device)

    def reference(self, case, x, y):
        assert x.dtype == torch.float64          # upcast by the harness on the CPU
        return x * y + x

    def check_case(self, case):
        return case.replace(rows=min(case.params["rows"], self.CHECK_ROWS))


@pytest.fixture(scope="module")
def fake_rows():
    return Runner(CPU, CEILINGS).run(FakeSuite())


def _row(rows, provider, case):
    (row,) = [r for r in rows if r.provider == provider and r.case == case]
    return row


# ----------------------------------------------------------------------------------------------------
# Counters and ceilings
# ----------------------------------------------------------------------------------------------------

def test_attention_flop_and_byte_counters():
    fwd = 4 * 2 * 3 * 5 * 7 * 11
    assert attention_flops(2, 3, 5, 7, 11) == fwd
    assert attention_flops(2, 3, 5, 7, 11, causal=True) == fwd / 2
    assert attention_flops(2, 3, 5, 7, 11, mode="bwd") == 2.5 * fwd
    assert attention_flops(2, 3, 5, 7, 11, causal=True, mode="fwd+bwd") == 3.5 * fwd / 2
    q, kv = 2 * 3 * 5 * 11 * 2, 2 * 3 * 7 * 11 * 2
    assert attention_bytes(2, 3, 5, 7, 11, 2) == 2 * q + 2 * kv            # q, k, v read; o written
    assert attention_bytes(2, 3, 5, 7, 11, 2, mode="bwd") == 4 * q + 4 * kv  # q,k,v,o,do read; dq,dk,dv written
    assert elementwise_bytes(1000, 4, n_inputs=2) == 3 * 1000 * 4


def test_vector_add_cases_count_three_vectors_of_bytes():
    cases = get_suite("vector-add").cases(Options(device="cuda"))
    assert [c.params["N"] for c in cases] == [2 ** e for e in range(12, 29)]
    for c in cases:
        assert c.bytes == 3 * c.params["N"] * 4 and c.dtype == torch.float32 and c.ceiling == "copy"


def test_ceilings_on_cpu_say_they_are_cpu_numbers():
    c = measure_ceilings("cpu", copy_bytes=1 << 20, matmul_n=64)
    assert c["cpu"] is True and "CPU" in c["note"]
    assert c["copy_bytes"] == 1 << 20 and c["matmul_n"] == 64 and c["matmul_dtype"] == "bfloat16"
    # bytes read + written over the median time; 2 n^3 flops over the median time
    assert c["copy_GBps"] == pytest.approx(2 * (1 << 20) / (c["copy_ms"] * 1e-3) / 1e9)
    assert c["matmul_TFLOPS"] == pytest.approx(2 * 64 ** 3 / (c["matmul_ms"] * 1e-3) / 1e12)
    assert c["copy_GBps"] > 0 and c["matmul_TFLOPS"] > 0
    # on a GPU: the protocol's sizes
    assert harness.GPU_COPY_BYTES >= 1 << 30 and harness.GPU_MATMUL_N == 8192


# ----------------------------------------------------------------------------------------------------
# The correctness gate and the failure rows
# ----------------------------------------------------------------------------------------------------

def test_correct_provider_is_timed_with_rates(fake_rows):
    for case in ("fwd rows=4", "fwd rows=8", "bwd rows=4", "bwd rows=8", "fwd+bwd rows=8"):
        row = _row(fake_rows, "good", case)
        assert row.status == "OK", row.message
        assert row.rel_error is not None and row.rel_error < 1e-6
        assert row.ms > 0
        assert row.gbps == pytest.approx(row.bytes / (row.ms * 1e-3) / 1e9)
        assert row.tflops == pytest.approx(row.flops / (row.ms * 1e-3) / 1e12)
        # the roofline's binding ceiling: bytes / 100 GB/s > flops / 2 TFLOP/s for an elementwise op
        assert row.ceiling == "copy"
        assert row.pct_ceiling == pytest.approx(100 * row.gbps / CEILINGS["copy_GBps"])
        assert row.speedup == pytest.approx(1.0)
    assert _row(fake_rows, "good", "fwd rows=8").check_params == {"rows": 4, "cols": 3}
    assert _row(fake_rows, "good", "fwd rows=4").check_params is None


def test_wrong_answer_is_wrong_and_not_timed(fake_rows):
    for case in ("fwd rows=4", "bwd rows=8"):
        row = _row(fake_rows, "wrong", case)
        assert row.status == "WRONG" and row.ms is None and row.tflops is None
        assert row.rel_error == pytest.approx(0.5, rel=1e-6)
        assert "rel. error" in row.message
    nan = _row(fake_rows, "nan", "fwd rows=4")
    assert nan.status == "WRONG" and nan.ms is None and nan.rel_error is None


def test_wrong_gradient_is_caught_in_the_backward_modes_only(fake_rows):
    assert _row(fake_rows, "wrong-grad", "fwd rows=8").status == "OK"
    for case in ("bwd rows=8", "fwd+bwd rows=4"):
        row = _row(fake_rows, "wrong-grad", case)
        assert row.status == "WRONG" and row.ms is None and "gradient #1" in row.message


def test_other_layout_is_checked_through_to_canon(fake_rows):
    for case in ("fwd rows=4", "bwd rows=4", "bwd rows=8", "fwd+bwd rows=8"):
        row = _row(fake_rows, "transposed", case)
        assert row.status == "OK" and row.rel_error < 1e-6, row.message


def test_oom_is_recorded_and_the_run_goes_on(fake_rows):
    for case in ("fwd rows=4", "bwd rows=8"):
        row = _row(fake_rows, "oom", case)
        assert row.status == "OOM" and row.ms is None
        assert _row(fake_rows, "after-oom", case).status == "OK"
    full = _row(fake_rows, "oom-full", "fwd rows=8")          # passes the check, OOMs at full size
    assert full.status == "OOM" and full.rel_error is not None and full.ms is None
    assert _row(fake_rows, "oom-full", "fwd rows=4").status == "OK"


def test_error_na_and_skip_rows(fake_rows):
    err = _row(fake_rows, "error", "fwd rows=4")
    assert err.status == "ERROR" and err.message == "RuntimeError: boom: kernel exploded" and err.ms is None
    na = _row(fake_rows, "cuda-only", "bwd rows=4")
    assert na.status == "N/A" and na.message == "n/a on CPU (needs CUDA)"
    assert _row(fake_rows, "skipped", "fwd rows=4").status == "OK"
    skipped = _row(fake_rows, "skipped", "fwd rows=8")
    assert skipped.status == "SKIP" and skipped.message == "too big"
    assert _row(fake_rows, "skip-in-factory", "fwd rows=4").message == "not for this shape"
    assert not [r for r in fake_rows if r.provider == "hidden"]       # default=False: only when named


def test_best_peer_ratio_for_flashfuse_rows(fake_rows):
    row = _row(fake_rows, "transposed", "fwd rows=4")
    peers = [r for r in fake_rows if r.case == "fwd rows=4" and r.kind == "peer" and r.status == "OK"]
    assert {r.provider for r in peers} == {"after-oom", "skipped"}
    assert row.vs_best_peer == pytest.approx(min(r.ms for r in peers) / row.ms)
    assert all(r.vs_best_peer is None for r in peers)


def test_filters_select_providers_and_cases():
    opts = Options(device="cpu", progress=False, providers=("hidden", "good"), only=r"^bwd .*=8$")
    rows = Runner(opts, CEILINGS).run(FakeSuite())
    assert [(r.provider, r.case, r.status) for r in rows] == [("good", "bwd rows=8", "OK"),
                                                              ("hidden", "bwd rows=8", "OK")]


def test_rounds_rotate_providers_and_take_the_median(monkeypatch):
    """Options.rounds: every OK row timed once per round, the providers in a new order each round (rotated,
    every other round reversed), ms the median of the rounds; rows that failed are not timed again."""
    order, fake_ms = [], iter(float(i) for i in range(100, 1000))

    def fake_bench_ms(fn, gpu, **kw):
        fn()
        return next(fake_ms)

    def logged(name):
        def factory(case, x, y):
            def fn():
                order.append(name)
                return x * y + x
            return fn
        return factory

    class Logged(FakeSuite):
        def providers(self, opts):
            return [Provider(n, logged(n), kind="peer") for n in ("a", "b", "c")] + [
                Provider("error", _raise(RuntimeError("boom")), kind="flashfuse")]

    monkeypatch.setattr(harness, "bench_ms", fake_bench_ms)
    opts = Options(device="cpu", progress=False, only=r"^fwd rows=4$", rounds=3)
    rows = Runner(opts, CEILINGS).run(Logged())
    by = {r.provider: r for r in rows}
    assert by["error"].status == "ERROR" and by["error"].ms_rounds is None
    timed = [by[n] for n in "abc"]
    assert all(r.status == "OK" and len(r.ms_rounds) == 3 for r in timed)
    for r in timed:
        assert r.ms == sorted(r.ms_rounds)[1] and r.gbps == pytest.approx(r.bytes / (r.ms * 1e-3) / 1e9)
    # each bench_ms call runs fn once: round 1 in the suite's order, round 2 rotated by 1 and reversed, round 3
    # rotated by 2; the calls before each timing (check, untimed full-size run) are not in fake_ms's order
    first = [r.ms_rounds[0] for r in timed]
    second = [r.ms_rounds[1] for r in timed]
    third = [r.ms_rounds[2] for r in timed]
    assert first == sorted(first) and max(first) < min(second) and max(second) < min(third)
    assert sorted(second, reverse=True) == [by[n].ms_rounds[1] for n in "bca"]
    assert sorted(third) == [by[n].ms_rounds[2] for n in "cab"]
    # a case whose every provider passed the check and then failed at full size has nothing to time again
    opts = Options(device="cpu", progress=False, only=r"^fwd rows=8$", providers=("oom-full",), rounds=3)
    assert [r.status for r in Runner(opts, CEILINGS).run(FakeSuite())] == ["OOM"]


# ----------------------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------------------

def test_results_json_schema(fake_rows, tmp_path):
    env = environment("cpu")
    path = write_json(str(tmp_path / "out" / "results.json"), env, CEILINGS, [FakeSuite()], fake_rows,
                      {"quick": True})
    doc = json.loads(open(path).read())
    assert doc["schema"] == "flashfuse-bench/1"
    e = doc["environment"]
    for key in ("gpu", "sm_count", "torch", "triton", "interpreter", "date", "timings_meaningful", "note"):
        assert key in e
    assert e["torch"] == torch.__version__ and e["timings_meaningful"] is False
    assert "timings mean nothing" in e["note"] and e["interpreter"] is True
    assert doc["ceilings"] == CEILINGS and doc["options"] == {"quick": True}
    assert doc["suites"] == [{"name": "fake", "description": "", "baseline": "good", "metric": "gbps"}]
    assert len(doc["rows"]) == len(fake_rows)
    for r in doc["rows"]:
        assert r["status"] in harness.STATUSES
        for key in ("suite", "case", "provider", "kind", "dtype", "mode", "params", "ms", "tflops", "gbps",
                    "pct_ceiling", "pct_roofline", "peak_mem_bytes", "rel_error", "message", "speedup"):
            assert key in r
    good = [r for r in doc["rows"] if r["provider"] == "good" and r["case"] == "fwd rows=8"][0]
    assert good["params"] == {"rows": 8, "cols": 3} and good["dtype"] == "fp32" and good["ms"] > 0


def test_plots_are_png_files(fake_rows, tmp_path):
    paths = write_plots(str(tmp_path), [FakeSuite()], fake_rows, environment("cpu"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["fake_gbps.png", "fake_ms.png"]
    for p in paths:
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_says_cpu_timings_mean_nothing(fake_rows):
    out = io.StringIO()
    print_report(environment("cpu"), CEILINGS, [FakeSuite()], fake_rows, detail=True, stream=out)
    text = out.getvalue()
    assert "timings mean nothing" in text and "[CPU numbers]" in text
    for word in ("WRONG", "OOM", "ERROR", "N/A", "SKIP", "RuntimeError: boom", "wrong-grad", "transposed"):
        assert word in text


# ----------------------------------------------------------------------------------------------------
# The attention suite
# ----------------------------------------------------------------------------------------------------

def test_attention_gpu_cases_follow_flash_attn_benchmark_shapes():
    suite = get_suite("attention")
    cases = suite.cases(Options(device="cuda"))
    fa = [c for c in cases if c.group.startswith(("hd64 ", "hd128 "))]
    assert len(fa) == 2 * 2 * 2 * 6           # head dims x causal x (fwd, bwd) x seqlens
    wide = [c for c in cases if c.group.startswith("hd") and c not in fa]
    assert len(wide) == 5 * 2 * 2 * 3         # other head dims (80, 96, 160, 192, 256) x causal x (fwd, bwd) x seqlens
    assert {c.params["D"] for c in wide} == {80, 96, 160, 192, 256}
    for c in wide:
        p = c.params
        assert p["B"] * p["S"] == 16384 and p["H"] == round(2048 / p["D"]) and p["S"] in (1024, 2048, 4096)
        assert c.flops == attention_flops(p["B"], p["H"], p["S"], p["S"], p["D"], p["causal"], c.mode)
        assert {"flashfuse", "sdpa-cudnn", "sdpa-flash"} <= set(c.providers)
    for c in fa:
        p = c.params
        assert p["B"] * p["S"] == 16384 and p["H"] * p["D"] == 2048 and c.dtype == torch.bfloat16
        assert p["S"] in (512, 1024, 2048, 4096, 8192, 16384) and c.mode in ("fwd", "bwd")
        assert c.flops == attention_flops(p["B"], p["H"], p["S"], p["S"], p["D"], p["causal"], c.mode)
        assert {"flashfuse", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex", "naive"} <= set(c.providers)
    prog = [c for c in cases if c.group.startswith("progression")]
    assert [c.params["S"] for c in prog] == [256, 512, 1024, 2048, 4096, 8192]
    assert all(c.dtype == torch.float16 and c.mode == "fwd" and c.params["H"] == 16 for c in prog)
    assert set(prog[0].providers) == {"naive", "basic", "vectorized", "blocked", "flash"}
    long = [c for c in cases if c.group.startswith("long")]
    assert {c.mode for c in long} == {"fwd", "bwd"}
    assert all(c.params == dict(B=1, H=16, S=65536, D=128, causal=True, long=True) for c in long)
    assert {"naive", "flashfuse"} <= set(long[0].providers)
    det = [c for c in cases if c.group.startswith("deterministic")]
    assert len(det) == 2 * 2 * 3 and all(c.mode == "bwd" and c.params["deterministic"] for c in det)
    assert set(det[0].providers) == {"flashfuse", "sdpa-flash-det", "sdpa-efficient-det", "sdpa-cudnn"}
    drop = [c for c in cases if c.group.startswith("dropout")]
    assert len(drop) == 2 * 2 * 2 * 3 and all(c.params["dropout_p"] == 0.1 for c in drop)   # hd x causal x mode x S
    assert set(drop[0].providers) == {"flashfuse", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient"}
    # each provider draws its own mask: the reduced copy is checked without dropout
    assert suite.check_case(drop[-1]).params == dict(drop[-1].params, B=1, H=2, S=2048, dropout_p=0.0)
    both = suite.cases(Options(device="cuda", dtypes=(torch.bfloat16, torch.float16), only="^fwd"))
    assert {c.dtype for c in both if c.group.startswith("hd")} == {torch.bfloat16, torch.float16}
    # correctness on a reduced copy: batch 1, 2 heads, seqlen capped at 2048
    big = [c for c in fa if c.params["S"] == 16384][0]
    assert suite.check_case(big).params == dict(big.params, B=1, H=2, S=2048)
    small = [c for c in fa if c.params["S"] == 512][0]
    assert suite.check_case(small).params["S"] == 512


def test_attention_cuda_providers_and_size_limits(monkeypatch):
    opts = Options(device="cuda")
    monkeypatch.setattr(attention, "_device_memory", lambda o: 80 * 2**30)
    providers = {p.name: p for p in get_suite("attention").providers(opts)}
    assert all(providers[n].needs_cuda for n in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex"))
    assert not providers["flashfuse"].needs_cuda and not providers["naive"].needs_cuda
    assert providers["flashfuse"].kind == "flashfuse" and providers["naive"].kind == "baseline"
    cases = {c.name: c for c in get_suite("attention").cases(opts)}
    naive = providers["naive"].skip
    assert naive(cases["fwd hd64 full S=4096 bf16"]) is None             # 2^31 scores x 12 B = 24 GiB
    assert "GiB" in naive(cases["fwd hd64 full S=8192 bf16"])             # 48 GiB > 0.4 x 80 GiB
    assert naive(cases["long-context fwd hd128 causal S=65536 bf16"]) is None   # the OOM is the point
    basic = providers["basic"].skip
    assert basic(cases["progression S=2048 fp16"]) is None and basic(cases["progression S=4096 fp16"])


def test_deterministic_sdpa_rows_set_the_flag_for_their_backward_only():
    """The sdpa-*-det providers wrap SDPA in _DeterministicSpan: torch.use_deterministic_algorithms is on while the
    backward between the two spans runs, and back as it was after."""
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(torch.are_deterministic_algorithms_enabled())
            return grad * 2

    x = torch.randn(3, requires_grad=True)
    before = torch.are_deterministic_algorithms_enabled()
    out = attention._DeterministicSpan.apply(Probe.apply(attention._DeterministicSpan.apply(x, before)), True)
    assert not seen and torch.are_deterministic_algorithms_enabled() == before
    out.sum().backward()
    assert seen == [True] and torch.are_deterministic_algorithms_enabled() == before
    assert torch.equal(x.grad, torch.full((3,), 2.0))


def test_attention_cpu_run_checks_every_provider():
    opts = Options(device="cpu", progress=False, quick=True, only=r"hd64 causal S=64")
    rows = Runner(opts, CEILINGS).run(get_suite("attention"))
    status = {(r.provider, r.mode): r.status for r in rows}
    for mode in ("fwd", "bwd"):
        for prov in ("flashfuse", "naive", "sdpa-math"):
            assert status[(prov, mode)] == "OK", [r.message for r in rows if r.provider == prov]
        for prov in ("sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex"):
            assert status[(prov, mode)] == "N/A"
    assert all(r.rel_error < 2e-2 for r in rows if r.status == "OK")


@pytest.mark.parametrize("mistake", ["ignores the causal mask", "scale off by 10%"])
def test_attention_check_rejects_wrong_attention(mistake):
    from flashfuse.reference.attention import naive_attention

    def factory(case, q, k, v):
        if mistake == "ignores the causal mask":
            return lambda: naive_attention(q, k, v, is_causal=False)
        return lambda: naive_attention(q, k, v, is_causal=True, scale=1.1 / math.sqrt(q.shape[-1]))

    class Broken(attention.Attention):
        def providers(self, opts):
            return [Provider("broken", factory)]

        def cases(self, opts):
            return [dataclasses.replace(c, providers=None) for c in super().cases(opts)]

    opts = Options(device="cpu", progress=False, quick=True, only=r"^(fwd|bwd) hd64 causal S=64")
    rows = Runner(opts, CEILINGS).run(Broken())
    assert [r.status for r in rows] == ["WRONG", "WRONG"]


def test_registry():
    assert list(SUITES) == ["vector-add", "attention", "decode", "llm", "diffusion", "models",
                           "distributed"]
    with pytest.raises(KeyError, match="available: vector-add, attention, decode, llm, diffusion, models"):
        get_suite("nope")

