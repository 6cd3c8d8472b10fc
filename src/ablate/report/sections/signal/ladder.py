"""Decision accuracy against the compute ratio (report["scale_pairs"]; DataDecide, Magnusson et al. 2025, arXiv
2504.11393): on a ladder (the same variants at several scales), for every pair of scales (small, large), the share
of variant pairs the smaller scale's mean final score orders as the larger's does, beside the ratio of their
compute per run.

- The metric: each task's primary metric, the same on both sides (validation loss first); across.py holds the
  other targets (each smaller scale against the largest only).
- The interval: stats/da.py's, as across.py uses it (da.shown_interval): one replicate resamples the seed indices
  once for every variant of a scale (seed k shares data order and init) and the items every seed scored, and
  recomputes the DA over all the pairs at once, so pairs that share a variant move together; shown only where its
  measured coverage at the seeds holds. With few variants the DA moves in coarse steps (3 variants: thirds).
- Compute: a scale's mean training FLOPs per run (inputs/flops.py: summary.json's flops, else FLOPs per token x
  tokens), the ratio the smaller's over the larger's.
- Mixed with tuning: where the sweep found a hyperparameter's optimum drifting along the scale axis (its interval
  excludes no drift) and the variants hold that hyperparameter at one value across the scales, every comparison
  across them mixes the choice with tuning; the drift reaches here as a value (analyze passes the sweep's record).
"""

from __future__ import annotations

import json

import numpy as np

from ablate.report.inputs.flops import run_flops
from ablate.report.inputs.runs import ReportError, Run, get_dotted, sign_of
from ablate.report.schema import Group, Series
from ablate.report.schema.signal import MetricPairs, MixedTuning, PairDA, ScaleCompute, ScalePairs
from ablate.report.schema.sweep import Drift
from ablate.report.sections.signal.across import Resamples, agreement, da_scale
from ablate.report.stats import da
from ablate.report.stats.describe import pair_signs
from ablate.report.text.fmt import fmt_factor, fmt_ratio, hp_name, rung_label


def scale_compute(scale, by_variant: dict[str, list[Run]]) -> ScaleCompute:
    """A scale's mean FLOPs per finished run, or why there is none."""
    runs = [r for rs in by_variant.values() for r in rs if r.status == "finished"]
    counted = [run_flops(r.config, r.summary) for r in runs]
    missing = [why for flops, why in counted if flops is None]
    if not runs or missing:
        note = missing[0] if missing else "no finished run"
        return ScaleCompute(scale=scale, flops=None, runs=len(runs), note=note)
    return ScaleCompute(scale=scale, flops=float(np.mean([f for f, _ in counted])), runs=len(runs), note="")


def _primary(group: Group, task: str) -> Series | None:
    return next((s for s in group.series if s.task == task and s.primary), None)


def _pair(i: int, j: int, groups: list[Group], resamples: Resamples, compute: list[ScaleCompute], task: str, opts):
    """The pair (groups[i], groups[j]) on a task's primary metric; None where they share < 2 variants."""
    small, large = _primary(groups[i], task), _primary(groups[j], task)
    if small is None or large is None or small.metric != large.metric:
        return None
    variants = [v for v in large.final if v in small.final]
    if len(variants) < 2:
        return None
    value, _ = agreement(small, large)
    seeds = min(len(s.final[v].values) for s in (small, large) for v in variants)
    key = (task, small.metric)
    shown = da.DAInterval()
    if value is not None:
        scales = da_scale(small, resamples[i][key], variants), da_scale(large, resamples[j][key], variants)
        shown = da.shown_interval(*scales, seeds, opts.bootstrap, opts.seed)
    truth = np.array([sign_of(large.direction) * large.final[v].mean for v in variants])
    a, b = compute[i].flops, compute[j].flops
    return PairDA(
        small=groups[i].scale,
        large=groups[j].scale,
        compute_ratio=a / b if a and b else None,
        variants=variants,
        pairs=int((pair_signs(truth) != 0).sum()),
        seeds=seeds,
        decision_accuracy=value,
        target_valid=large.quality.criteria.above_chance is not False,
        ci=shown.ci,
        ci_note=shown.ci_note,
        paired=shown.paired,
        coverage=shown.coverage,
        item_noise=shown.item_noise,
    )


def pair_words(p: PairDA, scale_fields: list[str]) -> str:
    """'a 1/16-compute proxy (d_model=64 for d_model=256) ranked these 6 pairs right 80% [65, 90] of the time' (a
    missing interval's reason is said once for the section, by the renderer)."""
    proxy = f"a {fmt_ratio(p.compute_ratio)}-compute proxy" if p.compute_ratio else "a proxy of unknown compute"
    where = f"{rung_label(p.small, scale_fields)} for {rung_label(p.large, scale_fields)}"
    if p.decision_accuracy is None:
        return f"{proxy} ({where}): no pair to rank (the larger scale ties every pair)"
    ci = f" [{100 * p.ci[0]:.0f}, {100 * p.ci[1]:.0f}]" if p.ci else ""
    text = f"{proxy} ({where}) ranked these {p.pairs} pairs right {p.decision_accuracy:.0%}{ci} of the time"
    if not p.target_valid:
        text += f" (at {rung_label(p.large, scale_fields)} the metric is at chance: no ranking to validate)"
    return text


def mixed_tuning(scales: list, drifts: list[Drift], scale_fields: list[str]) -> list[MixedTuning]:
    """Each drifting hyperparameter (verdict drift, along a --scale field) that the variants present at >= 2
    scales hold at one value across them; once per hyperparameter and axis. scales: [(scale, {variant: runs})]."""
    out, seen = [], set()
    for d in drifts:
        if d.verdict != "drift" or d.scale not in scale_fields or (d.hyperparameter, d.scale) in seen:
            continue
        runs_of: dict[str, list[Run]] = {}
        at: dict[str, int] = {}
        for _, by_variant in scales:
            for v, rs in by_variant.items():
                runs_of.setdefault(v, []).extend(rs)
                at[v] = at.get(v, 0) + 1
        held = []
        for v, rs in runs_of.items():
            if at[v] < 2:
                continue  # at one scale only: no comparison across scales
            try:
                values = {json.dumps(get_dotted(r.config, d.hyperparameter), default=str) for r in rs}
            except ReportError:
                continue
            if len(values) == 1:
                held.append(v)
        if not held:
            continue
        seen.add((d.hyperparameter, d.scale))
        name, (lo, hi) = hp_name(d.hyperparameter), d.per_doubling_ci
        where = "" if d.label == "all" else f" (at {d.label})"
        text = (
            f"the variants {', '.join(held)} each hold {name} at one value across {d.scale}, while the sweep finds "
            f"the optimum {name} moves {fmt_factor(d.per_doubling)} per doubling of {d.scale}{where} (95% interval "
            f"{fmt_factor(lo)}–{fmt_factor(hi)}): comparisons across these scales mix the choice with tuning"
        )
        out.append(
            MixedTuning(
                hyperparameter=d.hyperparameter,
                scale=d.scale,
                per_doubling=d.per_doubling,
                per_doubling_ci=d.per_doubling_ci,
                variants=held,
                text=text,
            )
        )
    return out


def scale_pairs(
    groups: list[Group], resamples: Resamples, scales: list, drifts: list[Drift], opts
) -> ScalePairs | None:
    """report["scale_pairs"]: None under 2 scales. scales: [(scale, {variant: runs})] aligned with the groups."""
    if len(groups) < 2:
        return None
    compute = [scale_compute(scale, by_variant) for scale, by_variant in scales]
    metrics = []
    for s in (s for s in groups[-1].series if s.primary):
        pairs = [
            p
            for i in range(len(groups))
            for j in range(i + 1, len(groups))
            if (p := _pair(i, j, groups, resamples, compute, s.task, opts)) is not None
        ]
        if not pairs:
            continue
        pairs.sort(key=lambda p: (p.compute_ratio is None, p.compute_ratio or 0.0))
        text = f"{s.task} [{s.metric}]: " + "; ".join(pair_words(p, opts.scale) for p in pairs)
        metrics.append(MetricPairs(task=s.task, metric=s.metric, direction=s.direction, pairs=pairs, text=text))
    unknown = [c for c in compute if c.flops is None]
    note = "; ".join(f"no compute at {rung_label(c.scale, opts.scale)}: {c.note}" for c in unknown)
    return ScalePairs(
        compute=compute, metrics=metrics, mixed_tuning=mixed_tuning(scales, drifts, opts.scale), note=note
    )
