"""report["sweep"] -> the report's sweep sections (fmt.Section: title, paragraphs, tables of plain strings, PNGs,
bullets). Every number shown is read from the record (schema.Sweep, as report.json holds it), none recomputed.
"""

from __future__ import annotations

from ablate.report.schema import ABSENT, Report, Sweep
from ablate.report.schema.sweep import BatchView, CriticalFit, Drift, LrFit, ScaleView, Target, WsdFit
from ablate.report.sections.sweep import figures
from ablate.report.text.fmt import Section, fmt, fmt_ci, fmt_factor, hp_name


def _share(fit: LrFit | CriticalFit | WsdFit) -> str:
    """How many bootstrap replicates gave a usable fit, where the point estimate had one."""
    usable = fit.ci_share not in (None, ABSENT) and fit.status in ("fit", "vertex")
    return f" ({fit.ci_share:.0%} of replicates)" if usable else ""


def _notes(*fits: CriticalFit | WsdFit) -> str:
    if all(f.status == "too_few" for f in fits):  # one reason, said once
        return fits[0].note.split(":")[0] + ": the fits need >= 3"
    return "; ".join(f.note for f in fits if f.note)


def _optimum(fit: LrFit) -> str:
    if fit.status == "vertex":
        return fmt(fit.lr_opt, 3)
    if fit.status == "at_least":
        return f"at least {fmt(fit.bound_lr, 3)}"
    if fit.status == "at_most":
        return f"at most {fmt(fit.bound_lr, 3)}"
    return "n/a"


def _lr(sweep: Sweep, metric: str) -> tuple[list, list]:
    paragraphs = [
        f"Optimum LR: a quadratic in log10(LR) through the best LR and its two neighbours; its vertex is "
        f"the optimum. 95% CI: seeds resampled at each LR and refitted (the share of replicates whose "
        f"optimum stayed inside the grid is given). within 1%: the LRs whose fitted {metric} is within "
        f"1% of the optimum's. An optimum past the grid's edge is given as a bound, not extrapolated."
    ]
    rows = []
    for v in sweep.lr:
        f = v.fit
        within = "n/a" if not f.within else fmt_ci(f.within, 3) + (" (beyond the grid)" if f.within_beyond_grid else "")
        rows.append(
            [
                v.label,
                ", ".join(fmt(x, 3) for x in v.lrs),
                f"{fmt(f.best_lr, 3)}: {fmt(f.best_value)}",
                _optimum(f),
                fmt(f.value_opt),
                fmt_ci(f.ci, 3) + _share(f),
                within,
                f.note,
            ]
        )
    return paragraphs, [
        (
            "Optimum LR",
            ["context", "LRs", "best measured", "fitted optimum", f"fitted {metric}", "95% CI", "within 1%", "note"],
            rows,
        )
    ]


def drift_sentence(d: Drift) -> str:
    """The drift in words: the factor per doubling with its interval and what it means for comparisons at a fixed
    value, "no drift detected" where the interval holds 1x, a bound where an optimum is at its grid's edge."""
    name, where = hp_name(d.hyperparameter), "" if d.label == "all" else f" ({d.label})"
    moves = f"the optimum {name}{where} moves"
    interval = "" if not d.per_doubling_ci else "95% interval " + "–".join(fmt_factor(x) for x in d.per_doubling_ci)
    per = f"per doubling of {d.scale}"
    if d.status == "fit" and d.verdict == "drift":
        fixed = f"comparisons at a fixed {name} across these scales mix the choice with tuning"
        return f"{moves} {fmt_factor(d.per_doubling)} {per} ({interval}); {fixed}"
    if d.status == "fit" and d.verdict == "none":
        return f"{moves} {fmt_factor(d.per_doubling)} {per}: no drift detected at this design ({interval})"
    if d.status == "fit":
        return f"{moves} {fmt_factor(d.per_doubling)} {per}, no verdict: {d.note}"
    if d.status == "bounded" and d.bound_side:
        side = d.bound_side.replace("_", " ")
        return f"{moves} {side} {fmt_factor(d.per_doubling_bound)} {per}, a bound (no interval): {d.note}"
    return f"the drift of the optimum {name}{where} along {d.scale} is not measured: {d.note}"


def _point(p) -> str:
    if p.status == "vertex":
        return fmt(p.optimum, 3)
    if p.bound is not None:
        return f"{p.status.replace('_', ' ')} {fmt(p.bound, 3)}"
    return "n/a"


def _drift(drifts: list[Drift]) -> tuple[list, list]:
    paragraphs = [
        "Drift of the optimum: each scale's optimum as the optimum LR table fits it (a quadratic in log10 of the "
        "value through the best value and its two neighbours), then the least-squares slope of log2(optimum) "
        "against log2(scale): the optimum moves 2^slope x per doubling of the scale. 95% interval: seeds "
        "resampled within every (scale, value) cell (each draw's spread scaled by sqrt(n/(n-1))), every scale's "
        "optimum refitted and the slope with it, the percentile interval widened by t(df)/z for the seed degrees "
        "of freedom it rests on (Welch-Satterthwaite; two seeds give one per cell). The per-scale intervals below "
        "come from the same replicates. An optimum at its grid's edge makes the drift a bound, never a number."
    ]
    paragraphs += [(text := drift_sentence(d))[0].upper() + text[1:] + "." for d in drifts]
    rows = [
        [
            d.label,
            f"{d.scale}={fmt(p.scale, 6)}",
            _point(p),
            fmt_ci(p.ci, 3),
        ]
        for d in drifts
        for p in d.points
    ]
    fitted = [
        [
            d.label,
            hp_name(d.hyperparameter),
            d.scale,
            fmt(d.slope, 3) if d.slope is not None else "n/a",
            fmt_ci(d.ci, 3),
            fmt_factor(d.per_doubling) if d.per_doubling else "n/a",
            f"{fmt_factor(d.per_doubling_ci[0])}–{fmt_factor(d.per_doubling_ci[1])}" if d.per_doubling_ci else "n/a",
            fmt(d.df, 3),
            f"{d.ci_share:.0%}" if d.ci_share is not None else "n/a",
            d.verdict or d.status,
        ]
        for d in drifts
    ]
    header = ["context", "hyperparameter", "scale", "slope", "95% CI", "per doubling", "95% CI", "df", "usable"]
    return paragraphs, [
        ("Drift of the optimum", header + ["verdict"], fitted),
        ("Optimum per scale", ["context", "scale", "optimum", "95% CI"], rows),
    ]


def _batch_method(ctx: BatchView) -> str:
    smooth = ", smoothed over 5 logged points" if ctx.curve == "train_loss" else ""
    return (
        f"Batch size ({ctx.label}): each batch size at its best LR ({', '.join(ctx.cells)}); "
        f"{ctx.curve.replace('_', ' ')} curves averaged over seeds{smooth}. S and E: the steps and tokens at "
        f"which a curve first reaches the target loss (interpolated between logged points). Hyperbola "
        f"(McCandlish et al.): (S/S_min - 1)(E/E_min - 1) = 1, B_crit = E_min/S_min. WSD-revised E(S) (Zhou et al. "
        f"2026, arXiv 2601.05034): B_opt = E_min/S_opt at the vertex of its quadratic stage (fewest tokens to the "
        f"loss), B_min = A1 of its linear stage E = A1 S + A0 (smaller batches never reach the loss); the grid's own "
        f"bound on B_min is the smallest batch that reached the loss. MiniCPM: B_opt = 1.2110e9 / L^6.2393 "
        f"tokens, fitted to C4 loss with its own tokenizer: a reference, not comparable across corpora and "
        f"tokenizers. Batch sizes in sequences of {fmt(ctx.seq_len, 6)} tokens"
        + (
            f"; 95% CIs: seeds resampled at each batch size, curves re-read and refitted ({ctx.n_boot} replicates)."
            if ctx.n_boot
            else "."
        )
    )


def _batch_fit_row(t: Target) -> list[str]:
    """One target loss: B_crit, B_opt and B_min (fitted and the grid's own), MiniCPM's B_opt, the notes."""
    c, w, seen = t.critical, t.wsd, t.b_min_observed
    b_opt = (
        fmt(w.b_opt_sequences, 3)
        if w.status == "vertex"
        else (f"{w.status.replace('_', ' ')} {fmt(w.bound_b_sequences, 3)}" if w.bound_b else "n/a")
    )
    grid_min = (
        "n/a"
        if seen.at_most is None
        else f"<= {seen.at_most}" + (f", > {seen.above}" if seen.above is not None else "")
    )
    return [
        fmt(t.loss),
        fmt(c.b_crit_sequences, 3),
        fmt_ci(c.ci_sequences, 3) + _share(c),
        fmt(c.rel_rmse, 2),
        b_opt,
        fmt_ci(w.ci_sequences, 3) + _share(w),
        fmt(w.b_min_sequences, 3),
        grid_min,
        f"{fmt(t.minicpm.tokens, 3)} ({fmt(t.minicpm.sequences, 3)})",
        _notes(c, w),
    ]


FIT_COLUMNS = [
    "target loss",
    "B_crit",
    "95% CI",
    "hyperbola rel. rmse",
    "B_opt (WSD)",
    "95% CI",
    "B_min (WSD fit)",
    "B_min (grid)",
    "MiniCPM B_opt tokens (seqs)",
    "note",
]


def _batch(ctx: BatchView) -> tuple[list, list]:
    paragraphs = [_batch_method(ctx)]
    if ctx.note:
        paragraphs.append(f"Batch size ({ctx.label}): {ctx.note}.")
    if ctx.short_curves:
        paragraphs.append(f"Too few logged points in common over seeds, left out: {', '.join(ctx.short_curves)}.")
    points = [[fmt(t.loss), str(p.batch), fmt(p.steps), fmt(p.tokens)] for t in ctx.targets for p in t.points]
    points += [[fmt(t.loss), str(b), "not reached", ""] for t in ctx.targets for b in t.not_reached]
    tables = [
        (
            f"Steps and tokens to each target loss ({ctx.label})",
            ["target loss", "batch", "steps S", "tokens E"],
            points,
        ),
        (
            f"Batch-size fits per target loss ({ctx.label}; sequences per step)",
            FIT_COLUMNS,
            [_batch_fit_row(t) for t in ctx.targets],
        ),
    ]
    return paragraphs, tables


def _scale_paragraphs(scale: ScaleView, ranked: str) -> list[str]:
    paragraphs = [
        f"Model size over {', '.join(scale.axes)}: N = parameters (summary.json), at each size the "
        f"best cell over {ranked}. L(N) = E + A N^-alpha by least squares; 95% CIs: the best cell's "
        f"seeds resampled at each size and refitted."
    ]
    f = scale.fit
    if f and f.status == "fit":
        ci = f.ci
        paragraphs.append(
            f"Fit: E = {fmt(f.E)} {fmt_ci(ci and ci.E, 3)}, "
            f"A = {fmt(f.A)} {fmt_ci(ci and ci.A, 3)}, "
            f"alpha = {fmt(f.alpha)} {fmt_ci(ci and ci.alpha, 3)}; rmse {fmt(f.rmse, 3)}."
            + (f" {f.note}." if f.note else "")
        )
    elif f:
        paragraphs.append(f"No power-law fit: {f.note}.")
    if scale.note:
        paragraphs.append(scale.note + ".")
    return paragraphs


def _mixes_tuning(scale: ScaleView, drifts: list[Drift]) -> list[str]:
    """Beside the ranking across sizes: a swept hyperparameter among the ranked axes is held fixed in each ranked
    cell, so where its optimum drifts along the size axis the comparison mixes the choice with tuning."""
    out = []
    for d in drifts:
        if d.verdict == "drift" and d.hyperparameter in scale.ranked and d.scale in scale.axes:
            name = hp_name(d.hyperparameter)
            interval = "–".join(fmt_factor(x) for x in d.per_doubling_ci)
            out.append(
                f"The ranking across sizes compares each cell at a fixed {name}, while the optimum {name} moves "
                f"{fmt_factor(d.per_doubling)} per doubling of {d.scale} (95% interval {interval}): these "
                f"comparisons mix the choice with tuning."
            )
    return out


def _scale(scale: ScaleView, metric: str, drifts: list[Drift] | None = None) -> tuple[list, list]:
    ranked = ", ".join(scale.ranked) or "nothing else"
    sizes = [
        [
            s.label,
            fmt(s.params, 6) + ("" if s.params_from == "summary" else " (axis value)"),
            s.best,
            fmt(s.mean),
        ]
        for s in scale.sizes
    ]
    tables = [("Best cell per model size", ["size", "params", "best cell", metric], sizes)]
    if scale.decision:
        rows = [
            [d.label, fmt(d.params, 6), str(len(d.cells)), fmt(d.decision_accuracy, 3), fmt(d.tau, 3)]
            for d in scale.decision
        ]
        header = ["size", "params", "cells", "decision accuracy", "Kendall tau"]
        tables.append((f"Ranking of {ranked} at each size vs the largest", header, rows))
    tuning = _mixes_tuning(scale, drifts or []) if scale.decision else []
    return _scale_paragraphs(scale, ranked) + tuning, tables


def _drawn(images: list[tuple[str, str | None]]) -> list[tuple[str, str]]:
    """The (caption, PNG) pairs that were drawn: a plot with nothing to show is None."""
    return [(caption, png) for caption, png in images if png]


def _head(sweep: Sweep, scored: tuple[str, str], metric: str, with_images: bool) -> Section:
    """The "Sweep" section: the grid's cells, its heatmap, what could not be computed (scored: what they are scored
    by, and which way is better)."""
    cells = [
        [
            c.label,
            str(len(c.seeds)),
            fmt(c.mean),
            fmt(c.std, 3),
            fmt(c.min),
            fmt(c.max),
            fmt(c.params, 6),
        ]
        for c in sweep.cells
    ]
    tables = [("Grid cells", ["cell", "seeds", metric, "seed sd", "min", "max", "params"], cells)]
    images = []
    hm = sweep.heatmap
    if hm:
        fixed = ", ".join(f"{k}={v}" for k, v in hm.fixed.items())
        tables.append(
            (
                f"{metric}: {hm.y} (rows) x {hm.x} (columns)" + (f", at {fixed}" if fixed else ""),
                [f"{hm.y} \\ {hm.x}"] + [str(x) for x in hm.x_values],
                [[str(y)] + [fmt(v) for v in row] for y, row in zip(hm.y_values, hm.mean)],
            )
        )
        if with_images:
            images = _drawn([("heatmap", figures.heatmap_png(hm, metric))])
    opening = (
        f"Runs built by grid() over {', '.join(sweep.axes)}, one cell per combination of values, seeds averaged; "
        f'score: {scored[0]} ({scored[1]} is better). Every number here is in report.json under "sweep".'
    )
    return Section("Sweep", [opening], tables, images, bullets=list(sweep.notes))


def sections(report: Report, with_images: bool) -> list[Section]:
    """The "Sweep" section (cells, heatmap, what could not be computed), then one per view: optimum LR, batch size
    per context, the optimum's drift across sizes, model size; none without a grid. Plots are drawn only with_images
    (for HTML)."""
    sweep = report.sweep
    if sweep is None:
        return []
    m = sweep.metric
    scored = (m.source, m.direction) if m is not None else ("n/a", "lower")
    metric = "val loss" if scored[0] == "final val/loss" else "loss"
    out = [_head(sweep, scored, metric, with_images)]
    if sweep.lr:
        paragraphs, tables = _lr(sweep, metric)
        images = _drawn([("score against LR", figures.lr_png(sweep.lr, metric))]) if with_images else []
        out.append(Section("Sweep: optimum LR", paragraphs, tables, images))
    for ctx in sweep.batch or []:
        paragraphs, tables = _batch(ctx)
        drawn = [
            (f"loss curves per batch size ({ctx.label})", figures.loss_curves_png(ctx) if with_images else None),
            (f"E vs S ({ctx.label})", figures.es_png(ctx) if with_images else None),
        ]
        title = "Sweep: batch size" + ("" if ctx.label == "all" else f" ({ctx.label})")
        out.append(Section(title, paragraphs, tables, _drawn(drawn)))
    drifts = sweep.drift or []
    if drifts:
        paragraphs, tables = _drift(drifts)
        images = _drawn([("optimum against scale", figures.drift_png(drifts))]) if with_images else []
        out.append(Section("Sweep: drift of the optimum", paragraphs, tables, images))
    if sweep.scale:
        paragraphs, tables = _scale(sweep.scale, metric, drifts)
        drawn = [("score against model size", figures.power_law_png(sweep.scale, metric) if with_images else None)]
        out.append(Section("Sweep: model size", paragraphs, tables, _drawn(drawn)))
    return out
