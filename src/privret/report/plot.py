"""The privacy-utility plot: NDCG@10 against epsilon, one line per method, references as lines
(zero-shot, the original pairs and the rows made without private data, epsilon 0, which a log axis
cannot place).

Rendered with matplotlib's Agg backend (no display) to PNG bytes, which the HTML inlines as a
``data:`` URI. epsilon is on a log axis; ``inf`` (a non-private run of a method) is drawn at a
separate position at the right end, labelled "∞" and separated by a break in the line.

Error bars (NDCG@10 only) show each row's 95% paired bootstrap interval of its difference to
zero-shot (:mod:`privret.evaluate.statistics`), drawn around the point: a bar that clears the
zero-shot line is a gain the test queries support. Rows without per-query scores get no bar.
"""

from __future__ import annotations

import io
import math

from privret.evaluate.statistics import Versus
from privret.report.collect import RunData, method_label

METRIC = "ndcg@10"
_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def epsilon_ticks(epsilons) -> dict[float, str]:
    """One x tick per target epsilon: ledger values that round alike (7.992, 7.996 -> "8") share one."""
    ticks: dict[float, str] = {}
    for e in sorted(epsilons):
        label = f"{e:.2g}"
        if label not in ticks.values():
            ticks[e] = label
    return ticks


def _bar(versus: Versus, value: float) -> tuple[float, float] | None:
    """The interval of the difference to zero-shot, placed around the row's NDCG@10 ``value``."""
    if versus.ci is None:
        return None
    low, high = versus.ci
    return value - versus.delta + low, value - versus.delta + high


def privacy_utility_png(run: RunData, *, metric: str = METRIC, width: float = 8.0, height: float = 4.8,
                        dpi: int = 110) -> bytes | None:
    """PNG bytes of the plot, or None when there is no private row to plot."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float, tuple[float, float] | None]]] = {}  # (epsilon, value, bar)
    for r in run.rows:
        if r.is_reference or r.epsilon is None or metric not in r.metrics:
            continue
        value = float(r.metrics[metric])
        bar = _bar(run.versus[r.key], value) if metric == METRIC else None
        series.setdefault(r.method, []).append((r.epsilon, value, bar))
    styles = {"zero-shot": ("--", "#555555"), "original": (":", "#000000")}  # the rows without private data: -.
    references = [(r.label, float(r.metrics[metric]), styles.get(r.method, ("-.", "#8c8c00"))) for r in run.rows
                  if r.is_reference and metric in r.metrics]
    if not series and not references:
        return None
    finite = [e for pts in series.values() for e, _, _ in pts if math.isfinite(e)]
    lo, hi = (min(finite), max(finite)) if finite else (1.0, 10.0)
    inf_x = hi * 4 if finite else 10.0

    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    for i, (method, points) in enumerate(sorted(series.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        points.sort(key=lambda p: p[0])
        fin = [(e, v, bar) for e, v, bar in points if math.isfinite(e)]
        inf = [(inf_x, v, bar) for e, v, bar in points if not math.isfinite(e)]
        if fin:
            ax.plot([e for e, _, _ in fin], [v for _, v, _ in fin], marker="o", color=colour, linewidth=2,
                    label=method_label(method))
        if inf:
            ax.plot([x for x, _, _ in inf], [v for _, v, _ in inf], marker="s", linestyle="none", color=colour,
                    label=None if fin else method_label(method))
        bars = [(x, v, bar) for x, v, bar in fin + inf if bar is not None]
        if bars:
            ax.errorbar([x for x, _, _ in bars], [v for _, v, _ in bars], fmt="none", ecolor=colour, capsize=3,
                        yerr=[[v - lo for _, v, (lo, _) in bars], [hi - v for _, v, (_, hi) in bars]])
    for label, value, (style, colour) in references:
        ax.axhline(value, linestyle=style, color=colour, linewidth=1.5, label=f"{label}: {value:.3f}")
    ax.set_xscale("log")
    labels = {**epsilon_ticks(finite), inf_x: "∞"}
    ticks = [t for t in labels if t != inf_x]
    if any(not math.isfinite(e) for pts in series.values() for e, _, _ in pts):
        ticks.append(inf_x)
        ax.axvline(math.sqrt(hi * inf_x), color="#dddddd", linewidth=1)
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[t] for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(lo / 1.6, (inf_x if inf_x in ticks else hi) * 1.6)
    ax.set_xlabel("ε (privacy budget; smaller is more private)")
    ax.set_ylabel(metric.upper().replace("@", "@"))
    ax.set_title(f"Privacy-utility: {run.name}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return buffer.getvalue()
