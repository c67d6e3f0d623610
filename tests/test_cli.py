"""The ``flashfuse`` command: ``bench`` and ``info``, through main() and through the console script."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from flashfuse.cli import main

CPU_MESSAGE = "timings mean nothing"


def _script() -> str:
    """The installed console script (pip install -e . puts it beside the interpreter)."""
    beside = os.path.join(os.path.dirname(sys.executable), "flashfuse")
    path = beside if os.path.exists(beside) else shutil.which("flashfuse")
    assert path, "the flashfuse console script is not installed (pip install -e .)"
    return path


def _rows(out_dir):
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)


def test_bench_vector_add_quick(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "vector-add", "--out", str(out), "--quick", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert CPU_MESSAGE in text and "vector-add" in text
    doc = _rows(out)
    assert doc["environment"]["timings_meaningful"] is False and CPU_MESSAGE in doc["environment"]["note"]
    assert doc["ceilings"]["cpu"] is True
    status = {(r["provider"], r["params"]["N"]): r["status"] for r in doc["rows"]}
    assert set(status) == {(p, n) for p in ("triton", "cuda", "torch") for n in (2 ** 10, 2 ** 16)}
    for n in (2 ** 10, 2 ** 16):
        assert status[("torch", n)] == "OK"
        assert status[("triton", n)] == "OK", [r["message"] for r in doc["rows"] if r["provider"] == "triton"]
        assert status[("cuda", n)] == "N/A"
    for r in doc["rows"]:
        if r["status"] == "OK":
            assert r["rel_error"] < 1e-6 and r["bytes"] == 3 * 4 * r["params"]["N"] and r["gbps"] > 0
    for name in ("vector-add_gbps.png", "vector-add_pct_copy.png"):
        with open(out / name, "rb") as f:
            assert f.read(4) == b"\x89PNG"


def test_bench_filters(tmp_path, capsys):
    out = tmp_path / "f"
    assert main(["bench", "vector-add", "--out", str(out), "--providers", "torch", "--only", r"2\^10 ",
                 "--no-plots", "--no-progress", "--detail"]) == 0
    rows = _rows(out)["rows"]
    assert [(r["provider"], r["case"]) for r in rows] == [("torch", "N=2^10 fp32")]
    assert sorted(os.listdir(out)) == ["results.json"]
    assert "every row" in capsys.readouterr().out
    assert _rows(out)["options"]["timing"] == "do_bench (eager calls)"


def test_bench_cuda_graph_option_is_recorded(tmp_path):
    out = tmp_path / "g"
    assert main(["bench", "vector-add", "--out", str(out), "--providers", "torch", "--only", r"2\^10 ",
                 "--no-plots", "--no-progress", "--cuda-graph"]) == 0
    doc = _rows(out)
    assert doc["options"]["timing"] == "cuda-graph replays"
    assert [r["status"] for r in doc["rows"]] == ["OK"]


def test_bench_rounds_option(tmp_path):
    out = tmp_path / "r"
    assert main(["bench", "vector-add", "--out", str(out), "--providers", "torch,triton", "--only", r"2\^10 ",
                 "--no-plots", "--no-progress", "--rounds", "3"]) == 0
    doc = _rows(out)
    assert doc["options"]["rounds"] == 3
    for r in doc["rows"]:
        assert r["status"] == "OK" and len(r["ms_rounds"]) == 3, r


@pytest.mark.parametrize("argv, message", [
    (["bench", "nope"], "unknown suite(s) nope; available: vector-add, attention"),
    (["bench", "--rounds", "0"], "--rounds 0: the number of timings per row must be >= 1"),
    (["bench", "--providers", "torch,nope"], "unknown provider(s) nope"),
    (["bench", "--dtype", "fp8"], "unknown dtype(s) fp8"),
    (["bench", "--only", "("], "is not a regular expression"),
])
def test_bench_bad_arguments_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bench_list(capsys):
    assert main(["bench", "attention", "--list"]) == 0
    text = capsys.readouterr().out
    for word in ("provider flashfuse", "provider sdpa-cudnn", "(needs CUDA)", "case progression S=16 fp16"):
        assert word in text


def test_info(capsys):
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    for word in ("device:", "torch:", "triton:", "Triton interpreter", "ceilings", "[CPU numbers]"):
        assert word in text
    assert main(["info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["environment"]["interpreter"] is True and doc["ceilings"]["copy_GBps"] > 0


def test_console_script_info_and_bench(tmp_path):
    info = subprocess.run([_script(), "info"], capture_output=True, text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert "triton:" in info.stdout
    out = tmp_path / "sub"
    bench = subprocess.run([_script(), "bench", "vector-add", "--quick", "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    assert CPU_MESSAGE in bench.stdout and (out / "results.json").exists()


def test_bench_every_suite_quick_exits_0_on_cpu(tmp_path, capsys):
    """`flashfuse bench` with no suite runs them all; the quick version keeps the CPU tier fast."""
    out = tmp_path / "all"
    assert main(["bench", "--quick", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert CPU_MESSAGE in text
    doc = _rows(out)
    assert {r["suite"] for r in doc["rows"]} == {"vector-add", "attention", "decode", "llm", "diffusion", "models",
                                               "distributed"}
    assert not [r for r in doc["rows"] if r["status"] in ("WRONG", "ERROR", "OOM")], \
        [(r["provider"], r["case"], r["message"]) for r in doc["rows"] if r["status"] in ("WRONG", "ERROR")]
    assert {r["provider"] for r in doc["rows"] if r["status"] == "N/A"} == \
        {"cuda", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math", "flex", "compile", "liger", "hf-compile",
         "flashfuse-compile", "flashfuse-graph"}
    assert (out / "attention_tflops.png").exists() and (out / "attention_progression_ms.png").exists()
    assert (out / "decode_gbps.png").exists()
