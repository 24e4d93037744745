"""The privacy-utility plot: NDCG@10 against epsilon, one line per method, references as lines.

Rendered with matplotlib's Agg backend (no display) to PNG bytes, which the HTML inlines as a
``data:`` URI. epsilon is on a log axis; ``inf`` (a non-private run of a method) is drawn at a
separate position at the right end, labelled "∞" and separated by a break in the line.
"""

from __future__ import annotations

import io
import math

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


def privacy_utility_png(run: RunData, *, metric: str = METRIC, width: float = 8.0, height: float = 4.8,
                        dpi: int = 110) -> bytes | None:
    """PNG bytes of the plot, or None when there is no private row to plot."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for r in run.rows:
        if r.method in ("zero-shot", "original") or r.epsilon is None or metric not in r.metrics:
            continue
        series.setdefault(r.method, []).append((r.epsilon, float(r.metrics[metric])))
    references = [(r.label, float(r.metrics[metric]), style) for r, style in
                  ((r, ("--", "#555555") if r.method == "zero-shot" else (":", "#000000")) for r in run.rows)
                  if r.method in ("zero-shot", "original") and metric in r.metrics]
    if not series and not references:
        return None
    finite = [e for pts in series.values() for e, _ in pts if math.isfinite(e)]
    lo, hi = (min(finite), max(finite)) if finite else (1.0, 10.0)
    inf_x = hi * 4 if finite else 10.0

    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    for i, (method, points) in enumerate(sorted(series.items())):
        colour = _COLOURS[i % len(_COLOURS)]
        points.sort()
        fin = [(e, v) for e, v in points if math.isfinite(e)]
        inf = [(inf_x, v) for e, v in points if not math.isfinite(e)]
        if fin:
            ax.plot([e for e, _ in fin], [v for _, v in fin], marker="o", color=colour, linewidth=2,
                    label=method_label(method))
        if inf:
            ax.plot([x for x, _ in inf], [v for _, v in inf], marker="s", linestyle="none", color=colour,
                    label=None if fin else method_label(method))
    for label, value, (style, colour) in references:
        ax.axhline(value, linestyle=style, color=colour, linewidth=1.5, label=f"{label}: {value:.3f}")
    ax.set_xscale("log")
    labels = {**epsilon_ticks(finite), inf_x: "∞"}
    ticks = [t for t in labels if t != inf_x]
    if any(not math.isfinite(e) for pts in series.values() for e, _ in pts):
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
