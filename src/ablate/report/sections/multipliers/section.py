"""report["multipliers"]: each variant's effect in the currency of compute, from the compute points of a ladder.

inputs/compute_points.py reads the points from the run folders (each arm at several budgets, annealed ends);
estimate.py fits the baseline's loss-vs-compute curve per rung and inverts it. This module names the arms as the
rest of the report does (a method's name without the scale suffix), picks each variant's row at its main budget (the
budget every arm shares: the one the pairwise tests see), keeps its other budgets beside it (does M depend on the
budget?), and lays out what the plots and the headline read: the baseline's fit with its band, every seed's point,
the trend across rungs and, when asked, a projection labelled as an extrapolation.
"""

from __future__ import annotations

import math

import numpy as np

from ablate.report.sections.multipliers import checks
from ablate.report.sections.multipliers import baseline_curve
from ablate.report.sections.multipliers import estimate as mult
from ablate.report.sections.multipliers.intervals import LEVEL, curve_band, trend
from ablate.report.inputs.compute_points import BudgetSplit, ComputePoint
from ablate.report.inputs.runs import ReportError, Run, TaskInfo, scale_order, scale_value
from ablate.report.schema import Multipliers

BAND_POINTS = 40  # where the baseline's fitted curve and band are drawn


def _resolve_floor(value, base_cells: dict) -> tuple[float | str | None, str]:
    """The E the curves use, and in words why. "auto": one E shared across the rungs wherever there are >= 2 (the
    irreducible loss of one data and tokenizer does not depend on the model's size: Chinchilla's L(N, D) has one
    E), fitted at a lone rung with >= 4 compute points; a lone rung of 3 points cannot give E: it must be pinned.
    value: options.floor_value's ("auto", "shared" or a number)."""
    if value == "shared" and len(base_cells) < 2:
        return None, "--multiplier-floor shared needs the baseline at >= 2 rungs; pin E with a value instead"
    if value not in ("auto", "shared"):
        return value, f"E pinned at {value:g} (given)"
    if len(base_cells) >= 2:
        return "shared", "E (the irreducible loss) shared across the rungs, each rung with its own A and alpha"
    if all(len(cells) >= baseline_curve.MIN_FREE_E_POINTS for cells in base_cells.values()):
        return None, f"E fitted at the one rung (>= {baseline_curve.MIN_FREE_E_POINTS} compute points)"
    return None, "one rung with < 4 compute points: E cannot be fitted; pin it with --multiplier-floor VALUE"


def _floor_words(words: str, shared_e, carried: bool, base_cells: dict) -> str:
    """The floor's words: a shared E's value, whether its uncertainty is in the intervals, and where it came out at
    0 (the edge of its search), that the points do not pin it."""
    if shared_e is None:
        return words
    lowest = min(c.mean for cells in base_cells.values() for c in cells)
    said = f"{words}: E = {shared_e:.4g}"
    if carried:
        said += " (fitted with every rung's points; its uncertainty is in each interval)"
    elif shared_e <= baseline_curve.EDGE_SHARE * lowest:
        said += (
            " (the edge of its search: the points do not pin E, or they bend in a way E + A C^-alpha cannot "
            "follow; a curvature warning: each rung's M is read from a local quadratic through its points, "
            "without E)"
        )
    return said


def _throughput(points: list[ComputePoint], runs: dict[str, Run], arm_label: dict[str, str]) -> dict:
    """(method, rung) -> measured FLOP/s on this machine at the main budget: the run's FLOPs per token x its tokens
    per second, mean over seeds."""
    speeds: dict = {}
    for p in (p for p in points if p.main):
        s = runs[p.run].summary or {}
        tokens, tps = s.get("tokens"), s.get("tokens_per_second")
        if p.flops and isinstance(tokens, (int, float)) and tokens > 0 and _positive(tps):
            speeds.setdefault((arm_label[p.arm], p.rung), []).append(p.flops / tokens * tps)
    return {key: float(np.mean(v)) for key, v in speeds.items()}


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _params(points: list[ComputePoint], runs: dict[str, Run], arm_label: dict[str, str]) -> dict:
    params = {}
    for p in (p for p in points if p.main):
        if isinstance(n := (runs[p.run].summary or {}).get("params"), int):
            params[(arm_label[p.arm], p.rung)] = n
    return params


def _curve_entry(curve, level: float) -> dict:
    if isinstance(curve, str):
        return {"fit": None, "note": curve}
    flops = [c.flops for c in curve.cells]
    grid = np.geomspace(min(flops) / 1.5, max(flops) * 1.5, BAND_POINTS)
    return {
        "fit": {"E": curve.E, "A": curve.A, "alpha": curve.alpha, "E_pinned": curve.pinned},
        "band": curve_band(curve, grid, level),
        "note": "",
    }


def _points_entry(p: ComputePoint, label: str) -> dict:
    return {
        "method": label,
        "rung": scale_value(p.rung),
        "seed": p.seed,
        "run": p.run,
        "budget": list(p.budget),
        "main": p.main,
        "flops": p.flops,
        "loss": p.loss,
        "counts": p.counts,
        "why": p.why,
    }


def _budget_entry(row: dict) -> dict:
    keep = ("flops", "loss", "multiplier", "interval", "extrapolated", "seeds", "note")
    return {k: row[k] for k in keep}


def _item_losses(points: list[ComputePoint], runs: dict[str, Run], val_task: TaskInfo | None) -> tuple[dict, str]:
    """run label -> its per-item validation losses at its last step, in one id order per rung, for the persistent
    item term of the interval; ({}, why) for a rung where a run lacks them or the runs scored different items."""
    found, missing = {}, []
    for rung in sorted({p.rung for p in points}, key=scale_order):
        mine = [p for p in points if p.rung == rung]
        rows = {p.run: runs[p.run].items(val_task, runs[p.run].last_step) if val_task else None for p in mine}
        if any(r is None for r in rows.values()) or len({frozenset(r) for r in rows.values()}) != 1:
            missing.append(str(scale_value(rung)))
            continue
        ids = sorted(next(iter(rows.values())), key=str)
        for label, by_id in rows.items():
            found[label] = np.array([float(by_id[i]["loss"]) for i in ids])
    why = ""
    if missing:
        why = (
            f"rung(s) {', '.join(missing)}: no per-item validation losses shared by every compute point (eval_items/"
            f"step_N/val_loss.jsonl): the interval there has no persistent item term"
        )
    return found, why


def recorded_baseline(runs: list[Run]) -> str | None:
    """The baseline the runs' experiment file named (config.json's multiplier_baseline), or None; several: an error."""
    names = sorted({b for r in runs if isinstance(b := r.config.get("multiplier_baseline"), str) and b})
    if len(names) > 1:
        raise ReportError(
            f"the runs record different multiplier_baseline values ({', '.join(names)}); name one with --baseline"
        )
    return names[0] if names else None


def multipliers_section(
    split: BudgetSplit,
    main_runs: list[Run],
    label_of: dict[str, str],
    opts,
    floor_option,
    val_task: TaskInfo | None = None,
    baseline_from: str = "--baseline",
) -> Multipliers | None:
    """report["multipliers"], or None where the runs hold no compute points and no baseline was named. The fits
    work in dicts (estimate.py, intervals.py); what leaves the section is its record.

    label_of: a main run's variant folder -> its method name (group_by_scale's labels); floor_option: the checked
    --multiplier-floor (options.floor_value); val_task: validation loss, whose per-item files give the item term;
    baseline_from: where the baseline's name came from, as errors and the section say it."""
    methods = sorted(set(label_of.values()))
    if opts.baseline is None:
        return _without_baseline(len(split.extra), methods)
    if opts.baseline not in methods:
        raise ReportError(
            f"{baseline_from} {opts.baseline}: no such method in these runs; they have: {', '.join(methods)}"
        )
    arm_label = {p.arm: label_of.get(p.arm, p.arm) for p in split.points}  # its main-budget folder -> the method
    counted = [p for p in split.points if p.counts]
    items, items_note = _item_losses(counted, {r.label: r for r in split.main + split.extra}, val_task)
    points = [
        baseline_curve.Point(arm_label[p.arm], p.rung, p.seed, p.flops, p.loss, items=items.get(p.run)) for p in counted
    ]
    base_cells = {rung: cs for (arm, rung), cs in baseline_curve.group_cells(points).items() if arm == opts.baseline}
    floor, floor_words = _resolve_floor(floor_option, base_cells)
    found = mult.multipliers(points, opts.baseline, level=LEVEL, floor=floor)
    rows = _main_rows(found["rows"], counted, arm_label, {r.label: r for r in main_runs}, opts.baseline)
    trends, projections = _trends(rows, opts.multiplier_target)
    section = {
        "baseline": opts.baseline,
        "baseline_from": baseline_from,
        "level": LEVEL,
        "floor": {
            "option": opts.multiplier_floor,
            "used": floor,
            "E": found["E"],
            "E_carried": found["E_carried"],
            "text": _floor_words(floor_words, found["E"], found["E_carried"], base_cells),
        },
        "rungs": [
            {"rung": scale_value(rung), "baseline": _curve_entry(found["curves"][rung], LEVEL)}
            for rung in sorted(found["curves"], key=scale_order)
        ],
        "rows": rows,
        "trends": trends,
        "projections": projections,
        "bootstrap": _bootstrap(points, rows, opts.baseline, floor if floor != "shared" else found["E"]),
        "points": [_points_entry(p, arm_label[p.arm]) for p in split.points],
        "left_out": [f"{p.run}: {p.why or 'not annealed'}" for p in split.points if not p.counts],
        "notes": list(split.notes) + ([items_note] if items_note else []),
        "note": "",
    }
    return Multipliers.from_json(section)


def _without_baseline(extra: int, methods: list[str]) -> Multipliers | None:
    """No baseline named: nothing to say without compute points, else how to name one."""
    if not extra:
        return None
    return Multipliers(
        baseline=None,
        rows=[],
        note=(
            f"{extra} run(s) are compute points (an arm at another budget; out of the comparisons above): name "
            f"the baseline for compute multipliers with --baseline METHOD (one of: {', '.join(methods)})"
        ),
    )


def _main_rows(
    found: list[dict], counted: list[ComputePoint], arm_label: dict[str, str], runs: dict[str, Run], baseline: str
) -> list[dict]:
    """Each arm's rows at its main budget (the one the pairwise tests see), as new dicts: the rung as the report
    names it, the wall-clock multiplier from the main runs' measured speed, the parameters, and beside each its
    data multipliers at every budget (`by_budget`); in order of variant, rung and kind."""
    main_flops: dict = {}
    for p in counted:
        if p.main:
            main_flops.setdefault((arm_label[p.arm], p.rung), []).append(p.flops)
    budgets: dict = {}
    for row in found:
        if row["kind"] == "data":
            budgets.setdefault((row["variant"], row["rung"]), []).append(_budget_entry(row))
    speeds, params = _throughput(counted, runs, arm_label), _params(counted, runs, arm_label)
    rows = []
    for row in found:
        key = (row["variant"], row["rung"])
        at = main_flops.get(key)
        if at is None or abs(math.log(row["flops"] / float(np.mean(at)))) >= 1e-3:
            continue  # another budget: in by_budget only
        shown = dict(row)
        if row["multiplier"] is not None and key in speeds and (baseline, row["rung"]) in speeds:
            shown["wall_clock_multiplier"] = row["multiplier"] * speeds[key] / speeds[(baseline, row["rung"])]
        if "frontier_rung" in row:
            shown["frontier_rung"] = scale_value(row["frontier_rung"])
        rung_key = list(row["rung"])
        rows.append(
            {
                **shown,
                "rung": scale_value(row["rung"]),
                "rung_key": rung_key,
                "params": params.get(key),
                "by_budget": budgets.get((row["variant"], tuple(rung_key)), []),
            }
        )
    order = {rung: i for i, rung in enumerate(sorted({p.rung for p in counted}, key=scale_order))}
    return sorted(rows, key=lambda r: (r["variant"], order.get(tuple(r["rung_key"]), 0), r["kind"]))


def _trends(rows: list[dict], target: float | None) -> tuple[dict, dict | None]:
    """Each variant's trend of its data multiplier across rungs, and its projection to `target` where asked."""
    data_rows = {
        v: [r for r in rows if r["variant"] == v and r["kind"] == "data"] for v in {r["variant"] for r in rows}
    }
    trends = {v: trend(rs, LEVEL) for v, rs in sorted(data_rows.items())}
    if target is None:
        return trends, None
    return trends, {v: checks.projection(rs, target, LEVEL) for v, rs in sorted(data_rows.items())}


def _bootstrap(points: list, rows: list[dict], baseline: str, floor) -> dict:
    """The seed bootstrap beside each data row's interval, where it has >= 5 seeds (a check, not the interval)."""
    out = {}
    for row in rows:
        if row["kind"] != "data" or row["multiplier"] is None or row["seeds"] < mult.MIN_BOOT_SEEDS:
            continue
        rung = tuple(row["rung_key"])
        found = checks.bootstrap_interval(points, row["variant"], baseline, rung, floor=floor, flops=row["flops"])
        out[f"{row['variant']} at {scale_value(rung)}"] = found
    return out
