"""The sweep section's plots, drawn from report["sweep"] (its record) only, as base64 PNGs (the Agg canvas and text
shown as written: text/plots.py's png() and as_written())."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from ablate.report.schema.sweep import BatchView, Drift, Heatmap, LrView, ScaleView
from ablate.report.text.fmt import hp_name
from ablate.report.text.plots import png


def _fig():
    fig = Figure(figsize=(5.2, 3.4))
    return fig, fig.add_subplot()


def heatmap_png(hm: Heatmap, metric: str) -> str | None:
    """The metric over two axes, each cell annotated with its value (blank where the grid has no run)."""
    if not hm or not hm.x_values or not hm.y_values:
        return None
    m = np.array([[np.nan if v is None else v for v in row] for row in hm.mean], float)
    fig, ax = _fig()
    image = ax.imshow(np.ma.masked_invalid(m), cmap="viridis_r", aspect="auto", origin="lower")
    fig.colorbar(image, ax=ax, label=metric)
    finite = m[np.isfinite(m)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0
    for i, row in enumerate(m):
        for j, v in enumerate(row):
            if np.isfinite(v):  # dark text on the light (low-loss) end of viridis_r, light text elsewhere
                ax.text(
                    j, i, f"{v:.4g}", ha="center", va="center", fontsize=7, color="black" if v < middle else "white"
                )
    ax.set_xticks(
        range(len(hm.x_values)), [f"{v:g}" if isinstance(v, float) else str(v) for v in hm.x_values], fontsize=7
    )
    ax.set_yticks(range(len(hm.y_values)), [str(v) for v in hm.y_values], fontsize=7)
    ax.set_xlabel(hm.x)
    ax.set_ylabel(hm.y)
    fixed = ", ".join(f"{k}={v}" for k, v in hm.fixed.items())
    ax.set_title(f"{metric}, mean over seeds" + (f" ({fixed})" if fixed else ""), fontsize=9)
    return png(fig)


def lr_png(views: list[LrView], metric: str) -> str | None:
    """The metric against LR per context, a band from the lowest to the highest seed, the fitted quadratic over
    its window and the optimum with its CI."""
    if not views:
        return None
    fig, ax = _fig()
    for v in views:
        (line,) = ax.plot(v.lrs, v.mean, marker="o", markersize=3, label=v.label)
        if max(v.n_seeds) > 1:
            ax.fill_between(v.lrs, v.min, v.max, color=line.get_color(), alpha=0.2, linewidth=0)
        f = v.fit
        if f.coef:
            x = np.linspace(np.log10(f.window[0]), np.log10(f.window[1]), 50)
            ax.plot(10**x, np.polyval(f.coef, x), linestyle="--", linewidth=1, color=line.get_color())
        if f.lr_opt is not None:
            err = None if not f.ci else [[f.lr_opt - f.ci[0]], [f.ci[1] - f.lr_opt]]
            ax.errorbar(
                [f.lr_opt], [f.value_opt], xerr=err, marker="*", markersize=9, capsize=3, color=line.get_color()
            )
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel(metric)
    ax.set_title("final score against LR (star: fitted optimum, 95% CI)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return png(fig)


def loss_curves_png(ctx: BatchView) -> str | None:
    """Each batch size's loss curve (at its best LR) against tokens, with the target losses dotted."""
    if not ctx.curves:
        return None
    fig, ax = _fig()
    for c in ctx.curves:
        (line,) = ax.plot(c.tokens, c.mean, label=f"batch {c.batch}")
        ax.fill_between(c.tokens, c.min, c.max, color=line.get_color(), alpha=0.15, linewidth=0)
    for t in ctx.targets:
        ax.axhline(t.loss, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel(ctx.curve.replace("_", " "))
    ax.set_title(f"loss curves per batch size ({ctx.label}); dotted: target losses", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return png(fig)


def es_png(ctx: BatchView) -> str | None:
    """Tokens E against steps S to reach each target loss, one point per batch size, with the fitted hyperbola
    E = E_min S / (S - S_min) and the WSD quadratic stage around its vertex."""
    rows = [t for t in ctx.targets if t.points]
    if not rows:
        return None
    fig, ax = _fig()
    for t in rows:
        s = np.array([p.steps for p in t.points])
        e = np.array([p.tokens for p in t.points])
        (dots,) = ax.plot(s, e, "o", markersize=4, label=f"L={t.loss:.4g}")
        crit, wsd = t.critical, t.wsd
        if crit.status == "fit":
            grid = np.geomspace(max(s.min() / 1.1, crit.s_min * 1.05), s.max() * 1.1, 60)
            ax.plot(grid, crit.e_min * grid / (grid - crit.s_min), color=dots.get_color(), linewidth=1)
        if wsd.status == "vertex":  # the quadratic stage over the three points it was fitted to
            grid = np.linspace(wsd.window_s[0], wsd.window_s[1], 60)
            ax.plot(grid, np.polyval(wsd.coef, grid), color=dots.get_color(), linewidth=1, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # log-axis minor labels collide over a short range
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("steps S")
    ax.set_ylabel("tokens E")
    ax.set_title("E vs S per target loss (solid: hyperbola fit; dashed: WSD quadratic)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return png(fig)


def power_law_png(scale: ScaleView, metric: str) -> str | None:
    """The best score at each model size against parameters, with the fitted L(N) = E + A N^-alpha."""
    sizes = scale.sizes
    if not sizes:
        return None
    fig, ax = _fig()
    n = np.array([s.params for s in sizes], float)
    ax.plot(n, [s.mean for s in sizes], "o", label="best cell per size")
    for s in sizes:
        ax.plot([s.params] * len(s.finals), s.finals, ".", color="grey", markersize=3)
    fit = scale.fit
    if fit and fit.status == "fit":
        grid = np.geomspace(n.min() / 1.5, n.max() * 1.5, 60)
        ax.plot(
            grid,
            fit.E + fit.A * grid**-fit.alpha,
            linewidth=1,
            label=f"E={fit.E:.3g} + {fit.A:.3g} N^-{fit.alpha:.3g}",
        )
    ax.set_xscale("log")
    ax.set_xlabel("parameters N")
    ax.set_ylabel(metric)
    ax.set_title("score against model size (grey: seeds)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return png(fig)


def drift_png(drifts: list[Drift]) -> str | None:
    """Each scale's optimum (its interval as error bars; a bound as a triangle pointing the way it may lie) against
    the scale, both on log2 axes, with the fitted line 2^(intercept + slope log2 scale)."""
    if not any(p.optimum is not None or p.bound is not None for d in drifts for p in d.points):
        return None
    fig, ax = _fig()
    for d in drifts:
        label = hp_name(d.hyperparameter) + ("" if d.label == "all" else f" ({d.label})")
        vertex = [p for p in d.points if p.optimum is not None]
        color = None
        if vertex:
            y = np.array([p.optimum for p in vertex])
            err = np.array([[y_ - p.ci[0], p.ci[1] - y_] if p.ci else [0, 0] for p, y_ in zip(vertex, y)]).T
            bars = ax.errorbar([p.scale for p in vertex], y, yerr=err, marker="o", linestyle="", capsize=3, label=label)
            color = bars[0].get_color()
        for p in (p for p in d.points if p.bound is not None):
            marker = "v" if p.status == "at_most" else "^"
            (mark,) = ax.plot([p.scale], [p.bound], marker, color=color, markersize=7)
            color = mark.get_color()
        if d.slope is not None and d.intercept is not None:
            s = np.geomspace(min(p.scale for p in d.points), max(p.scale for p in d.points), 30)
            line = f"{2**d.slope:.2g}x per doubling"
            ax.plot(s, 2 ** (d.intercept + d.slope * np.log2(s)), linestyle="--", color=color, linewidth=1, label=line)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel(drifts[0].scale)
    ax.set_ylabel(f"optimum {hp_name(drifts[0].hyperparameter)}")
    ax.set_title("optimum against scale (95% intervals; triangles: bounds at a grid's edge)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return png(fig)
