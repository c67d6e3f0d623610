"""PNG plots of a benchmark run (matplotlib's Agg canvas; no pyplot, no display needed).

A suite lists its plots as ``Plot`` entries; each becomes ``<suite>_<stem>.png`` with one panel per case
group (e.g. "hd64 causal fwd bf16") and one line per provider, the x axis being the cases' ``x`` (sequence
length, vector size). OOM rows are marked with a cross at the top of their panel.
"""

from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass

from .harness import Row, Suite

# Line style per provider kind: flashfuse solid and thick, peers dashed, PyTorch baselines dotted.
_STYLE = {"flashfuse": dict(linestyle="-", linewidth=2.2), "peer": dict(linestyle="--", linewidth=1.4),
          "baseline": dict(linestyle=":", linewidth=1.4)}


@dataclass
class Plot:
    metric: str             # a Row field, or "peak_mem_MiB"
    ylabel: str
    stem: str               # file name: <suite>_<stem>.png
    logy: bool = False
    groups: str | None = None       # regex on group names (None: every group)
    xlabel: str = ""
    logx: bool = True


def row_value(row: Row, metric: str):
    if metric == "peak_mem_MiB":
        return None if row.peak_mem_bytes is None else row.peak_mem_bytes / 2**20
    return getattr(row, metric)


def _panels(rows: list[Row], plot: Plot) -> OrderedDict:
    """group -> provider -> [(x, y or None for OOM)] for the rows this plot draws."""
    pattern = re.compile(plot.groups) if plot.groups else None
    panels: OrderedDict = OrderedDict()
    for r in rows:
        if r.x is None or (pattern and not pattern.search(r.group)):
            continue
        if r.status == "OK":
            y = row_value(r, plot.metric)
            if y is None or not math.isfinite(y):
                continue
        elif r.status == "OOM":
            y = None
        else:
            continue
        panels.setdefault(r.group, OrderedDict()).setdefault((r.provider, r.kind), []).append((r.x, y))
    return OrderedDict((g, lines) for g, lines in panels.items()
                       if any(y is not None for pts in lines.values() for _, y in pts))


def draw(rows: list[Row], plot: Plot, path: str, title: str) -> str | None:
    """Writes one PNG; returns its path, or None when no row has this metric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    panels = _panels(rows, plot)
    if not panels:
        return None
    n = len(panels)
    ncols = min(n, 4)
    nrows = math.ceil(n / ncols)
    # Inches: 4.2 x 3.3 per panel, at least 8 wide so the legend and the caption fit one panel; 0.55 on
    # top for the legend, 0.45 below for the caption.
    width, height = max(4.2 * ncols, 8.0), 3.3 * nrows + 1.0
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    handles = OrderedDict()
    for ax, (group, lines) in zip(axes.flat, panels.items()):
        top = max(y for pts in lines.values() for _, y in pts if y is not None)
        for (provider, kind), pts in lines.items():
            ok = sorted((x, y) for x, y in pts if y is not None)
            if ok:
                (line,) = ax.plot([x for x, _ in ok], [y for _, y in ok], marker="o", markersize=3.5,
                                  label=provider, **_STYLE.get(kind, {}))
                handles.setdefault(provider, line)
            for x, _ in (p for p in pts if p[1] is None):
                ax.scatter([x], [top], marker="x", color="red", zorder=5)
                ax.annotate(f"{provider} OOM", (x, top), textcoords="offset points", xytext=(-4, 6),
                            fontsize=7, color="red", ha="right")
        ax.set_title(group, fontsize=9)
        if plot.logx:
            ax.set_xscale("log", base=2)
        if plot.logy:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(plot.xlabel, fontsize=8)
        ax.set_ylabel(plot.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1 - 0.55 / height))
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center", fontsize=8, frameon=False,
               ncol=min(len(handles), int(width / 1.4)), bbox_to_anchor=(0.5, 1 - 0.05 / height))
    fig.text(0.5, 0.1 / height, title, ha="center", va="bottom", fontsize=8.5)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def write_plots(out_dir: str, suites: list[Suite], rows: list[Row], env: dict) -> list[str]:
    """Every suite's plots under out_dir; returns the paths written."""
    where = env.get("gpu") or "CPU"
    note = "" if env.get("timings_meaningful") else "  --  CPU / interpreter run: timings mean nothing"
    written = []
    for suite in suites:
        suite_rows = [r for r in rows if r.suite == suite.name]
        for plot in suite.plots:
            path = os.path.join(out_dir, f"{suite.name}_{plot.stem}.png")
            title = f"flashfuse {suite.name}: {plot.ylabel}  ({where}, {env.get('date', '')}){note}"
            if draw(suite_rows, plot, path, title):
                written.append(path)
    return written
