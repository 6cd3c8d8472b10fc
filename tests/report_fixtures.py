"""Synthetic run folders whose report figures are known in advance (the run-folder contract of README "Reports")."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from pathlib import Path

import numpy as np

from ablate.report.schema import Final

STEPS = [10, 20, 30, 40]
N_ITEMS = 100

# Mean accuracy of each variant at each step on the task "toy" (chance 0.25). Designed so that, against the final
# order A > B > C, the ranking at step 10 is reversed (tau -1, no pair right), at step 20 is B > A > C (tau 1/3,
# 2 of 3 pairs right) and from step 30 on is final (tau 1). A and B rise monotonically (rho 1); C's ranks over
# steps are 4,1,2,3 (rho -0.2), so the mean Spearman rho over the six runs is (4 x 1 + 2 x -0.2) / 6 = 0.6.
TOY = {"A": [0.30, 0.40, 0.60, 0.70], "B": [0.35, 0.45, 0.55, 0.60], "C": [0.50, 0.35, 0.40, 0.45]}
SEED_OFFSET = {0: 0.01, 1: -0.01}  # cancels in the mean over seeds, keeps every run's own order
VAL = {"A": [5.0, 4.5, 4.0, 3.8], "B": [5.1, 4.6, 4.1, 3.9], "C": [5.2, 4.7, 4.2, 4.0]}
VAL_SLOPE = {"A": 0.010, "B": 0.012, "C": 0.014}  # per-item loss offsets, zero mean: the item mean is the VAL value
FLAT_START = {"A": 0, "B": 2, "C": 1}  # "flat": every run gets 50 items right, A and B on items that differ by 2+2


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_run(
    root: Path,
    variant: str,
    seed: int,
    steps: list[int],
    val: list[float] | None,
    tasks: dict,
    finished: bool = True,
    config_extra: dict | None = None,
    val_slope: float = 0.01,
    val_items: dict[int, list[float]] | None = None,
    tokens_per_step: int = 100,
    axes: dict | None = None,
) -> Path:
    """tasks: {task: {"chance": c, "primary": m, "items": {step: [{"id", metric: value...}]}}}. val_items: per-item
    validation losses {step: [loss of sequence 0, 1, ...]} (val/loss is their mean), else 20 items spread around
    each `val` value by val_slope. axes: config["axes"], as grid() records it."""
    run = root / variant / f"seed{seed}"
    run.mkdir(parents=True)
    config = {
        "experiment": root.name,
        "name": variant,
        "model": {"vocab_size": 512, "d_model": 32},
        "data": {"source": "default"},
        "train": {"max_steps": steps[-1], "seed": seed},
    }
    for dotted, value in (config_extra or {}).items():
        section, key = dotted.split(".")
        config.setdefault(section, {})[key] = value
    if axes is not None:
        config["axes"] = axes
    if val is None:
        val = [sum(val_items[s]) / len(val_items[s]) for s in steps]
    (run / "config.json").write_text(json.dumps({"identity": f"{variant}-{seed}", "world_size": 1, "config": config}))
    metrics = []
    # each run's own per-sequence quirks (zero mean, so val/loss stays `val`): paired item differences then vary, as
    # real ones do, and give the seed-level test its item-noise floor
    quirks = np.random.default_rng(zlib.crc32(f"{variant}/{seed}".encode())).permutation(np.linspace(-0.002, 0.002, 20))
    for step, loss in zip(steps, val):
        tokens = step * tokens_per_step
        metrics.append(
            {
                "step": step,
                "tokens": tokens,
                "loss": loss + 0.2,
                "lr": 1e-3,
                "grad_norm": 1.0,
                "tokens_per_second": 1e4,
                "mfu": 0.1,
                "memory_bytes": 1,
            }
        )
        metrics.append({"step": step, "tokens": tokens, "val/loss": loss})
        rows = (
            [{"id": i, "loss": x} for i, x in enumerate(val_items[step])]
            if val_items
            else [{"id": i, "loss": loss + val_slope * (i - 9.5) + q} for i, q in enumerate(quirks)]
        )
        _write_jsonl(run / "eval_items" / f"step_{step:07d}" / "val_loss.jsonl", rows)
    _write_jsonl(run / "metrics.jsonl", metrics)
    evals = []
    for task, spec in tasks.items():
        for step, items in spec["items"].items():
            n = len(items)
            names = [k for k in items[0] if k not in ("id", "gold", "group")]
            line = {
                "step": step,
                "tokens": step * tokens_per_step,
                "task": task,
                "format": "cf",
                "n": n,
                "chance": spec["chance"],
                "primary": spec["primary"],
                "metrics": {m: _mean([r[m] for r in items]) for m in names},
                "stderr": {m: _stderr([r[m] for r in items]) for m in names},
                "truncated": 0,
                "seconds": 0.1,
            }
            if "group" in items[0]:  # macro average over groups, each group's means logged, as the eval suite does
                groups = {g: [r for r in items if r["group"] == g] for g in sorted({r["group"] for r in items})}
                line["groups"] = {g: {m: _mean([r[m] for r in rows]) for m in names} for g, rows in groups.items()}
                line["metrics"] = {m: _mean([line["groups"][g][m] for g in groups]) for m in names}
            evals.append(line)
            _write_jsonl(run / "eval_items" / f"step_{step:07d}" / f"{task}_cf.jsonl", items)
    _write_jsonl(run / "evals.jsonl", evals)
    if finished:
        (run / "summary.json").write_text(
            json.dumps(
                {
                    "final_loss": val[-1] + 0.2,
                    "final_val_loss": val[-1],
                    "steps": steps[-1],
                    "tokens": steps[-1] * tokens_per_step,
                    "params": 12345,
                    "wall_seconds": 12.5,
                    "tokens_per_second": 1e4,
                    "mfu": 0.1,
                }
            )
        )
    return run


def simulated_final(scores: dict[int, float]) -> Final:
    """A variant's final scores as the pipeline records them, from {seed: score} alone (a simulated study: no
    steps, tokens or items)."""
    values = list(scores.values())
    return Final(
        mean=float(np.mean(values)),
        seed_std=None,
        values=values,
        seeds=list(scores),
        steps=[],
        tokens=[],
        ci=None,
        n_items=None,
        averaged=[],
    )


def record_with(cls, **given):
    """A report record (schema.Pairwise, Series, ...) with the given fields and every other one None: what a test
    of one reader needs."""
    return cls(**{f.name: None for f in dataclasses.fields(cls)} | given)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _stderr(values: list[float]) -> float:
    """sqrt(p (1 - p) / n) for 0/1 values, else the sample sd / sqrt(n)."""
    n, m = len(values), _mean(values)
    if set(values) <= {0.0, 1.0}:
        return math.sqrt(m * (1 - m) / n)
    return math.sqrt(sum((v - m) ** 2 for v in values) / max(n - 1, 1) / n)


def accuracy_items(correct: set[int], extra: dict[str, set[int]] | None = None) -> list[dict]:
    rows = []
    for i in range(N_ITEMS):
        row = {"id": f"q{i}", "gold": 0, "acc_per_char": float(i in correct)}
        for metric, right in (extra or {}).items():
            row[metric] = float(i in right)
        rows.append(row)
    return rows


def build_toy_experiment(root: Path, unfinished: bool = True) -> Path:
    """Variants A, B, C x seeds 0, 1 (plus an unfinished A/seed2) on val_loss, "toy" and "flat"."""
    for variant in TOY:
        for seed, offset in SEED_OFFSET.items():
            toy = {
                step: accuracy_items(
                    set(range(round((TOY[variant][k] + offset) * N_ITEMS))), {"acc_choices_only": set(range(25))}
                )
                for k, step in enumerate(STEPS)
            }
            flat = {
                step: [
                    {"id": f"f{i}", "gold": 1, "acc_raw": float(FLAT_START[variant] <= i < FLAT_START[variant] + 50)}
                    for i in range(N_ITEMS)
                ]
                for step in STEPS
            }
            val = [v + offset / 2 for v in VAL[variant]]
            write_run(
                root,
                variant,
                seed,
                STEPS,
                val,
                {
                    "toy": {"chance": 0.25, "primary": "acc_per_char", "items": toy},
                    "flat": {"chance": 0.25, "primary": "acc_raw", "items": flat},
                },
                val_slope=VAL_SLOPE[variant],
            )
    if unfinished:  # stopped after two checkpoints: named in the overview, left out of the figures
        write_run(root, "A", 2, STEPS[:2], VAL["A"][:2], {}, finished=False, config_extra={"train.max_steps": 40})
    return root


# ---------------------------------------------------------------------------------------------------------------
# grid() sweeps: run folders whose config.json records "axes", with losses from a known model (sweep views)

GRID_LR_STAR = 3e-3  # the optimum LR of grid_loss
GRID_B_NOISE = 24  # McCandlish's B_noise in sequences: S = S_min (1 + B_noise/B), so B_crit = 24 sequences
GRID_SEQ_LEN = 64


def grid_loss(
    step, lr: float, batch: int, params: float = 1e6, lr_star: float = GRID_LR_STAR, b_noise: float = GRID_B_NOISE
):
    """Loss after `step` steps: a quadratic bowl in log10(LR) around lr_star, plus a curve in progress
    p = step / (1 + b_noise/batch). A loss is reached at one p whatever the batch, so the steps to reach it follow
    S = S_min (1 + b_noise/B) exactly (B_crit = b_noise); the floor falls with size as 2 + 40 N^-0.3."""
    p = step / (1 + b_noise / batch)
    return 2.0 + 40.0 * params**-0.3 + 0.3 * (math.log10(lr) - math.log10(lr_star)) ** 2 + 3.0 * (1 + p / 20) ** -0.5


def write_grid_run(
    root: Path, axes: dict, seed: int, steps: list[int], val: list[float], params: int = 12345, finished: bool = True
) -> Path:
    """One grid() run: folder named as grid() names it, config with the axis fields set and recorded in "axes"."""
    name = ",".join(f"{k.split('.')[-1]}={v}" for k, v in axes.items())
    config = {
        "experiment": root.name,
        "name": name,
        "model": {"vocab_size": 512, "d_model": 32},
        "data": {"source": "default", "seq_len": GRID_SEQ_LEN},
        "optim": {"lr": 1e-3},
        "train": {"max_steps": steps[-1], "seed": seed, "global_batch": 16},
        "axes": dict(axes),
    }
    for dotted, value in axes.items():
        section, key = dotted.split(".")
        config[section][key] = value
    run = root / name / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"identity": f"{name}-{seed}", "world_size": 1, "config": config}))
    per_step = config["train"]["global_batch"] * GRID_SEQ_LEN
    rows = []
    for step, loss in zip(steps, val):
        rows.append({"step": step, "tokens": step * per_step, "loss": loss + 0.05, "lr": config["optim"]["lr"]})
        rows.append({"step": step, "tokens": step * per_step, "val/loss": loss})
    _write_jsonl(run / "metrics.jsonl", rows)
    if finished:
        (run / "summary.json").write_text(
            json.dumps(
                {
                    "final_loss": val[-1] + 0.05,
                    "final_val_loss": val[-1],
                    "steps": steps[-1],
                    "tokens": steps[-1] * per_step,
                    "params": params,
                    "wall_seconds": 1.0,
                }
            )
        )
    return run


def build_grid_experiment(
    root: Path,
    lrs=(1e-3, 3e-3, 1e-2),
    batches=(16, 32),
    seeds=(0, 1),
    sizes=None,
    steps=tuple(range(5, 205, 5)),
    noise: float = 0.002,
) -> Path:
    """grid(base, {"optim.lr": lrs, "train.global_batch": batches} (+ "model.d_model": sizes)) x seeds, losses from
    grid_loss plus a per-run seed offset (normal, sd `noise`, fixed by the cell and seed)."""
    rng = __import__("numpy").random.default_rng(0)
    for lr in lrs:
        for batch in batches:
            for d_model in sizes or [None]:
                axes = {"optim.lr": lr, "train.global_batch": batch}
                params = 12345
                if d_model is not None:
                    axes["model.d_model"] = d_model
                    params = 12 * 4 * d_model**2  # 4 layers of 12 d^2
                for seed in seeds:
                    offset = float(rng.normal(0, noise))
                    val = [grid_loss(s, lr, batch, params) + offset for s in steps]
                    write_grid_run(root, axes, seed, list(steps), val, params)
    return root


def build_drift_grid(
    root: Path,
    per_doubling: float = 0.5,
    widths=(64, 128, 256, 512),
    lrs=tuple(1e-3 * 2.0**k for k in range(-3, 4)),
    seeds=(0, 1),
    noise: float = 0.003,
) -> Path:
    """grid(base, {"optim.lr": lrs, "model.d_model": widths}) x seeds whose optimum LR moves per_doubling x per
    doubling of the width (2e-3 at the first): the final val loss a bowl 0.3 (log10(lr / lr*))^2 that falls with
    the width, plus a per-run seed offset (normal, sd `noise`)."""
    rng = np.random.default_rng(0)
    steps = [10, 20, 30, 40]
    for d_model in widths:
        lr_star = 2e-3 * per_doubling ** math.log2(d_model / widths[0])
        for lr in lrs:
            for seed in seeds:
                final = 3.0 - 0.1 * math.log2(d_model) + 0.3 * math.log10(lr / lr_star) ** 2 + rng.normal(0, noise)
                val = [final + 0.3 * (len(steps) - 1 - k) / len(steps) for k in range(len(steps))]
                write_grid_run(root, {"optim.lr": lr, "model.d_model": d_model}, seed, steps, val, 48 * d_model**2)
    return root
