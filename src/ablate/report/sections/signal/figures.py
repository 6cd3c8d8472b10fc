"""The signal section's plot, drawn from report["scale_pairs"] (its record) only, as a base64 PNG (the Agg canvas and
text shown as written: text/plots.py's png() and as_written())."""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from ablate.report.schema import ScalePairs
from ablate.report.text.plots import png


def pairs_png(pairs: ScalePairs) -> str | None:
    """Each pair of scales' decision accuracy (its interval as error bars, where shown) against log2 of their
    compute ratio, one series per task's primary metric."""
    drawn = [(m, [p for p in m.pairs if p.compute_ratio and p.decision_accuracy is not None]) for m in pairs.metrics]
    drawn = [(m, ps) for m, ps in drawn if ps]
    if not drawn:
        return None
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.add_subplot()
    for m, ps in drawn:
        x = [math.log2(p.compute_ratio) for p in ps]
        y = [p.decision_accuracy for p in ps]
        err = [
            [p.decision_accuracy - p.ci[0] if p.ci else 0 for p in ps],
            [p.ci[1] - p.decision_accuracy if p.ci else 0 for p in ps],
        ]
        ax.errorbar(x, y, yerr=err, marker="o", linestyle="", capsize=3, label=f"{m.task} [{m.metric}]")
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=0.8)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("log2 compute ratio (proxy / target)")
    ax.set_ylabel("decision accuracy")
    ax.set_title("decision accuracy of each pair of scales against their compute ratio (dotted: chance)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return png(fig)
