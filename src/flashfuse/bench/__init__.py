"""Benchmarks: ``flashfuse bench [suite]`` (see ``flashfuse.cli``) on the harness in ``harness``.

The protocol (do_bench median, ceilings measured each run, correctness before timing, % of ceiling,
peak memory) is ../shared/BENCHMARKING.md; ``harness``'s docstring says how a suite plugs in.
"""

from .harness import (
    Call,
    Case,
    Options,
    Provider,
    Row,
    Skip,
    Suite,
    attention_bytes,
    attention_flops,
    elementwise_bytes,
    measure_ceilings,
    run_suites,
)
from .report import environment, print_report, write_json

__all__ = ["Call", "Case", "Options", "Provider", "Row", "Skip", "Suite", "attention_bytes", "attention_flops",
           "elementwise_bytes", "environment", "measure_ceilings", "print_report", "run_suites", "write_json"]
