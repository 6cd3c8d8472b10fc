"""The runs of an experiment file, built from a base run: `variant` (one named change), `grid` (every combination
of values on some axes), `branch` (a run continuing another's checkpoint) and `compute_points` (one arm at several
budgets, for compute multipliers), with `resolve_branches`, which puts each branch after its parent once seeds and
--set are applied.

All take the dotted syntax of the CLI's `--set` ({"model.n_kv_heads": 1}). Nothing here imports torch:
experiment files import these through `ablate`, and loading one never starts compute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ablate.config import ConfigError, ExperimentError, RunConfig, validate
from ablate.data.batch_schedule import batch_plan
from ablate.data.sources import entries
from ablate.setup.overrides import apply_overrides
from ablate.text import COMPUTE_POINT_MARK


def variant(
    base: RunConfig, name: str, overrides: dict[str, Any] | None = None, axes: dict[str, Any] | None = None
) -> RunConfig:
    """A named copy of `base` with dotted fields replaced: variant(base, "gqa", {"model.n_kv_heads": 2}).
    A variant is off any grid (empty `axes`) unless `axes` says where it sits, e.g. {"optim.lr": 0.01}."""
    return validate(
        dataclasses.replace(
            apply_overrides(dataclasses.replace(base, name=name, axes={}), overrides or {}), axes=dict(axes or {})
        )
    )


def grid(base: RunConfig, axes: dict[str, list]) -> list[RunConfig]:
    """Every combination of the values on each dotted axis, named like 'lr=0.001,global_batch=16'. Each run
    records its values in `axes` ({"optim.lr": 0.001, "train.global_batch": 16}, added to any the base has), which
    config.json keeps for the report's sweep views."""
    runs = [(base, [])]
    for key, values in axes.items():
        short = key.split(".")[-1]
        runs = [(apply_overrides(r, {key: v}), parts + [f"{short}={v}"]) for r, parts in runs for v in values]
    return [
        validate(
            dataclasses.replace(
                r, name=",".join(parts) or base.name, axes={**base.axes, **{k: _dotted(r, k) for k in axes}}
            )
        )
        for r, parts in runs
    ]


def _dotted(run: RunConfig, key: str):
    section, _, name = key.partition(".")
    return getattr(getattr(run, section), name)


def branch(parent: RunConfig, at: float | int, name: str, changes: dict | None = None) -> RunConfig:
    """A run that starts from `parent`'s checkpoint at `at` (a share of the parent's steps such as 0.8, or a step)
    and continues with `changes` (decay shape and length, data mix, batch, LR, max_steps): a WSD cooldown, a stage
    of a multi-stage recipe, a batch change. The parent trains once, keeps that checkpoint and is shared by all
    its branches; the model, optimizer and sequence length stay the parent's."""
    _branch_point(parent, at, name)  # a bad `at` stops here, at the line of the file
    run = variant(parent, name, changes)
    for field, kept in (
        ("model", run.model == parent.model),
        ("optim.name", run.optim.name == parent.optim.name),
        ("data.seq_len", run.data.seq_len == parent.data.seq_len),
        ("data.tokenizer", run.data.tokenizer == parent.data.tokenizer),
        # the tokenizer and the sampler's positions belong to the sources; their weights may change
        ("the sources of data.source", entries(run.data.source) == entries(parent.data.source)),
        ("data.val_source", run.data.val_source == parent.data.val_source),
    ):
        if not kept:
            raise ConfigError(
                f"branch {name!r}: changes {field}, which a branch keeps from its parent {parent.name!r} "
                f"(it continues the parent's weights, optimizer state and data position); allowed "
                f"changes: schedule, optim lr and other fields, train (batch, length, ...), the weights of the "
                f"data mix, eval"
            )
    return _attach(run, parent, at)


def compute_points(
    base: RunConfig, name: str, budgets: tuple[float, ...] = (0.5, 1, 2), decay: float = 0.2
) -> list[RunConfig]:
    """One arm of a rung at several compute budgets from one WSD run per seed: the baseline's loss-vs-compute curve
    for the report's compute multipliers. `base`'s train.max_steps is the rung's budget (1x). The longest budget is
    a WSD run that decays over its last `decay` share; each shorter budget b is a branch from that run's stable phase
    at (1 - decay) x b x the rung's steps, decaying over its last `decay` share to b x the rung's steps, so every
    point ends annealed. The warmup is the rung's in steps at every budget (its share scaled by 1 / the longest
    budget): the 1x run's schedule is that of a lone WSD run of the rung's length. The 1x run is named `name` (the
    run every arm of the rung shares, the one today's comparisons see); the others `name~<b>x`. An arm's every run
    is built by the same call, so arms compare alike at each budget."""
    steps = base.train.max_steps
    if base.train.batch_schedule != "constant":
        raise ConfigError(
            f"compute_points {name!r}: train.batch_schedule={base.train.batch_schedule!r}; allowed: 'constant' "
            f"(budgets are multiples of train.max_steps)"
        )
    if 1 not in budgets or any(b <= 0 for b in budgets) or len(set(budgets)) != len(budgets):
        raise ConfigError(
            f"compute_points {name!r}: budgets={budgets!r}; allowed: distinct positive multiples of the rung's "
            f"train.max_steps, 1 among them"
        )
    if not 0 < decay < 1:
        raise ConfigError(f"compute_points {name!r}: decay={decay!r}; allowed: a share in (0, 1)")
    longest = max(budgets)

    def label(b: float) -> str:
        return name if b == 1 else f"{name}{COMPUTE_POINT_MARK}{b:g}x"

    wsd = {"schedule.name": "wsd", "schedule.decay": decay, "schedule.warmup": base.schedule.warmup / longest}
    parent = variant(base, label(longest), {**wsd, "train.max_steps": round(longest * steps)}, axes=base.axes)
    runs = [parent]
    for b in sorted(budgets):
        if b != longest:
            at = round((1 - decay) * b * steps)  # the branch's decay starts where it leaves the parent's stable phase
            point = branch(parent, at, label(b), {"train.max_steps": round(b * steps)})
            runs.append(dataclasses.replace(point, axes=dict(base.axes)))  # a branch starts off any grid: keep base's
    return runs


def _branch_point(parent: RunConfig, at: float | int, name: str) -> tuple[int, int]:
    """(step, tokens seen by then) of the parent where a branch starts."""
    plan = batch_plan(parent.train, parent.data.seq_len)
    step = round(at * len(plan)) if isinstance(at, float) else at
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 < step < len(plan):
        raise ConfigError(
            f"branch {name!r}: at={at!r} gives step {step}; allowed: a share in (0, 1) or a step in "
            f"[1, {len(plan) - 1}] of the parent {parent.name!r}'s {len(plan)} steps"
        )
    return step, sum(plan[:step]) * parent.data.seq_len


def _attach(run: RunConfig, parent: RunConfig, at: float | int) -> RunConfig:
    """`run` as a branch of `parent` at `at`: the branch point and the parent's identity, from the parent as it is
    now (resolve_branches calls this again once seeds and --set are applied to both)."""
    step, tokens = _branch_point(parent, at, run.name)
    return validate(
        dataclasses.replace(
            run,
            branch={
                "parent": parent.name,
                "at": at,
                "step": step,
                "tokens": tokens,
                "parent_identity": parent.identity(),
            },
        )
    )


def resolve_branches(runs: list[RunConfig], where: str) -> list[RunConfig]:
    """Each branch after its parent (same seed), with the parent's identity recorded; each parent keeps the
    checkpoints its branches start from (train.keep_steps). ExperimentError for a branch without its parent."""
    kept = {(r.name, r.train.seed): r for r in runs}
    for run in runs:
        if run.branch and (run.branch["parent"], run.train.seed) not in kept:
            raise ExperimentError(
                f"{where}: branch {run.name!r} (seed {run.train.seed}) starts from "
                f"{run.branch['parent']!r}, which is not among the runs; allowed parents: "
                f"{sorted({r.name for r in runs})}"
            )
    ordered, placed = [], set()

    def place(key, chain=()):
        if key in placed:
            return
        if key in chain:
            raise ExperimentError(f"{where}: branches form a cycle: {' -> '.join(k[0] for k in chain + (key,))}")
        run = kept[key]
        if run.branch:  # its parent goes first; the branch point is taken from the parent as it is now
            parent_key = (run.branch["parent"], run.train.seed)
            place(parent_key, chain + (key,))
            try:
                run = _attach(run, kept[parent_key], run.branch["at"])
            except ConfigError as exc:
                raise ExperimentError(f"{where}: {exc}") from None
        kept[key] = run
        ordered.append(run)
        placed.add(key)

    for run in runs:
        place((run.name, run.train.seed))
    keep: dict[tuple, set] = {}  # each parent keeps the checkpoints its branches start from (bookkeeping)
    for run in ordered:
        if run.branch:
            keep.setdefault((run.branch["parent"], run.train.seed), set()).add(run.branch["step"])
    return [
        dataclasses.replace(
            r,
            train=dataclasses.replace(
                r.train, keep_steps=sorted(set(r.train.keep_steps) | keep.get((r.name, r.train.seed), set()))
            ),
        )
        for r in ordered
    ]
