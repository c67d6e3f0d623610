"""The ``flashfuse`` command.

    flashfuse bench [SUITE ...] [--out DIR] [--quick] [--dtype bf16,fp16] [--providers a,b] [--only REGEX]
                    [--cuda-graph] [--rounds N]
    flashfuse info [--json]

``bench`` measures the ceilings, runs the suites (all of them when none is named), prints a table per suite,
writes ``DIR/results.json`` and PNG plots. With no GPU it runs every kernel in Triton's interpreter at tiny
sizes: a correctness run, whose timings mean nothing (it says so). ``info`` prints the device, the versions,
interpreter or compiled, and the measured ceilings.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "half": "float16", "fp32": "float32", "float32": "float32", "float": "float32"}


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashfuse", description="flashfuse: fused Triton kernels for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="run benchmark suites (all when none is named)",
                           description="Benchmark suites: correctness check, then do_bench timing, "
                                       "% of measured ceilings, peak memory; table, results.json, plots.")
    bench.add_argument("suites", nargs="*", metavar="SUITE", help="suite names (default: every suite)")
    bench.add_argument("--out", default="bench-out", help="output directory (default: bench-out)")
    bench.add_argument("--quick", action="store_true", help="a few cases per suite")
    bench.add_argument("--dtype", type=_csv, help="dtypes to run instead of each suite's default, e.g. bf16,fp16")
    bench.add_argument("--providers", type=_csv, help="only these providers (also enables non-default ones)")
    bench.add_argument("--only", metavar="REGEX", help="only cases whose name matches REGEX (re.search)")
    bench.add_argument("--cuda-graph", action="store_true",
                       help="time CUDA-graph replays of each call (every provider alike): the GPU time without "
                            "the host's Python and launch costs")
    bench.add_argument("--rounds", type=int, default=1, metavar="N",
                       help="time each row N times, the case's providers in a new order each round, and report "
                            "the median (a GPU at its power cap moves its clocks over seconds: same-run ratios "
                            "within a few %% need N >= 3)")
    bench.add_argument("--detail", action="store_true", help="also print one line per (case, provider)")
    bench.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--strict", action="store_true", help="exit 1 when a row is WRONG or ERROR")
    bench.add_argument("--list", action="store_true", help="list the suites, providers and cases, then exit")

    info = sub.add_parser("info", help="device, versions, interpreter or compiled, measured ceilings")
    info.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "info":
        return _info(args)
    return _bench(args)


def _info(args) -> int:
    from .bench.harness import Options, measure_ceilings
    from .bench.report import environment, header_lines

    opts = Options()
    env = environment(opts.device)
    ceilings = measure_ceilings(opts.device)
    if args.json:
        print(json.dumps({"environment": env, "ceilings": ceilings}, indent=1))
        return 0
    where = env["gpu"] or env["cpu"]
    print(f"device:      {opts.device} -- {where}")
    if env["gpu"]:
        print(f"             {env['sm_count']} SMs, {env['gpu_memory_GiB']} GiB")
    print(f"torch:       {env['torch']} (CUDA {env['cuda']})")
    print(f"triton:      {env['triton']}")
    print(f"python:      {env['python']}")
    print("kernels:     " + ("Triton interpreter (TRITON_INTERPRET=1): exact but slow, timings mean nothing"
                             if env["interpreter"] else "compiled"))
    print(header_lines(env, ceilings)[1])
    return 0


def _parse_dtypes(names):
    """(dtypes or None, error message or None)."""
    import torch

    if names is None:
        return None, None
    unknown = [n for n in names if n.lower() not in DTYPES]
    if unknown:
        return None, f"unknown dtype(s) {', '.join(unknown)}; supported: bf16, fp16, fp32"
    return tuple(dict.fromkeys(getattr(torch, DTYPES[n.lower()]) for n in names)), None


def _bench(args) -> int:
    from .bench.harness import Options, measure_ceilings, run_suites
    from .bench.report import environment, print_report, write_json
    from .bench.suites import SUITES, get_suite

    def error(msg: str) -> int:
        print(f"flashfuse bench: error: {msg}", file=sys.stderr)
        return 2

    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        return error(f"unknown suite(s) {', '.join(unknown)}; available: {', '.join(SUITES)}")
    suites = [get_suite(n) for n in (args.suites or list(SUITES))]
    dtypes, msg = _parse_dtypes(args.dtype)
    if msg:
        return error(msg)
    if args.rounds < 1:
        return error(f"--rounds {args.rounds}: the number of timings per row must be >= 1")
    opts = Options(quick=args.quick, dtypes=dtypes, providers=args.providers, only=args.only,
                   progress=not args.no_progress, cuda_graph=args.cuda_graph, rounds=args.rounds)
    if args.only:
        import re
        try:
            re.compile(args.only)
        except re.error as exc:
            return error(f"--only {args.only!r} is not a regular expression: {exc}")
    if args.providers:
        known = {p.name for s in suites for p in s.providers(opts)}
        missing = [p for p in args.providers if p not in known]
        if missing:
            return error(f"unknown provider(s) {', '.join(missing)}; available: {', '.join(sorted(known))}")
    if args.list:
        _list(suites, opts)
        return 0

    start = time.perf_counter()
    env = environment(opts.device)
    ceilings = measure_ceilings(opts.device)
    os.makedirs(args.out, exist_ok=True)
    options = {"suites": [s.name for s in suites], "quick": args.quick, "dtype": args.dtype,
               "providers": args.providers, "only": args.only,
               "timing": "cuda-graph replays" if args.cuda_graph else "do_bench (eager calls)",
               "rounds": args.rounds}
    json_path = os.path.join(args.out, "results.json")
    # Saved after every case too, so a run cut short (a time limit, a crash) keeps what it measured.
    rows = run_suites(suites, opts, ceilings,
                      on_case=lambda so_far: write_json(json_path, env, ceilings, suites, so_far, options))
    print_report(env, ceilings, suites, rows, detail=args.detail)
    path = write_json(json_path, env, ceilings, suites, rows, options)
    written = [path]
    if not args.no_plots:
        if importlib.util.find_spec("matplotlib") is None:
            print("matplotlib is not installed: no plots (pip install 'flashfuse[bench]')")
        else:
            from .bench.plots import write_plots
            written += write_plots(args.out, suites, rows, env)
    counts = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    print(f"{len(rows)} rows ({summary}) in {time.perf_counter() - start:.1f} s; wrote {', '.join(written)}")
    if not env["timings_meaningful"]:
        print("(CPU run: the timings above mean nothing; run on a GPU for numbers.)")
    if args.strict and any(r.status in ("WRONG", "ERROR") for r in rows):
        return 1
    return 0


def _list(suites, opts) -> None:
    from .bench.harness import Runner

    runner = Runner(opts, ceilings={})
    for suite in suites:
        cases, selected = runner.select(suite)
        print(f"{suite.name}: {suite.description}")
        for p in suite.providers(opts):
            chosen = p.name in {s.name for s in selected}
            flags = (" (needs CUDA)" if p.needs_cuda else "") + ("" if chosen else " (not selected)")
            print(f"  provider {p.name:<15} [{p.kind}] {p.description}{flags}")
        for c in cases:
            print(f"  case {c.name}")


if __name__ == "__main__":
    sys.exit(main())
