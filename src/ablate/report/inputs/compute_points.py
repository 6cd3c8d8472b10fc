"""One arm at several compute budgets, read from run folders alone: the main runs today's comparisons see, and the
compute points a compute multiplier reads the baseline's loss-vs-compute curve through.

Within a rung (runs sharing the scale fields' values), runs whose configs are equal but for the budget
(train.max_steps, train.max_tokens), the fields that follow it (train.val_every, ckpt_every, keep_checkpoints,
keep_steps: a parent keeps its branches' checkpoints), the name and the bookkeeping (axes), and the branch point
(a branch whose parent is a run of the same arm and seed), are one arm at several budgets. An arm's main budget is
the one every arm of the rung shares; where several are shared (compute_points() gives every arm the same budgets),
the one at which no arm's run carries COMPUTE_POINT_MARK in its name ("baseline~2x"). The pairwise tests, families,
decision accuracy and headline keep seeing each arm once, at the main budget; the other budgets serve the multiplier.

A point counts only where its end is annealed: a cosine schedule or a WSD decay run to the run's last step (a WSD
branch decays to its own end); a constant schedule, an lr that ends at its peak, or a run short of its end is left
out, with the reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ablate.report.inputs.flops import run_flops
from ablate.report.inputs.runs import Run, flatten
from ablate.text import COMPUTE_POINT_MARK

BUDGET_FIELDS = ("train.max_steps", "train.max_tokens")
# fields set from the budget, never a method: left out when arms are compared (keep_steps: a parent's branch points)
FOLLOW_BUDGET = ("train.val_every", "train.ckpt_every", "train.keep_checkpoints", "train.keep_steps")
# TrainConfig's and ScheduleConfig's defaults where a config.json lacks the field (the report imports no config)
DEFAULTS = {"train.max_steps": 200, "train.max_tokens": 0, "schedule.name": "cosine", "schedule.decay": 0.2}
DEFAULTS["schedule.min_lr_ratio"] = 0.1


@dataclass(frozen=True)
class ComputePoint:
    """One run as a point on its arm's loss-vs-compute curve: the plain record a multiplier takes."""

    arm: str  # the arm's name: its runs' variant folder at the main budget
    rung: tuple  # the scale fields' values (() without a scale axis)
    seed: int
    budget: tuple  # (train.max_steps, train.max_tokens)
    main: bool  # at the arm's main budget: a run today's comparisons see
    flops: float | None  # summary.json's flops, else the config's count x tokens
    loss: float | None  # the final validation loss
    annealed: bool
    run: str  # "variant/seedN"
    why: str = ""  # why the point is left out of the curve ("" when it counts)

    @property
    def counts(self) -> bool:
        return self.annealed and not self.why


@dataclass
class BudgetSplit:
    main: list[Run]  # every run but an arm's other budgets: what today's analysis takes
    extra: list[Run]  # the other budgets: compute points only
    points: list[ComputePoint]  # every run of a rung with a main budget, main runs included
    notes: list[str] = field(default_factory=list)  # rungs left whole (no main budget), in words


def _get(config: dict, dotted: str):
    value = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return DEFAULTS.get(dotted)
        value = value[part]
    return value


def budget_of(run: Run) -> tuple:
    return tuple(_get(run.config, f) for f in BUDGET_FIELDS)


def _method(run: Run) -> str:
    """The config with the budget, what follows it, names, seed, bookkeeping and branch point left out."""
    dropped = {"experiment", "name", "train.seed", *BUDGET_FIELDS, *FOLLOW_BUDGET}
    flat = flatten({k: v for k, v in run.config.items() if k not in ("axes", "branch")})
    return json.dumps(sorted((k, v) for k, v in flat.items() if k not in dropped), default=str)


def arm_keys(runs: list[Run]) -> dict[int, tuple]:
    """id(run) -> its arm: the method, and for a branch whose parent (same name and seed among `runs`) is of another
    method or missing, that parent's name too (a branch continues its parent's weights: another parent, another arm)."""
    method = {id(r): _method(r) for r in runs}
    by_name = {(r.variant, r.seed): r for r in runs}
    keys = {}
    for run in runs:
        parent_name = (run.config.get("branch") or {}).get("parent")
        parent = by_name.get((parent_name, run.seed))
        same_line = parent_name is None or (parent is not None and method[id(parent)] == method[id(run)])
        keys[id(run)] = (method[id(run)],) if same_line else (method[id(run)], parent_name)
    # Two names of one config at one budget and seed (an A/A pair) are two arms, never one arm's points: such a
    # key is split by the name without its compute-point mark ("base~2x" -> "base")
    seen: dict[tuple, set[str]] = {}
    for run in runs:
        seen.setdefault((keys[id(run)], budget_of(run), run.seed), set()).add(run.variant)
    clashing = {key for (key, _, _), names in seen.items() if len(names) > 1}
    for run in runs:
        if keys[id(run)] in clashing:
            keys[id(run)] += (run.variant.split(COMPUTE_POINT_MARK)[0],)
    return keys


def annealed_end(run: Run) -> tuple[bool, str]:
    """(True, "") where the run's lr decayed to its last step, else (False, why)."""
    if run.status != "finished":
        return False, f"{run.status} at step {run.last_step}: not at its end"
    name, floor = _get(run.config, "schedule.name"), _get(run.config, "schedule.min_lr_ratio")
    if name == "constant":
        return False, "schedule.name=constant: the lr never decays"
    if name not in ("cosine", "wsd"):
        return False, f"schedule.name={name!r}: not known to anneal"
    if isinstance(floor, (int, float)) and floor >= 1:
        return False, f"schedule.min_lr_ratio={floor}: the lr ends at its peak"
    decay = _get(run.config, "schedule.decay")
    if name == "wsd" and not (isinstance(decay, (int, float)) and decay > 0):
        return False, f"schedule.decay={decay}: the WSD run never decays"
    return True, ""


def _main_budget(arms: dict[tuple, list[Run]]) -> tuple[tuple | None, str]:
    """The budget every arm shares (see the module's doc), or (None, why)."""
    shared = set.intersection(*({budget_of(r) for r in arm_runs} for arm_runs in arms.values()))
    if len(shared) > 1:
        shared = {
            b
            for b in shared
            if all(COMPUTE_POINT_MARK not in r.variant for rs in arms.values() for r in rs if budget_of(r) == b)
        }
    if len(shared) == 1:
        return next(iter(shared)), ""
    if not shared:
        return None, "no budget (train.max_steps, max_tokens) is shared by every arm"
    return None, f"budgets {sorted(shared)} are each shared by every arm, none marked as the compute points"


def split_budgets(runs: list[Run], scale_fields: list[str]) -> BudgetSplit:
    """Runs -> the main runs (each arm once, at its main budget), the extra compute-point runs, and every run of a
    rung with a main budget as a ComputePoint. A rung without one is left whole, as today, with a note."""
    keys = arm_keys(runs)
    rungs: dict[tuple, dict[tuple, list[Run]]] = {}
    for run in runs:
        rung = tuple(_get(run.config, f) for f in scale_fields)
        rungs.setdefault(rung, {}).setdefault(keys[id(run)], []).append(run)
    split = BudgetSplit([], [], [])
    for rung, arms in rungs.items():
        main, why = _main_budget(arms)
        if main is None:
            split.main += [r for rs in arms.values() for r in rs]
            if any(len({budget_of(r) for r in rs}) > 1 for rs in arms.values()):  # compute points there, unread
                split.notes.append(f"rung {list(rung)}: no compute points read: {why}")
            continue
        for arm_runs in arms.values():
            at_main = sorted({r.variant for r in arm_runs if budget_of(r) == main})
            arm = at_main[0]
            for run in arm_runs:
                is_main = budget_of(run) == main
                (split.main if is_main else split.extra).append(run)
                split.points.append(_point(run, arm, rung, is_main))
    order = {id(r): i for i, r in enumerate(runs)}
    split.main.sort(key=lambda r: order[id(r)])
    split.extra.sort(key=lambda r: order[id(r)])
    return split


def _point(run: Run, arm: str, rung: tuple, main: bool) -> ComputePoint:
    annealed, why = annealed_end(run)
    flops, flops_why = run_flops(run.config, run.summary) if run.summary is not None else (None, "")
    loss = (run.summary or {}).get("final_val_loss")
    loss = float(loss) if isinstance(loss, (int, float)) and math.isfinite(loss) else None
    if annealed and flops is None:
        why = f"FLOPs not known: {flops_why}"
    elif annealed and loss is None:
        why = "no final validation loss"
    return ComputePoint(arm, rung, run.seed, budget_of(run), main, flops, loss, annealed, run.label, why)
