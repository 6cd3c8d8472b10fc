"""The signal section's text: report.json's series "quality", subject_floor, across_scales and recommendation ->
"Task quality" per scale group, "Groups left out (subject SNR floor)", "Which signal to trust at which scale" and
"Recommendation" (fmt.Section each; text/render.py places them). Every number shown is read from the records.
"""

from __future__ import annotations

import json

from ablate.report.schema import AcrossScales, Group, Recommendation, Report, ScalePairs, ScaleRow, Series, SubjectFloor
from ablate.report.sections.signal import figures
from ablate.report.text.fmt import Section, fmt, fmt_ci, fmt_ratio, rung_label


def _verdict(s: Series) -> str:
    q = s.quality
    if s.baseline:
        return "baseline (answer priors)"
    if q.passes:
        return "PASS"
    criteria = q.criteria.applied().items()
    parts = [f"fails {k}" for k, ok in criteria if ok is False]
    return "; ".join(parts + [f"{k} not computable" for k, ok in criteria if ok is None])


_QUALITY_COLUMNS = [
    "task",
    "metric",
    "mono",
    "seed sd",
    "ckpt sd",
    "SNR",
    "z chance",
    "first sig (tokens)",
    "vs choices-only",
    "tau 2nd half",
    "consistent from",
    "DA early",
    "verdict",
]


def _quality_legend(o: dict) -> str:
    """What each column of the signal criteria means, with the options' thresholds."""
    return (
        "Per task and metric. mono: Spearman rho of score vs step, mean over runs (oriented: + = improving). "
        "seed sd: "
        f"spread of final scores over seeds. ckpt sd: spread over a run's last {o['last_k']} checkpoints. SNR "
        "(Signal and Noise, AI2 2025): the largest gap between the variants' final scores over the runs' mean "
        "std over their last checkpoints (the paper's relative dispersion over relative std, both relative to the "
        "same mean). z chance: final score past chance in standard errors (accuracies and zero-chance margins "
        f"only); first sig: first checkpoint where z >= {o['min_z']:g}. vs choices-only: accuracy gain over the "
        "choices-only baseline (z). tau 2nd half: mean Kendall tau of the ranking at each checkpoint in the second "
        f"half vs the final ranking. consistent from: share of training after which tau stays >= {o['min_tau']:g}. "
        f"DA early: decision accuracy at the first checkpoint past {o['early_fraction']:g} of training."
    )


def _quality_row(s: Series) -> list[str]:
    """A series' row of the signal criteria, in _QUALITY_COLUMNS' order."""
    q, c, r = s.quality, s.quality.chance, s.quality.ranking
    gain = "" if c.gain_over_choices_only is None else f"{fmt(c.gain_over_choices_only, 3)} (z {fmt(c.gain_z, 3)})"
    first = (
        "n/a"
        if c.chance is None
        else ("never" if c.first_significant_tokens is None else fmt(c.first_significant_tokens))
    )
    return [
        s.task,
        s.metric,
        fmt(q.monotonicity, 3),
        fmt(q.seed_spread, 3),
        fmt(q.checkpoint_spread, 3),
        fmt(q.snr, 3),
        fmt(c.z_final, 3),
        first,
        gain,
        fmt(r.tau_second_half, 3),
        fmt(r.consistent_from_fraction, 2),
        fmt(r.early_decision_accuracy, 3),
        _verdict(s),
    ]


def quality_section(group: Group, suffix: str, report: Report) -> Section:
    """A scale group's "Task quality": every series' signal criteria, then each primary series' ranking at each
    checkpoint against the final one."""
    sec = Section(f"Task quality{suffix}", [_quality_legend(report.options)])
    sec.tables.append(("Signal criteria", _QUALITY_COLUMNS, [_quality_row(s) for s in group.series]))
    for s in group.series:
        by = s.quality.ranking.by_checkpoint
        if s.primary and by:
            sec.tables.append(
                (
                    f"{s.task} [{s.metric}]: ranking at each checkpoint vs final",
                    ["step", "tokens", "Kendall tau", "decision accuracy"],
                    [[fmt(x.step), fmt(x.tokens), fmt(x.tau, 3), fmt(x.decision_accuracy, 3)] for x in by],
                )
            )
    return sec


def subject_floor_section(entries: list[SubjectFloor]) -> Section | None:
    """The groups (subjects) the SNR floor left out of their task's average (None: no floor, or none measured)."""
    if not entries:
        return None
    e0 = entries[0]
    where = (
        "chosen on these runs (one scale: in-sample, which favours groups where these variants happen to differ)"
        if e0.in_sample
        else f"chosen on the smaller scales ({', '.join(str(s) for s in e0.chosen_at)}) only, applied at every scale"
    )
    bullets = [
        f"{e.task} [{e.metric}]: "
        + (
            f"{len(e.dropped)} of {e.groups} left out: {', '.join(e.dropped)}"
            if e.dropped
            else (e.note or f"none of {e.groups} below the floor")
        )
        for e in entries
    ]
    return Section(
        "Groups left out (subject SNR floor)",
        [
            f"Groups (subjects) whose SNR is below {e0.floor:g} are left out of their task's average, per "
            "metric, at "
            f"every checkpoint of every run; {where}. Per-group SNRs are in report.json (subject_floor)."
        ],
        bullets=bullets,
    )


def recommendation_section(rec: Recommendation) -> Section:
    """The metric each task enters the decision set through, why the others lost, the aggregate."""
    t = rec.thresholds
    snr = "" if t.min_snr is None else f", SNR >= {t.min_snr:g}"
    sec = Section(
        "Recommendation",
        [
            f"Every metric is a candidate, judged by what the runs show. Gates: monotonicity >= "
            f"{t.min_monotonicity:g}, Kendall tau over the second half >= {t.min_tau:g}{snr}, and for metrics "
            "with "
            f"a chance level (accuracies, zero-chance margins) a final score >= {t.min_z:g} standard errors past "
            "chance (and past the choices-only baseline for accuracies other than acc_pmi): an accuracy at chance "
            "never "
            "counts. A continuous metric (no chance level) must also track its task: with a scale axis its decision "
            "accuracy against the task's target > 0.5, else a rank correlation >= 0.5 with the task's accuracy over "
            "the runs' checkpoints (with validation loss where the accuracy is at chance: weaker evidence). Of the "
            "metrics that pass, a task enters the decision set through the best measured: with a scale axis the "
            "highest decision accuracy from the smaller scales against the task's target at the largest (evidence "
            "target_da), or against validation loss where that target is at chance (val_da); then SNR, then "
            "monotonicity, then tau (alone without a scale axis: consistency). The choice never looks at which "
            "variant a metric favours.",
            "Metric chosen per task, and why the others lost:",
        ],
    )
    sec.bullets = [c.text for c in rec.choices]
    if not rec.suite:
        sec.paragraphs.append("No task passed: no early-signal suite for this setup.")
    if rec.aggregate:
        rows = [
            [v, fmt(a.mean_z, 3), fmt(a.mean_rank, 3), str(a.tasks)]
            for v, a in sorted(rec.aggregate.items(), key=lambda kv: -(kv[1].mean_z or 0))
        ]
        sec.tables.append(
            (
                "Aggregate over the decision metrics, validation loss and the suite (z: each metric's "
                "variant means standardised, oriented so higher is better; rank 1 = best)",
                ["variant", "mean z", "mean rank", "metrics"],
                rows,
            )
        )
    rows = [[c.task, c.metric or "none", c.evidence, ", ".join(c.passing_metrics)] for c in rec.choices]
    sec.tables.append(("Decision set", ["task", "metric", "ranked by", "passing metrics"], rows))
    return sec


def _da_cell(r: ScaleRow) -> str:
    """Target DA with its interval where one is shown (the note under the table says why one is not)."""
    return f"{fmt(r.decision_accuracy, 3)} {fmt_ci(r.ci)}" if r.ci else fmt(r.decision_accuracy, 3)


def _cells(a: AcrossScales, smaller: list) -> list[str]:
    """One table row: per smaller scale SNR, DA (with its interval where shown), DA vs val loss, self-agreement;
    then SNR at the largest and the three means."""
    by = {json.dumps(r.scale): r for r in a.by_scale}
    cells = []
    for sc in smaller:
        r = by.get(json.dumps(sc))
        if r is None:
            cells += ["", "", "", ""]
            continue
        cells += [fmt(r.snr, 3), _da_cell(r), fmt(r.decision_accuracy_val, 3), fmt(r.self_agreement, 3)]
    means = [a.mean_decision_accuracy, a.mean_decision_accuracy_val, a.mean_self_agreement]
    note = " (primary)" if a.primary else " (baseline)" if a.metric == "acc_choices_only" else ""
    return [a.task, a.metric + note] + cells + [fmt(a.snr, 3)] + [fmt(m, 3) for m in means]


def _notes(across: list[AcrossScales]) -> list[str]:
    """Why intervals are not shown, where seeds were not paired, and which targets are at chance."""
    out = [n[0].upper() + n[1:] for n in sorted({r.ci_note for a in across for r in a.by_scale if r.ci_note})]
    unpaired = sorted({a.task for a in across for r in a.by_scale if r.paired is False})
    if unpaired:
        out.append("Variants ran different seed lists, so their seeds were resampled apart: " + ", ".join(unpaired))
    at_chance = sorted({f"{a.task} ({a.target.metric})" for a in across if a.target and not a.target_valid})
    if at_chance:
        out.append(
            "Targets at chance at the largest scale (no ranking to validate a metric against: read DA vs val loss): "
            + ", ".join(at_chance)
        )
    return out


def across_section(
    across: list[AcrossScales], scales: list, bootstrap: int, tuning: list[str] | None = None
) -> Section | None:
    """The report's "Which signal to trust at which scale" (text/render.py places it): SNR at each scale, and decision
    accuracy to the largest against the task's target, against validation loss, and against itself. scales: the
    groups' scales, the largest last; bootstrap: the DA intervals' replicates (--bootstrap); tuning: the cautions
    where the variants hold a drifting hyperparameter fixed across the scales (report["scale_pairs"])."""
    if not across:
        return None
    largest, smaller = scales[-1], scales[:-1]
    per_scale = ("SNR @{}", "DA {}->" + str(largest), "DA vs val loss {}->" + str(largest), "self {}->" + str(largest))
    header = (
        ["task", "metric"]
        + [h.format(sc) for sc in smaller for h in per_scale]
        + [f"SNR @{largest}", "mean DA", "mean DA vs val loss", "mean self"]
    )
    paragraphs = [
        "Decision accuracy (DA, as DataDecide defines it): the share of variant pairs a metric at a smaller scale "
        f"orders as the target orders them at the largest ({largest}); each side oriented by its own direction, a "
        "pair tied at the smaller scale counts one half. DA: against the task's primary metric at the largest "
        "scale (validation loss: its own loss). DA vs val loss: against validation loss at the largest scale. "
        "Self: against the same metric at the largest scale (whether it agrees with itself, not whether it "
        "predicts the task). With few variants DA moves in coarse steps (2 variants: 0, 1/2 or 1). Kendall tau "
        "against the target is in report.json (across_scales).",
        f"95% interval of DA: a bootstrap ({bootstrap} replicates) that resamples seed indices "
        "once for every variant of a scale (seed k shares data order and init), each scale apart, and the eval "
        "items once per replicate for every seed (the same items on every seed: the noise model's persistent part; "
        "without per-item files, each variant's logged standard error); shown only where it covered the true DA in "
        ">= 90% of constructed ladders at that number of seeds (docs/reports.md).",
    ]
    return Section(
        "Which signal to trust at which scale",
        paragraphs + _notes(across) + [t[0].upper() + t[1:] + "." for t in tuning or []],
        tables=[("SNR and decision accuracy by scale", header, [_cells(a, smaller) for a in across])],
    )


def pairs_section(pairs: ScalePairs | None, scale_fields: list[str], with_images: bool) -> Section | None:
    """ "Decision accuracy against compute" (text/render.py places it): every pair of scales on each task's primary
    metric, the smaller's ranking against the larger's, beside their compute ratio; None without pairs."""
    if pairs is None or not pairs.metrics:
        return None
    paragraphs = [
        "Decision accuracy against compute (DataDecide, arXiv 2504.11393): for every pair of scales, the share of "
        "variant pairs the smaller scale's mean final score orders as the larger's does (each task's primary "
        "metric, the same on both sides), beside the ratio of their compute per run (mean training FLOPs: "
        "summary.json's, else FLOPs per token x tokens). The interval is the one above: seeds resampled once per "
        "scale for every variant and the items every seed scored, the DA recomputed over all pairs at once (pairs "
        "sharing a variant move together), shown only where its measured coverage at the seeds holds. With few "
        "variants there are few pairs: the DA moves in coarse steps."
    ]
    bullets = [m.text for m in pairs.metrics] + [t.text[0].upper() + t.text[1:] + "." for t in pairs.mixed_tuning]
    notes = sorted({p.ci_note for m in pairs.metrics for p in m.pairs if p.ci_note})
    bullets += [n[0].upper() + n[1:] + "." for n in notes + ([pairs.note] if pairs.note else [])]
    rows = [
        [
            m.task,
            m.metric,
            rung_label(p.small, scale_fields),
            rung_label(p.large, scale_fields),
            fmt_ratio(p.compute_ratio) if p.compute_ratio else "n/a",
            str(len(p.variants)),
            str(p.pairs),
            str(p.seeds),
            fmt(p.decision_accuracy, 3),
            fmt_ci(p.ci, 3) if p.ci else (p.ci_note or "n/a"),
        ]
        for m in pairs.metrics
        for p in m.pairs
    ]
    header = ["task", "metric", "proxy", "target", "compute ratio", "variants", "pairs", "seeds", "DA", "95% CI"]
    compute = [[rung_label(c.scale, scale_fields), fmt(c.flops, 4), str(c.runs), c.note] for c in pairs.compute]
    images = []
    if with_images and (drawn := figures.pairs_png(pairs)):
        images.append(("decision accuracy against compute ratio", drawn))
    return Section(
        "Decision accuracy against compute",
        paragraphs,
        tables=[
            ("Every pair of scales", header, rows),
            ("Compute per run", ["scale", "FLOPs", "runs", "note"], compute),
        ],
        images=images,
        bullets=bullets,
    )
