"""Run folders -> every figure of the report, as one record (schema.Report, report.json). Rendering reads only that
record, as read back from report.json.

Per scale group (one group without a scale axis), per task and metric ("series"): final scores with CIs, pairwise
tests, curves, and the signal criteria (sections/signal/quality.py); then every task x metric's SNR and decision
accuracy across scales (sections/signal/across.py) and for every pair of scales against their compute ratio
(sections/signal/ladder.py), each task's best measured metric (sections/signal/choose.py),
and the decisions and headline at the largest scale (sections/decisions/). Comparisons are like with like
(match.py): equal tokens, identical item sets.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from ablate.report.stats import describe, noise
from ablate.report.inputs import failures, logged, match, tokenizers
from ablate.report.inputs.changes import variant_changes
from ablate.report.inputs.curves import curve, logged_curves
from ablate.report.inputs.overview import overview as runs_overview
from ablate.report.inputs.compute_points import BudgetSplit, split_budgets
from ablate.report.options import Options, floor_value, recorded
from ablate.report.sections.decisions import families, pairs
from ablate.report.sections.decisions import headline as words
from ablate.report.sections.sequential.headline import OPTIONAL_STOPPING_NOTE, sequential_headline
from ablate.report.sections.multipliers import render as compute_words
from ablate.report.sections.multipliers.section import multipliers_section, recorded_baseline
from ablate.report.sections.sequential import section as study_section
from ablate.report.sections.signal import choose, subjects
from ablate.report.sections.signal.across import Resample, Resamples, across_scales
from ablate.report.sections.signal.ladder import scale_pairs
from ablate.report.sections.signal.quality import quality, series_points
from ablate.report.sections.sweep.section import sweep_section
from ablate.report import schema
from ablate.report.schema import Report, Sequential, Tokenizers
from ablate.report.sections.tokenizers.section import tokenizers_section
from ablate.report.inputs.runs import (
    ANSWER_BLIND,
    BASELINE_METRICS,
    LOGGED_TASK,
    VAL_TASK,
    Point,
    ReportError,
    Run,
    TaskInfo,
    direction_name,
    group_by_scale,
    load_runs,
    task_infos,
)
from ablate.text import natural_key


def _series_run(variant: str, run: Run, points: list[Point]) -> schema.SeriesRun:
    """A run's logged scores of one series."""
    return schema.SeriesRun(
        variant=variant,
        seed=run.seed,
        steps=[p.step for p in points],
        tokens=[p.tokens for p in points],
        values=[p.value for p in points],
        stderr=[p.stderr for p in points],
    )


def _final_scores(runs_by_variant: dict, m: match.Matched, opts) -> tuple[dict, dict, dict | None, dict]:
    """Per variant: run-level scores (each run's mean over the compared items at the compared evaluation), their
    mean, seed sd and its interval under the tests' noise model (noise.mean_interval). Also returns the scores,
    (seeds, items) matrices and each run's logged standard error for the tests."""
    final, scores, items, stderrs = {}, {}, ({} if m.ids else None), {}
    for variant, runs in runs_by_variant.items():
        runs = sorted(runs, key=lambda r: r.seed)
        scores[variant] = {r.seed: m.score(r.label) for r in runs}
        stderrs[variant] = {r.seed: m.points[r.label].stderr for r in runs}
        if items is not None:
            items[variant] = np.array([[m.values[r.label][i] for i in m.ids] for r in runs])
        matrix = items[variant] if items is not None else None
        ci = noise.mean_interval(scores[variant], matrix, stderrs[variant], 1 - opts.alpha)
        values = [scores[variant][r.seed] for r in runs]
        final[variant] = schema.Final(
            mean=float(np.mean(values)),
            seed_std=describe.std(values),
            values=values,
            seeds=[r.seed for r in runs],
            steps=[m.points[r.label].step for r in runs],
            tokens=[m.points[r.label].tokens for r in runs],
            ci=ci,
            n_items=len(m.ids) if m.ids else None,
            averaged=[len(m.windows[r.label]) for r in runs],  # evaluations averaged
        )
    return final, scores, items, stderrs


def analyze_series(
    runs_by_variant: dict, task: TaskInfo, metric: str, opts: Options, matched: match.Matched | None = None
) -> tuple[schema.Series, Resample] | None:
    """A task x metric's figures, and beside them what the DA bootstrap resamples (sections/signal/across.py)."""
    key = (task.key, metric)
    with_scores = {v: [r for r in rs if series_points(r, key)] for v, rs in runs_by_variant.items()}
    with_scores = {v: rs for v, rs in with_scores.items() if rs}
    if not with_scores:
        return None
    m = matched or match.match(
        [r for rs in with_scores.values() for r in rs], task, metric, opts.min_shared_items, opts.average_last
    )
    if m.left_out:
        return None
    sign = task.sign_for(metric)
    final, scores, items, stderrs = _final_scores(with_scores, m, opts)
    pairwise = pairs.pairwise(list(final), scores, items, sign, opts, stderrs, final)
    series = schema.Series(
        task=task.key,
        metric=metric,
        primary=task.is_primary(metric),
        direction=direction_name(sign),
        chance=task.chance_for(metric),
        baseline=metric in BASELINE_METRICS,
        diagnostic=metric in ANSWER_BLIND,
        has_items=items is not None,
        compared_at=schema.ComparedAt(
            tokens=m.tokens, at_last=m.at_last, text=match.token_note(m.points, m.tokens, m.at_last)
        ),
        runs={r.label: _series_run(v, r, series_points(r, key)) for v, rs in with_scores.items() for r in rs},
        final=final,
        # the leader from the paired estimates; once the families are applied, read again from the tested pairs
        best=pairs.leader(direction_name(sign), final, pairwise),
        pairwise=pairwise,
        curve={v: curve([series_points(r, key) for r in rs]) for v, rs in with_scores.items()},
        quality=quality(with_scores, final, task, metric, sign, opts, m),
    )
    return series, Resample(m.ids, items, stderrs)


def analyze_group(
    scale, runs_by_variant: dict[str, list[Run]], tasks: dict[str, TaskInfo], opts: Options
) -> tuple[schema.Group, dict[tuple[str, str], Resample]]:
    """A scale's figures, and each series' Resample by (task, metric)."""
    finished = {
        v: [r for r in rs if r.status == "finished"]
        for v, rs in sorted(runs_by_variant.items(), key=lambda kv: natural_key(kv[0]))
    }
    finished = {v: rs for v, rs in finished.items() if rs}
    series, resamples, mismatches = [], {}, {}
    for task in tasks.values():
        for metric in task.metrics:
            runs = [r for rs in finished.values() for r in rs if series_points(r, (task.key, metric))]
            if not runs:
                continue
            m = match.match(runs, task, metric, opts.min_shared_items, opts.average_last)
            if m.mismatch and (task.key not in mismatches or metric == task.primary):
                mismatches[task.key] = m.mismatch  # one per task: the items are the task's, not the metric's
            if (analyzed := analyze_series(finished, task, metric, opts, m)) is not None:
                series.append(analyzed[0])
                resamples[task.key, metric] = analyzed[1]
    runs = [r for rs in finished.values() for r in rs]
    group = schema.Group(
        scale=scale,
        failures=failures.failed_seeds(runs_by_variant),
        variants=list(finished),
        seeds={v: [r.seed for r in rs] for v, rs in finished.items()},
        changes=variant_changes(finished, opts.baseline),
        shape_differences=match.shape_differences(runs),
        item_mismatch=list(mismatches.values()),
        train_loss={v: curve([r.train_loss for r in rs]) for v, rs in finished.items()},
        logged=logged_curves(finished),
        series=series,
    )
    return group, resamples


def _cannot_compute(group: schema.Group, tasks: dict[str, TaskInfo], has_scale: bool, min_seeds: int) -> list[str]:
    notes = []
    seeds = {v: len(s) for v, s in group.seeds.items()}
    if seeds and min(seeds.values()) < 2:
        few = ", ".join(f"{v} has {n}" for v, n in seeds.items() if n < 2)
        notes.append(
            f"seed spread, seed bands, seed-level p-values, seeds needed and seed resampling in CIs: need "
            f">= 2 seeds per variant ({few})"
        )
    if seeds and min(seeds.values()) < min_seeds:
        few = ", ".join(f"{v} has {n}" for v, n in seeds.items() if n < min_seeds)
        notes.append(
            f"significance of a difference: needs >= {min_seeds} seeds per variant ({few}); the report "
            f"gives the seeds a test would need instead"
        )
    checkpoints = [len(r.steps) for s in group.series for r in s.runs.values()]
    most = max(checkpoints, default=0)
    if most < 3:
        notes.append(f"monotonicity (Spearman rho): needs >= 3 evaluated checkpoints per run (have {most})")
    if most < 2:
        notes.append(
            "checkpoint spread, SNR noise, Kendall tau and decision accuracy over training: need >= 2 "
            f"evaluated checkpoints per run (have {most})"
        )
    if len(group.variants) < 2:
        notes.append(
            f"pairwise tests, SNR signal, Kendall tau, decision accuracy and the aggregate score: need >= 2 "
            f"finished variants (have {len(group.variants)})"
        )
    # val bpb across tokenizers has no pairable items by design (sections/tokenizers/ says so)
    missing = sorted(
        {s.task for s in group.series if not s.has_items and s.metric != tokenizers.BPB and s.task != LOGGED_TASK}
    )
    if missing:
        notes.append(
            "confidence intervals and item-level p-values (seed-level tests still run, on the logged "
            "scores): no per-item files (eval_items/) for " + ", ".join(missing)
        )
    if all(t == VAL_TASK for t in tasks):
        notes.append(
            "task scores: the runs have no evals.jsonl (no task evals ran); the report covers validation loss only"
        )
    if not has_scale:
        notes.append("decision accuracy across scales: needs a scale axis (ablate report --scale model.d_model)")
    return notes


def _as_floored(runs: list[Run], scales: list, floored: list) -> list[Run]:
    """The runs, each as the subject floor left it (subjects.apply_floor: the scales' runs in the same places)."""
    new = {id(r): f for (_, a), (_, b) in zip(scales, floored) for v in a for r, f in zip(a[v], b[v])}
    return [new.get(id(r), r) for r in runs]


def build_report(runs_dir: str | Path, opts: Options | None = None) -> Report:
    opts = opts or Options()
    start = time.perf_counter()
    runs, skipped = load_runs(runs_dir)
    experiment = runs[0].config.get("experiment") or Path(runs_dir).name
    try:
        study = study_section.read_study(runs_dir)  # an adaptive study (ablate run --until-decided): its rule, rounds
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    report = analyze_runs(runs, task_infos(runs), opts, experiment, str(runs_dir), skipped, study)
    return dataclasses.replace(report, seconds=time.perf_counter() - start)


def analyze_runs(
    runs: list[Run],
    tasks: dict[str, TaskInfo],
    opts: Options,
    experiment: str,
    runs_dir: str = "",
    skipped: list[str] | None = None,
    study: dict | None = None,
) -> Report:
    """Every figure of the report from loaded runs (build_report reads them from disk; the calibration tests build
    them in memory and run this same path). study: the adaptive study's record (study.json), whose contrasts are
    recomputed from the runs into report["sequential"]."""
    declared = logged.declared(opts, runs, tasks)  # --metric's keys, refused before any figure where none logged
    # an arm at several budgets: the comparisons see it once, at the budget every arm shares; the other budgets are
    # compute points, read by the multipliers alone (inputs/compute_points.py)
    split = split_budgets(runs, opts.scale)
    overview = runs_overview(runs, skipped or [], [r.label for r in split.extra])
    tokenizer_note, tasks = tokenizers_section(runs, tasks)  # runs of several tokenizers: validation in bits per byte
    scales = group_by_scale(split.main, opts.scale)
    opts, compute = _multipliers(runs, split, scales, tasks, opts)
    # before any figure: it changes the groups' average (new runs and tasks; those read after see them too)
    subject_floor, floored, tasks = subjects.apply_floor(scales, tasks, opts)
    runs, main = _as_floored(runs, scales, floored), _as_floored(split.main, scales, floored)
    measured = tasks | ({LOGGED_TASK: info} if (info := logged.task_info(declared)) else {})
    groups, resamples = _analyze_groups(floored, measured, opts)
    across = across_scales(groups, resamples, opts)
    decided = _decide(groups, tasks, across, opts)
    # recomputed from the runs, under the report's own like-with-like rule
    adaptive = None if study is None else study_section.study_section(runs, study, opts.max_token_gap)
    sweep = sweep_section(main, opts)  # grid() runs on their axes; None without a grid
    # every pair of scales against their compute ratio; the sweep's drift says where such comparisons mix in tuning
    pairs = scale_pairs(decided.groups, resamples, floored, (sweep and sweep.drift) or [], opts)
    headline = _headline(experiment, decided, overview, tokenizer_note, adaptive, compute, opts)
    return Report(
        schema=4,
        experiment=experiment,
        runs_dir=runs_dir,
        options=recorded(opts),
        overview=overview,
        tasks=_task_rows(tasks),
        groups=decided.groups,
        across_scales=across,
        scale_pairs=pairs,
        subject_floor=subject_floor,
        recommendation=decided.recommendation,
        inference=_stopping(decided.inference, adaptive),
        sweep=sweep,
        multipliers=compute,
        sequential=adaptive,  # None unless the folder holds an adaptive study (study.json)
        headline=headline,
        tokenizers=tokenizer_note,
        cannot_compute=_cannot_compute(decided.groups[-1], tasks, bool(opts.scale), opts.min_seeds),
        seconds=0.0,
    )


def _multipliers(
    runs: list[Run], split: BudgetSplit, scales: list, tasks: dict[str, TaskInfo], opts: Options
) -> tuple[Options, schema.Multipliers | None]:
    """The compute multipliers (sections/multipliers/; None without compute points or a baseline), and the options
    with the experiment file's multiplier_baseline where --baseline names none."""
    label_of = {r.variant: label for _, by_variant in scales for label, rs in by_variant.items() for r in rs}
    try:  # a report built in code gets the command line's check
        floor = floor_value(opts.multiplier_floor)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    baseline_from = "--baseline"
    if opts.baseline is None and (recorded := recorded_baseline(runs)) is not None:
        opts, baseline_from = dataclasses.replace(opts, baseline=recorded), "the experiment file's multiplier_baseline"
    compute = multipliers_section(split, split.main, label_of, opts, floor, tasks.get(VAL_TASK), baseline_from)
    return opts, compute


def _analyze_groups(scales: list, tasks: dict[str, TaskInfo], opts: Options) -> tuple[list[schema.Group], Resamples]:
    """Each scale's figures (the largest last), and beside them each group's Resamples."""
    analyzed = [analyze_group(scale, by_variant, tasks, opts) for scale, by_variant in scales]
    groups, resamples = [g for g, _ in analyzed], [r for _, r in analyzed]
    if opts.primary and not any(families.is_primary(s, opts) for s in groups[-1].series):
        have = sorted({f"{s.task}/{s.metric}" for s in groups[-1].series})
        raise ReportError(
            f"--primary {opts.primary}: no such task or task/metric in these runs; they have: {', '.join(have)}"
        )
    return groups, resamples


@dataclasses.dataclass(frozen=True)
class _Decided:
    """The decisions at the largest scale (the target): the groups with the target's tested series in place, the
    metric recommendation, the decision series as tested, the inference summary, and where ("at d_model=512", or ""
    without a scale axis)."""

    groups: list[schema.Group]
    recommendation: schema.Recommendation
    decisions: list[schema.Series]
    inference: schema.Inference
    where: str


def _decide(
    groups: list[schema.Group], tasks: dict[str, TaskInfo], across: list[schema.AcrossScales], opts: Options
) -> _Decided:
    target = groups[-1]  # the largest scale: what decisions are about
    recommendation = choose.recommendation(target, tasks, across, opts)
    where = f"at {','.join(opts.scale)}={target.scale}" if opts.scale else ""
    decisions = families.decision_series(target, recommendation, opts)
    family = families.family_series(target, decisions)
    inference, tested = families.apply_family(family, opts, where or "(one scale)", decisions)
    # the tested series take their place; no significant pair may put the leader behind
    as_tested = {id(s): dataclasses.replace(t, best=pairs.best(t)) for s, t in zip(family, tested)}
    target = dataclasses.replace(target, series=[as_tested.get(id(s), s) for s in target.series])
    decided = [as_tested[id(s)] for s in decisions]
    return _Decided([*groups[:-1], target], recommendation, decided, inference, where)


def _stopping(inference: schema.Inference, adaptive: Sequential | None) -> schema.Inference:
    """With an adaptive study the sequential decisions lead; the fixed-n tests stay, labelled."""
    if adaptive is None:
        return inference
    note = OPTIONAL_STOPPING_NOTE
    return dataclasses.replace(inference, valid_under_optional_stopping=False, optional_stopping_note=note)


def _headline(
    experiment: str,
    decided: _Decided,
    overview: schema.Overview,
    tokenizer_note: Tokenizers,
    adaptive: Sequential | None,
    compute: schema.Multipliers | None,
    opts: Options,
) -> schema.Headline:
    """The headline: the decisions, led by the sequential ones with an adaptive study; then what each variant is
    worth in compute, said after the decisions, never deciding one."""
    name = experiment + (f" {decided.where}" if decided.where else "")
    target, text = decided.groups[-1], tokenizer_note.text
    headline = words.headline(name, target, decided.decisions, decided.recommendation, overview, opts, text)
    if adaptive is not None:
        headline = sequential_headline(headline, adaptive, experiment)
    if compute is not None:
        headline = compute_words.with_headline(headline, compute, opts.scale)
    return headline


def _task_rows(tasks: dict[str, TaskInfo]) -> list[schema.TaskRow]:
    return [
        schema.TaskRow(task=t.key, primary=t.primary, metrics=t.metrics, chance=t.chance, n=t.n, groups=len(t.groups))
        for t in tasks.values()
    ]
