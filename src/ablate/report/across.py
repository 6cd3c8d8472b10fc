"""Which signal to trust at which scale: for every task x metric of the largest scale, its SNR at each scale and the
decision accuracy of each smaller scale's final ranking against the largest's, beside validation loss's.

Decision accuracy (DataDecide, Magnusson et al., AI2 2025): the share of variant pairs a smaller scale orders as the
largest does. Its 95% CI is a bootstrap over seeds: each variant's run-level scores are resampled with replacement at
each scale apart, the variant means recomputed, and the decision accuracy with them. SNR is stats.signal_noise at
that scale (analyze.py's quality figures).
"""

from __future__ import annotations

from ablate.report import stats


def across_scales(groups: list[dict], opts) -> list[dict]:
    """[{task, metric, direction, snr (at the largest scale), by_scale: [{scale, variants, seeds, snr,
    decision_accuracy, ci, tau}], mean_decision_accuracy}], validation loss first; [] without a smaller scale."""
    if len(groups) < 2:
        return []
    out = []
    for target in groups[-1]["series"]:
        sign = 1 if target["direction"] == "higher" else -1
        rows = []
        for group in groups[:-1]:
            small = next(
                (s for s in group["series"] if (s["task"], s["metric"]) == (target["task"], target["metric"])), None
            )
            shared = [v for v in target["final"] if small and v in small["final"]]
            if small is None or len(shared) < 2:
                continue
            now = [sign * small["final"][v]["mean"] for v in shared]
            goal = [sign * target["final"][v]["mean"] for v in shared]
            ci = stats.bootstrap_decision_accuracy(
                [[sign * x for x in small["final"][v]["values"]] for v in shared],
                [[sign * x for x in target["final"][v]["values"]] for v in shared],
                opts.bootstrap,
                opts.seed,
            )
            rows.append(
                {
                    "scale": group["scale"],
                    "variants": shared,
                    "seeds": min(len(small["final"][v]["values"]) for v in shared),
                    "snr": small["quality"]["snr"],
                    "decision_accuracy": stats.decision_accuracy(now, goal),
                    "ci": ci,
                    "tau": stats.kendall(now, goal),
                }
            )
        if rows:
            out.append(
                {
                    "task": target["task"],
                    "metric": target["metric"],
                    "direction": target["direction"],
                    "primary": target["primary"],
                    "snr": target["quality"]["snr"],
                    "by_scale": rows,
                    "mean_decision_accuracy": stats.mean_or_none([r["decision_accuracy"] for r in rows]),
                }
            )
    return out


def mean_da(across: list[dict], task: str, metric: str) -> float | None:
    """A task x metric's decision accuracy from the smaller scales, averaged over them (None without a scale axis)."""
    return next((a["mean_decision_accuracy"] for a in across if (a["task"], a["metric"]) == (task, metric)), None)
