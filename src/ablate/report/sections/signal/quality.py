"""Each series' signal figures (report.json's series "quality"): monotonicity, seed and checkpoint spread, SNR
(describe.signal_noise), distance from chance and from the choices-only baseline, the ranking's consistency over
checkpoints against the final one, and the criteria they pass (what the recommendation, choose.py, gates on).
"""

from __future__ import annotations

import math

import numpy as np

from ablate.report.inputs import match
from ablate.report.inputs.runs import ANSWER_BLIND, BASELINE_METRICS, PRIOR_CONTROLLED, Run, TaskInfo, is_accuracy
from ablate.report.schema import Chance, Criteria, Quality, Ranking
from ablate.report.schema.quality import ChanceCheckpoint, RankingCheckpoint
from ablate.report.stats import describe


def series_points(run: Run, key) -> list:
    """A run's evaluations of a (task, metric), in step order ([] where it has none)."""
    return run.scores.get(key) or []


def _common_steps(runs: list[Run], key) -> list[int]:
    steps = None
    for run in runs:
        mine = {p.step for p in series_points(run, key)}
        steps = mine if steps is None else steps & mine
    return sorted(steps or [])


def _value_at(run: Run, key, step: int):
    return next(p for p in series_points(run, key) if p.step == step)


def _pooled(points) -> tuple[float, float | None]:
    """Mean score over runs, and their mean standard error (None unless every run logged one)."""
    se = [p.stderr for p in points]
    return float(np.mean([p.value for p in points])), (float(np.mean(se)) if all(s is not None for s in se) else None)


def _chance_figures(runs: list[Run], task: TaskInfo, metric: str, sign: int, opts, finals: dict) -> Chance:
    """Distance from chance pooled over all runs: mean score vs the mean standard error (seeds score the same
    items, so their errors are not independent: averaging them, not dividing by sqrt(runs), stays conservative)."""
    key, chance = (task.key, metric), task.chance_for(metric)
    if chance is None:
        return Chance(
            chance=None,
            z_final=None,
            first_significant_step=None,
            first_significant_tokens=None,
            by_checkpoint=[],
            gain_over_choices_only=None,
            gain_z=None,
        )
    z_final = describe.chance_z(*_pooled([finals[r.label] for r in runs]), chance, sign)
    by_checkpoint = []
    for step in _common_steps(runs, key):
        points = [_value_at(r, key, step) for r in runs]
        m, s = _pooled(points)
        by_checkpoint.append(
            ChanceCheckpoint(step=step, tokens=points[0].tokens, mean=m, z=describe.chance_z(m, s, chance, sign))
        )
    first = next((c for c in by_checkpoint if c.z is not None and c.z >= opts.min_z), None)
    gain, gain_z = _gain_over_choices_only(runs, task, metric, finals)
    return Chance(
        chance=chance,
        z_final=z_final,
        first_significant_step=None if first is None else first.step,
        first_significant_tokens=None if first is None else first.tokens,
        by_checkpoint=by_checkpoint,
        gain_over_choices_only=gain,
        gain_z=gain_z,
    )


def _gain_over_choices_only(
    runs: list[Run], task: TaskInfo, metric: str, finals: dict
) -> tuple[float | None, float | None]:
    """An accuracy's mean gain over the choices-only baseline at the compared point, and that gain in standard
    errors; (None, None) where the baseline is not logged at every run's compared step."""
    baseline_key = (task.key, "acc_choices_only")
    if not metric.startswith("acc_") or metric in BASELINE_METRICS or not all(r.scores.get(baseline_key) for r in runs):
        return None, None
    # Unpaired standard error of the gain: conservative, since a metric and its baseline share items.
    gains, ses = [], []
    for run in runs:
        point = finals[run.label]
        base = next((p for p in run.scores[baseline_key] if p.step == point.step), None)
        if base is None:
            return None, None
        gains.append(point.value - base.value)
        ses.append(
            math.hypot(point.stderr, base.stderr) if point.stderr is not None and base.stderr is not None else None
        )
    gain = float(np.mean(gains))
    return gain, (describe.chance_z(gain, float(np.mean(ses)), 0.0, 1) if all(s is not None for s in ses) else None)


def _at_or_before(run: Run, key, x: int, by_tokens: bool):
    before = [p for p in series_points(run, key) if (p.tokens if by_tokens else p.step) <= x]
    return before[-1] if before else None


def _ranking_figures(runs_by_variant: dict, final: dict, key, sign: int, opts, m: match.Matched) -> Ranking:
    """Kendall tau and decision accuracy of the ranking at each checkpoint against the final ranking. Checkpoints
    are those of the run that reached the fewest tokens, up to the compared point; every run contributes its
    evaluation at or just before each (equal tokens; equal steps when token counts are unknown)."""
    variants = list(final)
    all_runs = [r for v in variants for r in runs_by_variant[v]]
    by_tokens = m.tokens is not None
    ref = min(all_runs, key=lambda r: m.points[r.label].tokens if by_tokens else m.points[r.label].step)
    end = m.points[ref.label]
    grid = [p for p in series_points(ref, key) if p.step <= end.step]
    if len(variants) < 2 or len(grid) < 2:
        return Ranking(
            by_checkpoint=[],
            tau_second_half=None,
            consistent_from_step=None,
            consistent_from_fraction=None,
            early_step=None,
            early_decision_accuracy=None,
        )
    target = [sign * final[v].mean for v in variants]
    x_of = (lambda p: p.tokens) if by_tokens else (lambda p: p.step)
    last = x_of(grid[-1])
    rows = []  # (x: where the checkpoint lies, tokens or steps; its row)
    for point in grid:
        x = x_of(point)
        at = {r.label: _at_or_before(r, key, x, by_tokens) for r in all_runs}
        if any(p is None for p in at.values()):
            continue
        now = [sign * float(np.mean([at[r.label].value for r in runs_by_variant[v]])) for v in variants]
        tau, da = describe.kendall(now, target), describe.decision_accuracy(now, target)
        rows.append((x, RankingCheckpoint(step=point.step, tokens=point.tokens, tau=tau, decision_accuracy=da)))
    consistent = _consistent_from(rows, opts.min_tau)
    early = next((r for x, r in rows if opts.early_fraction * last <= x < last), None)
    return Ranking(
        by_checkpoint=[row for _, row in rows],
        tau_second_half=describe.mean_or_none([r.tau for x, r in rows if last / 2 <= x < last]),
        consistent_from_step=None if consistent is None else consistent[1].step,
        consistent_from_fraction=None if consistent is None else consistent[0] / last,
        early_step=None if early is None else early.step,
        early_decision_accuracy=None if early is None else early.decision_accuracy,
    )


def _consistent_from(rows: list[tuple[int, RankingCheckpoint]], min_tau: float) -> tuple[int, RankingCheckpoint] | None:
    """The earliest checkpoint (with its x) from which every later tau clears min_tau, the last one excluded (it is
    the final ranking itself); None when the one before the last already fails."""
    consistent = None
    for x, row in reversed(rows[:-1]):
        if row.tau is None or row.tau < min_tau:
            break
        consistent = x, row
    return consistent


def quality(
    runs_by_variant: dict, final: dict, task: TaskInfo, metric: str, sign: int, opts, m: match.Matched
) -> Quality:
    key = (task.key, metric)
    runs = [r for rs in runs_by_variant.values() for r in rs]
    rho = {
        r.label: describe.spearman(
            [p.step for p in series_points(r, key)], [sign * p.value for p in series_points(r, key)]
        )
        for r in runs
    }
    # the noise at the comparison point: each run's last last_k checkpoints up to the one compared (not its end)
    tails = {
        r.label: [p.value for p in series_points(r, key) if p.step <= m.points[r.label].step][-opts.last_k :]
        for r in runs
    }
    spread = describe.signal_noise([f.mean for f in final.values()], list(tails.values()))
    monotonicity = describe.mean_or_none(rho.values())
    chance = _chance_figures(runs, task, metric, sign, opts, m.points)
    ranking = _ranking_figures(runs_by_variant, final, key, sign, opts, m)
    criteria = _criteria(monotonicity, ranking, chance, spread.snr, metric, opts)
    return Quality(
        monotonicity=monotonicity,
        monotonicity_per_run=rho,
        seed_spread=describe.mean_or_none([f.seed_std for f in final.values()]),
        checkpoint_spread=describe.mean_or_none([describe.std(t) for t in tails.values()]),
        signal=spread.signal,
        noise=spread.noise,
        snr=spread.snr,
        noise_checkpoints=spread.noise_checkpoints,
        chance=chance,
        ranking=ranking,
        criteria=criteria,
        # baselines and answer-blind figures never decide a task, whatever their criteria
        passes=metric not in BASELINE_METRICS | ANSWER_BLIND and all(ok is True for ok in criteria.applied().values()),
    )


def _criteria(
    monotonicity: float | None, ranking: Ranking, c: Chance, snr: float | None, metric: str, opts
) -> Criteria:
    """The gates that apply to this metric, each shown (None: not computable, never a pass)."""
    criteria = {
        "monotone": None if monotonicity is None else monotonicity >= opts.min_monotonicity,
        "consistent": None if ranking.tau_second_half is None else ranking.tau_second_half >= opts.min_tau,
    }
    if c.chance is not None or is_accuracy(metric):
        # a metric with a chance level (every accuracy: one whose task logs none cannot show it is past chance)
        above = None
        if c.z_final is not None:
            past_prior = c.gain_z is None or c.gain_z >= opts.min_z or metric in PRIOR_CONTROLLED
            above = c.z_final >= opts.min_z and past_prior
        criteria["above_chance"] = above
    if opts.min_snr is not None:
        criteria["snr"] = None if snr is None else snr >= opts.min_snr
    return Criteria(**criteria)
