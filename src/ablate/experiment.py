"""Experiment files: plain Python that defines `runs` (a list of RunConfig, one per variant) and optionally `seeds`.

Loading a file runs its top level (which only builds configs) and checks every run; it never starts compute. Any
problem becomes one ExperimentError naming the file, the line where it can be known, the field and what is allowed.
"""
from __future__ import annotations

import dataclasses
import re
import runpy
import traceback
from pathlib import Path

from ablate.config import ConfigError, RunConfig, _SECTIONS, apply_overrides, validate
from ablate.data import check_data_config


class ExperimentError(ValueError):
    pass


def _line_in(path: Path, exc: BaseException) -> str:
    """'file:line' of the innermost frame inside the experiment file."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno
    return f"{path}:{line}" if line else str(path)


def _explain_type_error(exc: TypeError) -> str:
    """Add the allowed fields to Python's 'got an unexpected keyword argument' message."""
    message = str(exc)
    match = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", message)
    if match:
        cls_name, bad = match.groups()
        classes = {c.__name__: c for c in (RunConfig, *_SECTIONS.values())}
        if cls_name in classes:
            allowed = sorted(f.name for f in dataclasses.fields(classes[cls_name]))
            return f"{cls_name}: unknown field {bad!r}; allowed: {', '.join(allowed)}"
    return message


def load_experiment(path: str | Path, only: list[str] | None = None, seeds: list[int] | None = None,
                    overrides: dict[str, str] | None = None) -> list[RunConfig]:
    """The runs of an experiment file, one per variant x seed, with CLI overrides applied and every run checked
    (including that its data files exist). Raises ExperimentError."""
    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    try:
        namespace = runpy.run_path(str(path), run_name=f"ablate_experiment_{path.stem}")
    except SyntaxError as exc:
        raise ExperimentError(f"{path}:{exc.lineno}: syntax error: {exc.msg}") from None
    except TypeError as exc:
        raise ExperimentError(f"{_line_in(path, exc)}: {_explain_type_error(exc)}") from None
    except Exception as exc:  # ConfigError from variant()/grid(), NameError, ImportError...
        raise ExperimentError(f"{_line_in(path, exc)}: {type(exc).__name__}: {exc}") from None

    runs = namespace.get("runs")
    if callable(runs):
        runs = runs()
    if not isinstance(runs, (list, tuple)) or not runs or not all(isinstance(r, RunConfig) for r in runs):
        raise ExperimentError(f"{path}: must define `runs`, a non-empty list of RunConfig (or a function returning "
                              f"one); got {type(runs).__name__}")
    names = [r.name for r in runs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ExperimentError(f"{path}: variant names must differ; repeated: {duplicated}")
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise ExperimentError(f"--only {','.join(unknown)}: no such variant in {path}; allowed: {names}")
        runs = [r for r in runs if r.name in only]
    file_seeds = namespace.get("seeds", None)
    chosen_seeds = seeds if seeds is not None else file_seeds
    if chosen_seeds is not None and (not isinstance(chosen_seeds, (list, tuple)) or not chosen_seeds
                                     or not all(isinstance(s, int) for s in chosen_seeds)):
        raise ExperimentError(f"{path}: seeds must be a non-empty list of ints, got {chosen_seeds!r}")

    resolved = []
    for run in runs:
        try:
            if run.experiment == "default":  # the file's name names the experiment unless the file says otherwise
                run = dataclasses.replace(run, experiment=path.stem)
            run = apply_overrides(run, overrides or {}, from_text=True)
            for seed in chosen_seeds or [run.train.seed]:
                seeded = validate(dataclasses.replace(run, train=dataclasses.replace(run.train, seed=seed)))
                check_data_config(seeded.data, seeded.model.vocab_size)
                resolved.append(seeded)
        except ConfigError as exc:
            raise ExperimentError(f"{path}: variant {run.name!r}: {exc}") from None
    return resolved
