"""Which metric each task enters the decision set through: every metric is a candidate, judged by what the runs show.

Gates (analyze.py puts them in each series' quality["criteria"]): monotone over training (mean Spearman rho of score
vs step >= min_monotonicity), ranking consistent over checkpoints (mean Kendall tau over the second half >=
min_tau), SNR >= min_snr when one is set, and, for metrics that have a chance level (accuracies, zero-chance
margins), above chance: an accuracy at chance never counts, and accuracies that do not divide answer priors out
(all but acc_pmi) must also beat the choices-only baseline. The baselines themselves are never candidates.

Among the metrics that pass, the best measured: the highest decision accuracy from the smaller scales to the
largest (when a scale axis gives one), then the highest SNR, then monotonicity, then tau; remaining ties go to the
task's primary metric. Every key measures signal or noise and is symmetric in the variants: which variant a metric
favours never enters the choice, so choosing cannot make a winner.
"""

from __future__ import annotations

import math

import numpy as np

from ablate.report import stats
from ablate.report.across import mean_da
from ablate.report.decide import decision_series
from ablate.report.runs import VAL_TASK, TaskInfo


def _f(x, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    return "0" if abs(x) < 1e-9 else f"{x:.{digits}g}"  # float rounding of an exact 0 (a score exactly at chance)


def figures(s: dict, da: float | None) -> dict:
    q = s["quality"]
    return {
        "monotonicity": q["monotonicity"],
        "snr": q["snr"],
        "tau": q["ranking"]["tau_second_half"],
        "decision_accuracy": da,
    }


def _failures(s: dict, opts) -> list[str]:
    """Why a metric fails its gates, with the figure against the threshold."""
    q, c, out = s["quality"], s["quality"]["chance"], []
    crit = q["criteria"]
    if crit.get("above_chance") is False:
        if c["z_final"] is not None and c["z_final"] < opts.min_z:
            out.append(f"at chance (z {_f(c['z_final'])} < {opts.min_z:g})")
        else:
            out.append(f"not past the choices-only baseline (gain z {_f(c['gain_z'])} < {opts.min_z:g})")
    if crit.get("monotone") is False:
        out.append(f"not monotone (rho {_f(q['monotonicity'])} < {opts.min_monotonicity:g})")
    if crit.get("consistent") is False:
        out.append(f"ranking not consistent (tau {_f(q['ranking']['tau_second_half'])} < {opts.min_tau:g})")
    if crit.get("snr") is False:
        out.append(f"SNR {_f(q['snr'])} < {opts.min_snr:g}")
    out += [f"{name.replace('_', ' ')} not computable" for name, ok in crit.items() if ok is None]
    return out


def _key(fig: dict) -> tuple:
    """Higher is better measured: decision accuracy across scales (-1 when not measured), SNR, rho, tau."""
    return tuple(
        -math.inf if x is None else x
        for x in (
            -1.0 if fig["decision_accuracy"] is None else fig["decision_accuracy"],
            fig["snr"],
            fig["monotonicity"],
            fig["tau"],
        )
    )


def _lost_on(mine: dict, best: dict) -> str:
    for name, label in (("decision_accuracy", "DA"), ("snr", "SNR"), ("monotonicity", "rho"), ("tau", "tau")):
        a, b = mine[name], best[name]
        if (a if a is not None else -math.inf) != (b if b is not None else -math.inf):
            return f"passes; lower {label} ({_f(a)} vs {_f(b)})"
    return "passes; tied, the primary metric or the first listed is taken"


def _describe(metric: str, fig: dict) -> str:
    da = "" if fig["decision_accuracy"] is None else f", DA {_f(fig['decision_accuracy'])} from smaller scales"
    return f"{metric} (rho {_f(fig['monotonicity'])}, SNR {_f(fig['snr'])}, tau {_f(fig['tau'])}{da})"


def choose(task: TaskInfo, series: list[dict], across: list[dict], opts) -> dict:
    """One task: the metric it enters through (or none), its figures, and why each other metric lost."""
    series = sorted(series, key=lambda s: not s["primary"])  # ties go to the primary
    figs = {s["metric"]: figures(s, mean_da(across, task.key, s["metric"])) for s in series}
    passing = [s for s in series if s["quality"]["passes"]]
    top = max(passing, key=lambda s: _key(figs[s["metric"]])) if passing else None
    others, outright = [], []
    for s in series:
        if s is top:
            continue
        if s["baseline"]:
            why = "a baseline (answer priors), never a signal"
        elif s["quality"]["passes"]:
            why = _lost_on(figs[s["metric"]], figs[top["metric"]])
        else:
            fails = _failures(s, opts)
            outright.append(any("not computable" not in f for f in fails))
            why = "; ".join(fails)
        others.append({"metric": s["metric"], "why": why})
    name = task.key[:-3] if task.key.endswith(":cf") else task.key
    lost = "; ".join(f"{o['metric']}: {o['why']}" for o in others)
    if top is not None:
        text = f"{name}: {_describe(top['metric'], figs[top['metric']])}" + (f". Others: {lost}" if lost else "")
        status = "chosen"
    else:
        status = "no_signal" if all(outright) else "not_assessable"
        head = "a decision metric whatever its criteria" if task.key == VAL_TASK else "no metric passes"
        text = f"{name}: {head}. {lost}"
    return {
        "task": task.key,
        "metric": top["metric"] if top else None,
        "status": status,
        "figures": figs[top["metric"]] if top else None,
        "others": others,
        "text": text,
        "direction": top["direction"] if top else None,
        "passing_metrics": [s["metric"] for s in passing],
    }


def recommendation(group: dict, tasks: dict[str, TaskInfo], across: list[dict], opts) -> dict:
    """Each task's choice (validation loss's too: it is always a decision metric), the suite of chosen metrics, the
    tasks without one, and the aggregate over the decision metrics."""
    choices, suite, rejected = [], [], []
    for task in tasks.values():
        mine = [s for s in group["series"] if s["task"] == task.key]
        if not mine:
            continue
        c = choose(task, mine, across, opts)
        choices.append(c)
        if c["metric"] is not None:
            suite.append({k: c[k] for k in ("task", "metric", "direction", "passing_metrics")})
        else:
            rejected.append(
                {"task": task.key, "status": c["status"], "reasons": {o["metric"]: o["why"] for o in c["others"]}}
            )
    aggregate = {}
    variants = group["variants"]
    # over the decision metrics only: validation loss and the suite (a task at chance would add noise, not signal)
    chosen = decision_series(group, {"suite": suite})
    if chosen and len(variants) >= 2:
        zs, ranks = {v: [] for v in variants}, {v: [] for v in variants}
        for s in chosen:
            sign = 1 if s["direction"] == "higher" else -1
            names = [v for v in variants if v in s["final"]]
            m = np.array([sign * s["final"][v]["mean"] for v in names])
            z = (m - m.mean()) / m.std() if m.std() > 0 else np.zeros_like(m)
            order = (-m).argsort(kind="stable").argsort() + 1  # rank 1 = best
            for v, zv, rv in zip(names, z, order):
                zs[v].append(float(zv))
                ranks[v].append(int(rv))
        aggregate = {
            v: {"mean_z": stats.mean_or_none(zs[v]), "mean_rank": stats.mean_or_none(ranks[v]), "tasks": len(zs[v])}
            for v in variants
        }
    return {
        "thresholds": {
            "min_monotonicity": opts.min_monotonicity,
            "min_z": opts.min_z,
            "min_tau": opts.min_tau,
            "min_snr": opts.min_snr,
        },
        "choices": choices,
        "suite": suite,
        "rejected": rejected,
        "aggregate": aggregate,
        "aggregate_over": [[s["task"], s["metric"]] for s in chosen],
    }
