"""Run folders -> plain Python tables for the report. Reads files only, never live objects.

RUNS_DIR is runs/<experiment>/ holding <variant>/seed<k>/ folders (see README "Each run writes"). Each task is keyed
"<task>:<format>" (e.g. "arc_easy:cf"); validation loss is the task "val_loss" with the one metric "loss". A task
averaged over groups (MMLU's subjects) logs each group's means in its evals.jsonl line ("groups": {group: {metric:
mean}}) and each item's group in its eval_items rows ("group").

metrics.jsonl is read whole: the training loss, validation (val/loss, val/bpb) and every other numeric key, kept
as the series (LOGGED_TASK, key), which `--metric KEY` decides on (inputs/logged.py).

Metric names are read generically: the direction from a small table of name parts (bpb, loss, nll, perplexity:
lower is better), a chance level only for accuracies and zero-chance margins.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ablate import rundir
from ablate.text import natural_key

VAL_TASK = "val_loss"
LOGGED_TASK = "logged"  # a metrics.jsonl key as a series: (LOGGED_TASK, key); no eval task is keyed without a format
# metrics.jsonl keys read as something else: the point's place, and validation (the task VAL_TASK)
PLACE_KEYS = ("step", "tokens")
AS_VALIDATION = {"val/loss": (VAL_TASK, "loss"), "val/bpb": (VAL_TASK, "bpb")}
# A metric whose name holds one of these parts ("gold_bpb", "loss", "bits_per_byte") is lower-is-better; every other
# metric (accuracies, probabilities, log-probabilities, margins) is higher-is-better.
LOWER_IS_BETTER_PARTS = {"loss", "bpb", "nll", "perplexity", "ppl", "bits_per_byte"}
BASELINE_METRICS = {"acc_choices_only"}  # answer-prior baselines: shown, never recommended as a signal
# Figures that are the same whichever choice is gold (eval.metrics.ANSWER_BLIND): diagnostics of the model's
# probability mass, never evidence on the task, so never a decision metric nor in the error-control family
ANSWER_BLIND = {"total_prob"}
# A model that knows nothing about the task scores 0 in expectation: a PMI margin, and a continuation task's greedy
# accuracy (whatever chance its line logs: one continuation is no 1-in-k choice)
ZERO_CHANCE_METRICS = {"margin_pmi", "acc_greedy"}
GROUP_FIELDS = ("groups", "subjects")  # an evals.jsonl line's per-group means (the second: an older spelling)
# Accuracies whose normalization already divides out answer priors: past chance is enough, the choices-only
# baseline is shown but not required.
PRIOR_CONTROLLED = {"acc_pmi"}


def current_metric_names(logged: dict) -> dict:
    """A logged dict of metric values (an evals.jsonl line's "metrics", "stderr" or one group's means; an eval_items
    row) under today's names. Runs from before DataDecide's margin logged the log-likelihood gap as "margin", now
    margin_loglik; ablate logs margin_loglik beside every margin since, so "margin" alone is the old one."""
    if "margin" not in logged or "margin_loglik" in logged:
        return logged
    return {("margin_loglik" if name == "margin" else name): value for name, value in logged.items()}


class ReportError(ValueError):
    """A runs folder the report cannot read; the message says what was expected."""


def task_label(key: str) -> str:
    """A task's short name: its key without the cloze form's ":cf"."""
    return key[:-3] if key.endswith(":cf") else key


def direction(metric: str) -> int:
    """+1 when higher is better, -1 when lower is better (a name part in LOWER_IS_BETTER_PARTS)."""
    parts = set(metric.lower().split("_")) | {metric.lower()}
    return -1 if parts & LOWER_IS_BETTER_PARTS else 1


def direction_name(sign: int) -> str:
    """A series' "direction" in report.json: "higher" (+1, higher is better) or "lower" (-1)."""
    return "higher" if sign > 0 else "lower"


def sign_of(direction: str) -> int:
    """A series' "direction" back as its sign: a figure times its sign is larger when better."""
    return 1 if direction == "higher" else -1


def is_accuracy(metric: str) -> bool:
    return metric == "acc" or metric.startswith("acc_")


@dataclass
class Point:
    step: int
    tokens: int
    value: float
    stderr: float | None
    n: int | None = None  # items scored (evals.jsonl "n"), where the run logged it


@dataclass
class TaskInfo:
    key: str  # "arc_easy:cf", or "val_loss"
    primary: str  # the metric headlines and curves use
    metrics: list[str]
    chance: float | None  # chance accuracy (accuracy metrics); ln(vocab) for val_loss
    items_stem: str  # eval_items/step_N/<items_stem>.jsonl
    n: int | None = None
    groups: list[str] = field(default_factory=list)  # a task averaged over groups (MMLU's subjects): their names
    kept_groups: dict[str, set[str]] = field(default_factory=dict)  # metric -> groups its average keeps (floor)
    # metrics declared decision metrics by the user (--metric: logged keys), each its own primary: metric -> sign
    declared: dict[str, int] = field(default_factory=dict)

    def sign_for(self, metric: str) -> int:
        """+1 when higher is better: as declared, else by the metric's name (direction)."""
        return self.declared.get(metric) or direction(metric)

    def is_primary(self, metric: str) -> bool:
        return metric == self.primary or metric in self.declared

    def chance_for(self, metric: str) -> float | None:
        """The score of a model that knows nothing, where one is defined: for accuracies (an accuracy at chance never
        counts as signal) and zero-chance margins. None for continuous metrics (gold_bpb, correct_prob, the raw
        margin...): their no-knowledge level depends on answer lengths and priors, so they are judged by what the
        runs show (monotone, consistent, SNR, decision accuracy across scales), not by a distance from chance."""
        if metric in ZERO_CHANCE_METRICS:
            return 0.0
        if is_accuracy(metric) or metric == "loss":
            return self.chance
        return None


@dataclass
class Run:
    variant: str
    seed: int
    path: Path
    config: dict  # config.json's "config" section
    summary: dict | None  # None: the run never finished
    status: str  # "finished" | "unfinished" | "failed" | "diverged" | "interrupted"
    note: str
    last_step: int
    train_loss: list[Point] = field(default_factory=list)
    planned_steps: int | None = None  # the steps the run takes (a scheduled batch takes more than max_steps)
    scores: dict[tuple[str, str], list[Point]] = field(default_factory=dict)  # (task key, metric) -> by step
    # a task averaged over groups: (task key, metric) -> {group: by step}
    group_scores: dict[tuple[str, str], dict[str, list[Point]]] = field(default_factory=dict)
    _items: dict = field(default_factory=dict, repr=False)
    world_size: int = 1  # config.json's world_size: the devices the run trained on (its device-seconds)

    @property
    def label(self) -> str:
        return f"{self.variant}/seed{self.seed}"

    def items(self, task: TaskInfo, step: int) -> dict[str, dict] | None:
        """Per-item rows {id: row} of one evaluation, or None when the run has no such file."""
        key = (task.items_stem, step)
        if key not in self._items:
            path = rundir.items_path(self.path, step, task.items_stem)  # rundir imports no torch
            rows = _read_jsonl(path) if path.is_file() else None
            self._items[key] = None if rows is None else {str(r["id"]): current_metric_names(r) for r in rows}
        return self._items[key]


def _read_jsonl(path: Path) -> list[dict]:
    """rundir's reader: a torn last line (a run killed or still writing) is dropped with a warning; damage
    elsewhere makes the run unreadable, named in the report, rather than silently missing lines."""
    return rundir.read_jsonl(path)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def get_dotted(config: dict, path: str):
    value = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ReportError(f"--scale {path}: no such config field (e.g. model.d_model)")
        value = value[part]
    return value


def _status(summary: dict | None, train_loss: list[Point], max_steps, recorded: dict) -> tuple[str, str, int]:
    """finished, diverged, failed, interrupted (as the run recorded it in status.json), else unfinished."""
    last = train_loss[-1].step if train_loss else 0
    if summary is not None:
        return "finished", "", int(summary.get("steps", last))
    if recorded.get("state") in ("diverged", "failed", "interrupted"):
        first_line = (str(recorded.get("message") or recorded["state"]).splitlines() or [""])[0]
        return recorded["state"], first_line, int(recorded.get("step") or last)
    if train_loss and not math.isfinite(train_loss[-1].value):
        return "failed", f"non-finite loss at step {last}", last
    return "unfinished", f"no summary.json: stopped at step {last} of {max_steps} (failed or still running)", last


def load_run(path: Path, variant: str) -> Run:
    held = json.loads((path / rundir.CONFIG).read_text())
    config, world_size = held.get("config", {}), int(held.get("world_size") or 1)
    summary_path = path / rundir.SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    name = path.name
    number = name[len(rundir.SEED_PREFIX) :]
    seed = int(number) if number.isdigit() else int(config.get("train", {}).get("seed", 0))

    logged = _logged(_read_jsonl(path / rundir.METRICS))
    train_loss = logged.get("loss", [])  # a non-finite loss kept: how a failed run is told (_status)
    planned = held.get("steps") or config.get("train", {}).get("max_steps")  # "steps": since batch schedules
    status, note, last_step = _status(summary, train_loss, planned, rundir.read_status(path) or {})
    run = Run(variant, seed, path, config, summary, status, note, last_step, train_loss, planned, world_size=world_size)
    for key, points in logged.items():  # val/bpb: what runs of different tokenizers compare on (sections/tokenizers/)
        if finite := [p for p in points if math.isfinite(p.value)]:
            run.scores[AS_VALIDATION.get(key, (LOGGED_TASK, key))] = finite
    evals = {}
    for row in _read_jsonl(path / rundir.EVALS):
        evals[(row["step"], row["task"], row.get("format", "cf"))] = row
    for (step, task, fmt), row in sorted(evals.items()):
        stderr = current_metric_names(row.get("stderr") or {})
        for metric, value in current_metric_names(row.get("metrics") or {}).items():
            if _finite(value):
                se = stderr.get(metric)
                run.scores.setdefault((f"{task}:{fmt}", metric), []).append(
                    Point(
                        step,
                        row.get("tokens", 0),
                        float(value),
                        float(se) if _finite(se) else None,
                        row["n"] if isinstance(row.get("n"), int) else None,
                    )
                )
        groups = next((row[f] for f in GROUP_FIELDS if isinstance(row.get(f), dict)), {})
        for group, means in groups.items():
            means = current_metric_names(means.get("metrics", means)) if isinstance(means, dict) else {}
            for metric, value in means.items():
                if _finite(value):
                    run.group_scores.setdefault((f"{task}:{fmt}", metric), {}).setdefault(str(group), []).append(
                        Point(step, row.get("tokens", 0), float(value), None)
                    )
    return run


def _logged(rows: list[dict]) -> dict[str, list[Point]]:
    """Every numeric metrics.jsonl key (but the step and tokens) -> its points in step order; the last line wins for
    a repeated step (a resumed run may log a step twice)."""
    by_key: dict[str, dict[int, Point]] = {}
    for row in rows:
        step, tokens = row.get("step"), row.get("tokens", 0)
        for key, value in row.items() if isinstance(step, int) else ():
            if key not in PLACE_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                by_key.setdefault(key, {})[step] = Point(step, tokens, float(value), None)
    return {key: [points[s] for s in sorted(points)] for key, points in by_key.items()}


def task_infos(runs: list[Run]) -> dict[str, TaskInfo]:
    """One TaskInfo per task key seen in any run, in a stable order (val_loss first)."""
    tasks: dict[str, TaskInfo] = {}
    for run in runs:
        if any(key == (VAL_TASK, "loss") for key in run.scores) and VAL_TASK not in tasks:
            vocab = run.config.get("model", {}).get("vocab_size")
            tasks[VAL_TASK] = TaskInfo(VAL_TASK, "loss", ["loss"], math.log(vocab) if vocab else None, VAL_TASK)
    for run in runs:
        for row in _read_jsonl(run.path / rundir.EVALS):
            key = f"{row['task']}:{row.get('format', 'cf')}"
            info = tasks.setdefault(
                key,
                TaskInfo(
                    key,
                    row.get("primary", ""),
                    [],
                    row.get("chance"),
                    f"{row['task']}_{row.get('format', 'cf')}",
                    row.get("n"),
                ),
            )
            for metric in current_metric_names(row.get("metrics") or {}):
                if metric not in info.metrics:
                    info.metrics.append(metric)
            groups = next((row[f] for f in GROUP_FIELDS if isinstance(row.get(f), dict)), {})
            info.groups += [str(g) for g in groups if str(g) not in info.groups]
            if not info.primary or info.primary not in info.metrics:
                info.primary = row.get("primary") or (info.metrics[0] if info.metrics else "")
    ordered = {k: tasks[k] for k in ([VAL_TASK] if VAL_TASK in tasks else []) + sorted(set(tasks) - {VAL_TASK})}
    for info in ordered.values():  # val_loss stderr from its items, when the contract's files are there
        if info.key == VAL_TASK:
            for run in runs:
                _val_loss_stderr(run, info)
    return ordered


def _val_loss_stderr(run: Run, info: TaskInfo) -> None:
    import numpy as np

    for point in run.scores.get((VAL_TASK, "loss"), []):
        rows = run.items(info, point.step)
        if rows and len(rows) >= 2:
            losses = np.array([r["loss"] for r in rows.values()], dtype=float)
            point.stderr = float(losses.std(ddof=1) / np.sqrt(len(losses)))
            tokens = [r.get("tokens") for r in rows.values()]
            if all(tokens):  # documents (their nats / tokens): the ratio's standard error, by the delta method
                tokens = np.array(tokens, dtype=float)
                nats = losses * tokens.sum() / len(losses)  # each row's loss is its share: nats x n / all tokens
                residual = nats - point.value * tokens  # what the per-token loss leaves; lengths alone count nothing
                point.stderr = float(np.sqrt(np.sum(residual**2) * len(losses) / (len(losses) - 1)) / tokens.sum())
            info.n = len(losses)


def load_runs(runs_dir: str | Path) -> tuple[list[Run], list[str]]:
    """Every <variant>/seed<k>/ run under runs_dir, and notes on folders that could not be read."""
    root = Path(runs_dir)
    if not root.is_dir():
        raise ReportError(f"{root}: not a folder; expected runs/<experiment>/ holding <variant>/seed<k>/ runs")
    runs, skipped = [], []
    for variant_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        seed_dirs = (p for p in variant_dir.iterdir() if p.is_dir() and p.name.startswith(rundir.SEED_PREFIX))
        for seed_dir in sorted(seed_dirs):
            if not (seed_dir / rundir.CONFIG).is_file():
                skipped.append(f"{variant_dir.name}/{seed_dir.name}: no {rundir.CONFIG}")
                continue
            try:
                runs.append(load_run(seed_dir, variant_dir.name))
            except (json.JSONDecodeError, KeyError, ValueError) as exc:
                skipped.append(f"{variant_dir.name}/{seed_dir.name}: unreadable ({exc})")
    if not runs:
        nested = any(root.glob(f"*/*/{rundir.SEED_PREFIX}*/{rundir.CONFIG}"))
        hint = " (pass runs/<experiment>, not runs/)" if nested else ""
        raise ReportError(f"{root}: no run folders <variant>/seed<k>/{rundir.CONFIG} found{hint}")
    runs.sort(key=lambda r: (natural_key(r.variant), r.seed))  # d32 < d64 < d128
    return runs, skipped


def flatten(config: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def group_by_scale(runs: list[Run], scale_fields: list[str]) -> list[tuple[object, dict[str, list[Run]]]]:
    """[(scale, {variant label: runs})] from the smallest scale to the largest.

    Without a scale axis: one group, labelled by variant folder name. With one (config fields such as
    model.d_model), runs of the same method at different scales have different folder names; a method's label is
    its folder name with the scale removed ("mqa@d64" -> "mqa", "d_model=64,n_kv_heads=1" -> "n_kv_heads=1"), or,
    when that is ambiguous at some scale, the config fields that set the methods apart there (fields that change
    only with the scale, such as steps, are not among them).
    """
    if not scale_fields:
        groups: dict[str, list[Run]] = {}
        for run in runs:
            groups.setdefault(run.variant, []).append(run)
        return [(None, groups)]
    leaves = {f.split(".")[-1] for f in scale_fields}
    scale_of = {id(r): tuple(get_dotted(r.config, f) for f in scale_fields) for r in runs}
    # a branch's parent_identity holds its seed's parent: a fact of the run, like its seed, never of the method
    dropped = {"experiment", "name", "train.seed", "branch.parent_identity", *scale_fields}
    # "axes" (grid() bookkeeping) repeats values held in the sections, scale fields included: never a method field
    method_of = {
        id(r): json.dumps(
            sorted((k, v) for k, v in flatten(r.config).items() if k not in dropped and not k.startswith("axes.")),
            default=str,
        )
        for r in runs
    }

    def strip(name: str) -> str:
        return ",".join(p for p in name.split("@")[0].split(",") if p.split("=")[0] not in leaves)

    # A method is a config apart from the scale at one scale: its other fields (steps, eval cadence) may grow with
    # the scale, so methods are matched across scales by name, never by config.
    key_of = {id(r): (scale_of[id(r)], method_of[id(r)]) for r in runs}
    names: dict[tuple, set[str]] = {}
    for run in runs:
        names.setdefault(key_of[id(run)], set()).add(strip(run.variant))
    at_scale = {sc: [k for k in names if k[0] == sc] for sc in set(scale_of.values())}
    by_name = all(len(n) == 1 and next(iter(n)) for n in names.values()) and all(
        len({next(iter(names[k])) for k in keys}) == len(keys) for keys in at_scale.values()
    )
    if by_name:
        label = {k: next(iter(n)) for k, n in names.items()}
    else:  # name the methods by the fields that differ between them at some scale
        flats = {k: dict(json.loads(k[1])) for k in names}
        differing = sorted(
            f
            for f in set().union(*flats.values())
            if any(len({json.dumps(flats[k].get(f), default=str) for k in keys}) > 1 for keys in at_scale.values())
        )
        label = {k: ",".join(f"{f.split('.')[-1]}={flats[k].get(f)}" for f in differing) or "base" for k in names}
    scales: dict[tuple, dict[str, list[Run]]] = {}
    for run in sorted(runs, key=lambda r: (natural_key(label[key_of[id(r)]]), r.seed)):
        scales.setdefault(scale_of[id(run)], {}).setdefault(label[key_of[id(run)]], []).append(run)

    return [(scale_value(scale), scales[scale]) for scale in sorted(scales, key=scale_order)]


def scale_value(scale: tuple):
    """A scale as report.json writes it: the value for one scale field, the list for several, None for none."""
    return None if not scale else scale[0] if len(scale) == 1 else list(scale)


def scale_order(scale: tuple) -> tuple:
    """Sort key of scale tuples: numbers by value (d32 < d64 < d128), before text."""
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for v in scale)
