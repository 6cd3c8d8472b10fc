"""`ablate run FILE --until-decided`: a study in rounds, seeds added only where a decision is still open.

Round 1 trains every variant at the file's seeds (0, 1, 2 when it names none: an interval needs paired seeds).
After each round the contrasts on the rule's metrics are computed from the run folders
(ablate.report.sections.sequential, the report's own reading), and each variant of an open contrast gets one more seed,
until every contrast is decided, every open variant has max_seeds seeds, or the next round would exceed the budget.

The rule is recorded in <out>/<experiment>/study.json before the first run, with every round (its seeds, tokens,
time and contrasts) and the stop reason, so rerunning the command continues from the run folders and that file.
The rounds train through the caller's `train_round(runs) -> exit code` (cli_run: here, side by side, or as jobs).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from ablate import rundir
from ablate.config import ConfigError
from ablate.report.sections.sequential.words import contrast_line
from ablate.setup.overrides import parse_set_args

if TYPE_CHECKING:  # annotations only: the study's own bookkeeping needs no torch
    from ablate.setup.checks import CheckedRun

FIRST_SEEDS = [0, 1, 2]  # round 1 when the file names no seeds: three paired seeds, so an interval exists
STUDY_FLAGS = ("max_seeds", "budget", "margin", "alpha", "design", "new_study")  # refused without --until-decided


def study_rule(args, file_rule):
    """The file's `decision` (or the default rule) with the command line's flags over it, checked."""
    from ablate.report.sections.sequential.rule import DecisionRule

    rule = file_rule or DecisionRule()
    changes = {"max_seeds": args.max_seeds, "budget": args.budget, "alpha": args.alpha, "design": args.design}
    changes = {k: v for k, v in changes.items() if v is not None}
    if args.margin:
        changes["margins"] = {**rule.margins, **dict(args.margin)}
    rule = dataclasses.replace(rule, **changes)
    try:
        rule.check(f"{args.file}: decision (with the command line's flags)")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return rule


def run_tokens(checked: CheckedRun) -> int:
    """The tokens a run trains (a branch: only its own steps)."""
    return sum(checked.batch_plan) * checked.config.data.seq_len


def _has_results(folder: Path) -> bool:
    return any(folder.glob(f"*/{rundir.SEED_PREFIX}*/{rundir.SUMMARY}"))


# ---------------------------------------------------------------------------------------------------------------
# study.json


def record_rule(folder: Path, rule, new_study: bool) -> dict:
    """study.json as it stands, its rule checked against `rule`: recorded now if there is none; a change of where
    the study stops only (sequential.STOPPING_ONLY under the recorded design: a budget, futility, the anytime
    design's max_seeds) recorded in its history and continued; any other change refused (exit 2, naming what
    changed and why) unless new_study, which keeps the old file as study.<k>.json."""
    from ablate.report.sections.sequential.rule import voids_guarantee

    path = folder / rundir.STUDY
    entry = {"rule": rule.to_dict(), "set_after_results": _has_results(folder), "round": 1}
    if not path.is_file():
        study = {"rule": rule.to_dict(), "rule_history": [entry], "rounds": [], "stopped": None}
        rundir.write_json_atomic(path, study)
        return study
    study = rundir.read_json(path)
    recorded = type(rule).from_dict(study["rule"])
    rule = as_recorded(rule, study)
    changed = rule.changes_from(recorded)
    if not changed:
        return study
    fields = set(rule.changes_from(recorded, fields_only=True))
    if not new_study and not voids_guarantee(fields, recorded.design):
        entry["round"] = len(study["rounds"]) + 1
        study = {**study, "rule": rule.to_dict(), "rule_history": [*study["rule_history"], entry], "stopped": None}
        rundir.write_json_atomic(path, study)
        print(f"study rule changed where it stops only ({'; '.join(changed)}): continued", flush=True)
        return study
    if not new_study:
        why = (
            f"max_seeds fixed the {recorded.design} design's looks before round 1: changing it after results voids "
            f"its error guarantee; "
            if "max_seeds" in fields
            else ""
        )
        raise ConfigError(
            f"{path}: this study was recorded with another rule; changed: {'; '.join(changed)}; {why}allowed: the "
            f"recorded rule (rerun the command as it was), --new-study to start a new study (the old one is kept)"
            + (", or a study in the anytime design (--design anytime), valid under any extension" if why else "")
        )
    k = next(k for k in range(1, 10_000) if not (folder / f"{path.stem}.{k}{path.suffix}").exists())
    kept = folder / f"{path.stem}.{k}{path.suffix}"
    os.replace(path, kept)
    print(f"new study: the old one is kept as {kept}", flush=True)
    study = {"rule": rule.to_dict(), "rule_history": [*study["rule_history"], entry], "rounds": [], "stopped": None}
    rundir.write_json_atomic(path, study)
    return study


def as_recorded(rule, study: dict):
    """`rule` as the recorded study reads it: a study recorded before designs existed ran under "anytime" and
    continues so, unless the command chose a design other than the default (a change, refused as any other)."""
    if "design" not in study["rule"] and rule.design == type(rule).design:
        return dataclasses.replace(rule, design="anytime")
    return rule


def _seeds_so_far(study: dict) -> dict[str, list[int]]:
    seeds: dict[str, set[int]] = {}
    for entry in study["rounds"]:
        for variant, more in entry["seeds"].items():
            seeds.setdefault(variant, set()).update(more)
    return {v: sorted(s) for v, s in seeds.items()}


# ---------------------------------------------------------------------------------------------------------------
# the next round, or why there is none


def _device_seconds(run_dir: Path) -> float | None:
    """A finished run's wall time x its world size, from summary.json."""
    try:
        summary = rundir.read_json(run_dir / rundir.SUMMARY)
        return float(summary["wall_seconds"]) * int(summary.get("world_size") or 1)
    except (rundir.RunFolderError, KeyError, TypeError, ValueError):
        return None


def _estimated_device_seconds(runs: list[CheckedRun], out: str) -> float:
    """The next round's compute, from the finished runs of the same variants (or of the experiment)."""
    folder = rundir.run_dir_for(out, runs[0].config).parent.parent
    every = {}
    for summary in folder.glob(f"*/{rundir.SEED_PREFIX}*/{rundir.SUMMARY}"):
        seconds = _device_seconds(summary.parent)
        if seconds is not None:
            every.setdefault(summary.parent.parent.name, []).append(seconds)
    overall = [s for values in every.values() for s in values]
    total = 0.0
    for run in runs:
        measured = every.get(run.config.name) or overall
        total += sum(measured) / len(measured) if measured else 0.0
    return total


def over_budget(rule, study: dict, runs: list[CheckedRun], out: str) -> str | None:
    """Why the next round's runs would exceed the rule's budget (None: they fit, or there is no budget)."""
    if not rule.budget:
        return None
    from ablate.report.sections.sequential.rule import parse_budget

    kind, budget = parse_budget(rule.budget)
    if kind == "tokens":
        used, more = sum(r["tokens"] for r in study["rounds"]), sum(run_tokens(r) for r in runs)
        text = f"{used + more:.3g} tokens"
    else:  # device_seconds: wall time x devices, the next round's estimated from finished runs
        used = sum(r.get("device_seconds") or 0.0 for r in study["rounds"])
        more = _estimated_device_seconds(runs, out)
        text = f"~{(used + more) / 3600:.3g} h of compute"
    if used + more <= budget:
        return None
    return f"the next round ({len(runs)} runs) would bring the study to {text}, over the budget {rule.budget}"


def next_seeds(study: dict, rule, contrasts: list) -> tuple[dict[str, list[int]] | None, str | None]:
    """The next round's {variant: [seed]}: one more seed (the same unused number) for every variant of an open
    contrast that has fewer than max_seeds; or (None, why it stops)."""
    from ablate.report.sections.sequential.decide import open_variants

    still_open = open_variants(SimpleNamespace(**c) for c in contrasts)  # as recorded in study.json
    if not still_open:
        return None, "decided"
    seeds = _seeds_so_far(study)
    growing = sorted(v for v in still_open if len(seeds.get(v, [])) < rule.max_seeds)
    if not growing:
        return None, "max_seeds"
    used = {s for v in growing for s in seeds.get(v, [])}
    seed = next(s for s in range(len(used) + 1) if s not in used)  # the same number for all: pairs stay paired
    return {v: [seed] for v in growing}, None


# ---------------------------------------------------------------------------------------------------------------
# the rounds


def _round_runs(args, plan: dict[str, list[int]]) -> list[CheckedRun]:
    """The runs of a round, from the experiment file loaded again (it has no side effects)."""
    from ablate.setup.experiment import load_checked

    every_seed = sorted({s for seeds in plan.values() for s in seeds})
    runs = load_checked(args.file, only=args.only, seeds=every_seed, overrides=parse_set_args(args.set))
    return [r for r in runs if r.config.train.seed in plan.get(r.config.name, [])]


def _file_rule_and_seeds(args):
    from ablate.setup.experiment import experiment_study

    file_rule, file_seeds = experiment_study(args.file)
    return study_rule(args, file_rule), args.seeds or file_seeds or FIRST_SEEDS


def run_study(args, train_round: Callable[[list[CheckedRun]], int]) -> int:
    """The whole study: rounds until decided, max seeds or budget. Exit 0 when it stops (open contrasts too), the
    round's exit code when runs of a round failed (1) or were interrupted (130): rerun to continue."""
    from ablate.report.sections.sequential.contrasts import trained_order
    from ablate.report.sections.sequential.section import folder_contrasts

    if "RANK" in os.environ:
        raise ConfigError("--until-decided: not under torchrun (each run can be a group: --gpus-per-run G)")
    rule, first = _file_rule_and_seeds(args)
    variants = _variant_names(args, first)
    runs = _round_runs(args, {name: first for name in variants})
    folder = rundir.run_dir_for(args.out, runs[0].config).parent.parent
    why = over_budget(rule, {"rounds": []}, runs, args.out)  # every study of this rule starts with round 1
    if why:
        raise ConfigError(f"--budget {rule.budget}: round 1 alone: {why}; allowed: a larger budget")
    study = record_rule(folder, rule, args.new_study)
    rule = type(rule).from_dict(study["rule"])  # as recorded: an earlier study keeps its design
    print(f"study {folder.name}: rule in {folder / rundir.STUDY}: {_rule_text(rule)}", flush=True)
    while True:
        changed = as_recorded(_file_rule_and_seeds(args)[0], study).changes_from(rule)  # read again each round
        if changed:
            raise ConfigError(f"{args.file}: decision: changed during the study: {'; '.join(changed)}")
        if study["rounds"] and study["rounds"][-1].get("contrasts") is not None:
            last = study["rounds"][-1]
            plan, stop = next_seeds(study, rule, last["contrasts"])
            runs = _round_runs(args, plan) if plan else []
            stop = stop or (over_budget(rule, study, runs, args.out) and "budget")
            if stop:
                return _stopped(folder, study, stop, rule, runs, args.out)
            study["rounds"].append(_new_round(len(study["rounds"]) + 1, plan, runs))
        elif not study["rounds"]:
            plan = {name: first for name in variants}
            study["rounds"].append(_new_round(1, plan, runs))
        else:  # an interrupted round: its runs again (finished ones are skipped)
            runs = _round_runs(args, study["rounds"][-1]["seeds"])
        entry = study["rounds"][-1]
        rundir.write_json_atomic(folder / rundir.STUDY, study)
        print(f"study round {entry['round']}: {len(runs)} runs: {_plan_text(entry['seeds'])}", flush=True)
        start = time.perf_counter()
        code = train_round(runs)
        entry["wall_seconds"] = round(entry["wall_seconds"] + time.perf_counter() - start, 3)
        if code != 0:
            rundir.write_json_atomic(folder / rundir.STUDY, study)
            print(f"study round {entry['round']}: not every run finished; rerun the same command to continue")
            return code
        seconds = [_device_seconds(rundir.run_dir_for(args.out, r.config)) or 0.0 for r in runs]
        entry["device_seconds"] = round(sum(seconds), 3)
        contrasts = folder_contrasts(folder, rule, variants, trained=trained_order(study))  # prefixes as trained
        entry["contrasts"] = [c.to_dict() for c in contrasts]
        rundir.write_json_atomic(folder / rundir.STUDY, study)
        for contrast in entry["contrasts"]:
            print(f"  {contrast_line(contrast, rule.futility)}", flush=True)


def _variant_names(args, seeds: list[int]) -> list[str]:
    from ablate.setup.experiment import load_checked

    runs = load_checked(args.file, only=args.only, seeds=seeds[:1], overrides=parse_set_args(args.set))
    return list(dict.fromkeys(r.config.name for r in runs))


def _new_round(n: int, plan: dict[str, list[int]], runs: list[CheckedRun]) -> dict:
    tokens = sum(run_tokens(r) for r in runs)
    return {"round": n, "seeds": plan, "tokens": tokens, "wall_seconds": 0.0, "device_seconds": None, "contrasts": None}


def _stopped(folder: Path, study: dict, reason: str, rule, runs: list[CheckedRun], out: str) -> int:
    from ablate.report.sections.sequential.decide import CLOSED

    study["stopped"] = reason
    rundir.write_json_atomic(folder / rundir.STUDY, study)
    last = study["rounds"][-1]
    why = {
        "decided": "every contrast is decided (or closed for futility)",
        "max_seeds": f"every open variant has max_seeds={rule.max_seeds} seeds",
        "budget": over_budget(rule, study, runs, out) or f"budget {rule.budget}",
    }[reason]
    print(f"study stopped after round {last['round']} ({reason}): {why}", flush=True)
    closed = f"closed for futility (estimated chance of a decision < {rule.futility:g})"
    for states, label in ((("open",), "still open"), (CLOSED, closed)):
        left = [c for c in last["contrasts"] if c["decision"] in states]
        if left:
            pairs = "; ".join(f"{c['a']} vs {c['b']} on {c['metric']} ({c['seeds']} seeds)" for c in left)
            print(f"{label}: {pairs}", flush=True)
    print(f"next: ablate status {folder}   ablate report {folder}", flush=True)
    return 0


def _rule_text(rule) -> str:
    margins = ", ".join(f"{k}={v:g}" for k, v in rule.margins.items()) or "none"
    budget = rule.budget or "none"
    metrics = ", ".join(rule.metrics)
    design = rule.design + (
        f" ({rule.spending} spending, futility {rule.futility:g})" if rule.design != "anytime" else ""
    )
    return (
        f"metrics {metrics}; margins {margins}; alpha {rule.alpha:g}; max seeds {rule.max_seeds}; budget {budget}; "
        f"design {design}"
    )


def _plan_text(plan: dict[str, list[int]]) -> str:
    return ", ".join(f"{v} seed{','.join(map(str, s))}" for v, s in plan.items())
