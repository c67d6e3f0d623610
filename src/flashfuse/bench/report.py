"""What a benchmark run shows and keeps: a terminal table per suite and ``results.json``.

The table has one line per case and one column per provider. On the GPU a cell is the suite's main
number (TFLOP/s or GB/s) and its % of the relevant ceiling; on the CPU, where timings mean nothing, it is
the correctness check's relative error. Other cells name the status (WRONG, OOM, ERROR, N/A, SKIP) and the
messages follow the table. ``--detail`` adds one line per (case, provider) with every number.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections import OrderedDict

import torch

from .._env import INTERPRET
from .harness import CPU_NOTE, Row, Suite, cpu_name

SCHEMA = "flashfuse-bench/1"
METRIC_LABEL = {"tflops": "TFLOP/s", "gbps": "GB/s", "ms": "ms"}


def environment(device: str) -> dict:
    """What results.json records about the machine; ``timings_meaningful`` is False off the GPU."""
    import triton

    gpu = device.startswith("cuda")
    props = torch.cuda.get_device_properties(torch.device(device)) if gpu else None
    return {
        "device": device, "gpu": props.name if gpu else None,
        "sm_count": props.multi_processor_count if gpu else None,
        "gpu_memory_GiB": round(props.total_memory / 2**30, 1) if gpu else None,
        "cpu": cpu_name(), "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
        "interpreter": INTERPRET, "compiled": not INTERPRET,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timings_meaningful": gpu and not INTERPRET,
        "note": None if gpu and not INTERPRET else CPU_NOTE,
    }


def write_json(path: str, env: dict, ceilings: dict, suites: list[Suite], rows: list[Row],
               options: dict | None = None) -> str:
    """results.json: {schema, environment, ceilings, options, suites, rows}; NaN/inf become null."""
    doc = {
        "schema": SCHEMA,
        "environment": env,
        "ceilings": ceilings,
        "options": options or {},
        "suites": [{"name": s.name, "description": s.description, "baseline": s.baseline,
                    "metric": s.metric} for s in suites],
        "rows": [r.to_json() for r in rows],
    }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    return path


# ----------------------------------------------------------------------------------------------------
# Cells
# ----------------------------------------------------------------------------------------------------

def _metric(row: Row, metric: str):
    return {"tflops": row.tflops, "gbps": row.gbps, "ms": row.ms}[metric]


def cell(row: Row, metric: str, timings_meaningful: bool) -> str:
    if row.status != "OK":
        return row.status
    if not timings_meaningful:
        return "ok" if row.rel_error is None else f"ok {row.rel_error:.0e}"
    value = _metric(row, metric)
    if value is None:
        value, metric = row.ms, "ms"
    text = f"{value:.3g}" if metric == "ms" or value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    if row.pct_ceiling is not None and metric != "ms":
        text += f" {row.pct_ceiling:.0f}%"
    return text


def _ceiling_line(ceilings: dict) -> str:
    return (f"ceilings ({ceilings['device']}): copy {ceilings['copy_GBps']:.0f} GB/s "
            f"({ceilings['copy_bytes'] / 2**20:.0f} MiB, read + write), "
            f"bf16 matmul {ceilings['matmul_TFLOPS']:.1f} TFLOP/s ({ceilings['matmul_n']}^3)"
            + ("  [CPU numbers]" if ceilings.get("cpu") else ""))


def header_lines(env: dict, ceilings: dict) -> list[str]:
    where = env["gpu"] or env["cpu"]
    mode = "Triton interpreter" if env["interpreter"] else "compiled"
    sms = f" ({env['sm_count']} SMs)" if env["sm_count"] else ""
    lines = [f"flashfuse bench on {where}{sms}: torch {env['torch']}, triton {env['triton']}, {mode}, "
             f"{env['date']}",
             _ceiling_line(ceilings)]
    if not env["timings_meaningful"]:
        lines.append(f"NOTE: {CPU_NOTE}.")
    return lines


def _pivots(suite: Suite, rows: list[Row], env: dict) -> list[tuple]:
    """(title, column names, lines) tables of a suite: case x provider, a new table wherever the set of
    providers changes (the attention suite's flash-attn shapes, progression and long-context rows)."""
    cases: OrderedDict = OrderedDict()
    for r in rows:
        cases.setdefault(r.case, OrderedDict())[r.provider] = r
    blocks: list = []
    for name, by_provider in cases.items():
        if not blocks or tuple(by_provider) != blocks[-1][0]:
            blocks.append((tuple(by_provider), []))
        blocks[-1][1].append((name, by_provider))
    meaningful = env["timings_meaningful"]
    if meaningful:
        title = f"{suite.name}: {METRIC_LABEL[suite.metric]} (% of ceiling)"
    else:
        title = f"{suite.name}: cells show the rel. error of the correctness check -- {CPU_NOTE}"
    tables = []
    for providers, block in blocks:
        peer_col = meaningful and any(r.vs_best_peer is not None for _, by in block for r in by.values())
        columns = ["case", *providers] + (["flashfuse / best peer"] if peer_col else [])
        lines = []
        for name, by_provider in block:
            line = [name] + [cell(by_provider[p], suite.metric, meaningful) for p in providers]
            if peer_col:
                ratios = [r.vs_best_peer for r in by_provider.values() if r.vs_best_peer is not None]
                line.append(f"x{max(ratios):.2f}" if ratios else "")
            lines.append(line)
        tables.append((title if not tables else "", columns, lines))
    return tables


def _details(rows: list[Row]):
    columns = ["case", "provider", "status", "ms", "TFLOP/s", "GB/s", "% ceil", "% roof", "peak MiB",
               "rel. err", "speedup", "vs peer"]

    def f(v, fmt):
        return "" if v is None else format(v, fmt)
    lines = [[r.case, r.provider, r.status, f(r.ms, ".4g"), f(r.tflops, ".1f"), f(r.gbps, ".1f"),
              f(r.pct_ceiling, ".0f"), f(r.pct_roofline, ".0f"),
              f(None if r.peak_mem_bytes is None else r.peak_mem_bytes / 2**20, ".1f"),
              f(r.rel_error, ".1e"), f(r.speedup, ".2f"), f(r.vs_best_peer, ".2f")] for r in rows]
    return columns, lines


def messages(rows: list[Row]) -> list[str]:
    """One line per (provider, status, message), with the cases it hit."""
    seen: OrderedDict = OrderedDict()
    for r in rows:
        if r.status != "OK" and r.message:
            seen.setdefault((r.provider, r.status, r.message), []).append(r.case)
    out = []
    for (prov, status, msg), cases in seen.items():
        where = cases[0] if len(cases) == 1 else f"{len(cases)} cases, first {cases[0]}"
        out.append(f"{prov} {status} ({where}): {msg}")
    return out


# ----------------------------------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------------------------------

def _plain_table(title: str, columns: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(columns, *lines)]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    head = [title] if title else []
    return "\n".join(head + [rule, fmt.format(*columns), rule] + [fmt.format(*ln) for ln in lines] + [rule])


def _rich_console(stream):
    try:
        from rich.console import Console
    except ImportError:
        return None
    # Outside a terminal (a pipe, a log, a test) rich would wrap at 80 columns; a wide fixed width
    # keeps each case on one line.
    return Console(file=stream, width=None if stream.isatty() else 240, highlight=False)


def _print_table(console, stream, title, columns, lines) -> None:
    if console is None:
        print(_plain_table(title, columns, lines), file=stream)
        return
    from rich.table import Table
    from rich.text import Text
    if title:
        console.print(Text(title))   # a line of its own: a table title would wrap at the table's width
    table = Table(show_lines=False)
    for i, c in enumerate(columns):
        table.add_column(Text(c), justify="left" if i == 0 else "right", no_wrap=i == 0)
    for ln in lines:
        table.add_row(*(Text(str(x)) for x in ln))
    console.print(table)


def print_report(env: dict, ceilings: dict, suites: list[Suite], rows: list[Row], detail: bool = False,
                 stream=None) -> None:
    stream = stream or sys.stdout
    console = _rich_console(stream)
    for line in header_lines(env, ceilings):
        print(line, file=stream)
    for suite in suites:
        suite_rows = [r for r in rows if r.suite == suite.name]
        if not suite_rows:
            print(f"{suite.name}: no cases selected", file=stream)
            continue
        for table in _pivots(suite, suite_rows, env):
            _print_table(console, stream, *table)
        if detail:
            _print_table(console, stream, f"{suite.name}: every row", *_details(suite_rows))
        for msg in messages(suite_rows):
            print(f"  {msg}", file=stream)
    stream.flush()
