"""Experiment files: plain Python that defines `runs` (a list of RunConfig, one per variant) and optionally `seeds`,
`callbacks`, `decision` (the DecisionRule of `ablate run --until-decided`) and `stack` (`ablate run --stack`'s
default: runs of one shape trained K at a time as one stacked model).

Loading a file runs its top level (which only builds configs) and checks every run; it never starts compute. Any
problem becomes one ExperimentError naming the file, the line where it can be known, the field and what is allowed.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import re
import runpy
import sys
import traceback
import unicodedata
from pathlib import Path
from collections.abc import Sequence

from ablate.config import SECTIONS, ConfigError, ExperimentError, RunConfig, validate
from ablate.data.prepare import check_data_config
from ablate.setup.checks import CheckedRun, check_run
from ablate.setup.overrides import apply_overrides
from ablate.setup.variants import resolve_branches
from ablate.text import COMPUTE_POINT_MARK


def _line_in(path: Path, exc: BaseException) -> str:
    """'file:line' of the innermost frame inside the experiment file."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == path.resolve():
            line = frame.lineno
    return f"{path}:{line}" if line else str(path)


def _defined_at(path: Path, name: str) -> str:
    """'file:line' of the last top-level statement that binds `name` (runs = ..., def runs(), seeds = ...)."""
    line = None
    for node in ast.parse(path.read_bytes()).body:  # bytes: the file's own coding declaration applies
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        else:
            continue
        if name in bound:
            line = node.lineno
    return f"{path}:{line}" if line else str(path)


def _explain_type_error(exc: TypeError) -> str:
    """Add the allowed fields to Python's 'got an unexpected keyword argument' message."""
    message = str(exc)
    match = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", message)
    if match:
        cls_name, bad = match.groups()
        classes = {c.__name__: c for c in (RunConfig, *SECTIONS.values())}
        if cls_name in classes:
            allowed = sorted(f.name for f in dataclasses.fields(classes[cls_name]))
            return f"{cls_name}: unknown field {bad!r}; allowed: {', '.join(allowed)}"
    return message


def _explain(path: Path, exc: Exception) -> ExperimentError:
    """An exception raised by the file's code, as one message at the line in the file where it happened."""
    if isinstance(exc, SyntaxError):
        return ExperimentError(f"{exc.filename or path}:{exc.lineno}: syntax error: {exc.msg}")
    if isinstance(exc, TypeError):
        return ExperimentError(f"{_line_in(path, exc)}: {_explain_type_error(exc)}")
    return ExperimentError(f"{_line_in(path, exc)}: {type(exc).__name__}: {exc}")  # ConfigError, NameError, ...


# An experiment file executes once per process: its runs, seeds, decision rule and callbacks are all read from the
# one namespace. Keyed by the file's bytes, so a file changed since (a study's next round) is executed again.
_EXECUTED: dict[tuple[str, bytes], dict] = {}


def _run_file(path: Path) -> dict:
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    key = (str(path.resolve()), path.read_bytes())
    if key not in _EXECUTED:
        try:
            _EXECUTED[key] = runpy.run_path(str(path), run_name=f"ablate_experiment_{path.stem}")
        except Exception as exc:
            raise _explain(path, exc) from None
    return _EXECUTED[key]


def _runs_of(path: Path, namespace: dict) -> list[RunConfig]:
    runs = namespace.get("runs")
    if callable(runs):
        try:
            runs = runs()
        except Exception as exc:  # raised inside the function: name the line inside it
            raise _explain(path, exc) from None
    where = _defined_at(path, "runs") if "runs" in namespace else str(path)
    if not isinstance(runs, (list, tuple)) or not runs:
        raise ExperimentError(
            f"{where}: must define `runs`, a non-empty list of RunConfig (or a function returning "
            f"one); got {type(runs).__name__}"
        )
    for i, run in enumerate(runs):
        if not isinstance(run, RunConfig):
            raise ExperimentError(
                f"{where}: runs[{i}] is a {type(run).__name__}; allowed: RunConfig (e.g. from variant() or grid())"
            )
    names = [r.name for r in runs]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ExperimentError(f"{where}: variant names must differ; repeated: {duplicated}")
    _check_case_clash(names, where)
    return list(runs)


def _check_case_clash(names: list[str], where: str) -> None:
    """Names that differ only in case (or in Unicode normalization: é as one code point or two) name one folder on
    case-insensitive file systems such as macOS's and Windows'."""
    folded: dict[str, list[str]] = {}
    for name in names:
        folded.setdefault(unicodedata.normalize("NFC", name).casefold(), []).append(name)
    clash = next((group for group in folded.values() if len(group) > 1), None)
    if clash:
        raise ExperimentError(
            f"{where}: variant names {clash} differ only in case (or Unicode form), which makes "
            f"them one folder on case-insensitive file systems (macOS, Windows); allowed: names "
            f"that differ in more than case"
        )


# ---------------------------------------------------------------------------------------------------------------
# --only: names and globs, where grid names hold commas ("lr=0.01,global_batch=16")


def _matches(pattern: str, names: list[str]) -> list[str]:
    return [n for n in names if n == pattern or fnmatch.fnmatchcase(n, pattern)]


def _patterns(text: str, names: list[str], path: Path) -> list[str]:
    """Split one --only value into names/globs. The whole text is one pattern if it matches a variant; otherwise
    split on commas, joining back the longest run of pieces that matches (a grid name's own commas)."""
    text = text.strip()
    if _matches(text, names):
        return [text]
    pieces = [p.strip() for p in text.split(",")]
    patterns, i = [], 0
    while i < len(pieces):
        if not pieces[i]:  # "a,,b" or a trailing comma
            i += 1
            continue
        j = next((j for j in range(len(pieces), i, -1) if _matches(",".join(pieces[i:j]), names)), None)
        if j is None:
            raise ExperimentError(f"--only {pieces[i]}: no such variant (name or glob) in {path}; allowed: {names}")
        patterns.append(",".join(pieces[i:j]))
        i = j
    return patterns


def select_runs(runs: list[RunConfig], only: str | Sequence[str] | None, path: Path) -> list[RunConfig]:
    """The runs whose names match --only (each value a name, glob or comma-separated list of them), file order."""
    if not only:
        return runs
    names = [r.name for r in runs]
    patterns = [p for text in ([only] if isinstance(only, str) else only) for p in _patterns(text, names, path)]
    chosen = {n for p in patterns for n in _matches(p, names)}
    return [r for r in runs if r.name in chosen]


# ---------------------------------------------------------------------------------------------------------------
# the CLI's other choices


def _seeds_of(path: Path, namespace: dict, seeds: list[int] | None) -> list[int] | None:
    if seeds is not None:
        chosen, where = seeds, f"--seeds {','.join(str(s) for s in seeds) or repr(seeds)}"
    elif "seeds" in namespace:
        chosen, where = namespace["seeds"], f"{_defined_at(path, 'seeds')}: seeds"
    else:
        return None
    ints = isinstance(chosen, (list, tuple)) and all(isinstance(s, int) and not isinstance(s, bool) for s in chosen)
    if not ints or not chosen or any(s < 0 for s in chosen):
        raise ExperimentError(f"{where}: got {chosen!r}; allowed: a non-empty list of ints >= 0, e.g. [0, 1, 2]")
    repeated = sorted({s for s in chosen if list(chosen).count(s) > 1})
    if repeated:
        raise ExperimentError(f"{where}: repeated seeds {repeated}; allowed: distinct ints >= 0")
    return list(chosen)


def _check_name_override(overrides: dict, runs: list[RunConfig]) -> None:
    """--set name=x over several variants would train the first and refuse the rest as the same run."""
    if "name" in overrides and len(runs) > 1:
        raise ExperimentError(
            f"--set name={overrides['name']} would give every one of the {len(runs)} variants the "
            f"same name; allowed: --set name=... only with one variant (use --only)"
        )


def _decision_of(path: Path, namespace: dict):
    """The file's `decision`, checked: a DecisionRule (ablate.report.sections.sequential.rule) or None when it defines
    none."""
    if "decision" not in namespace:
        return None
    found, where = namespace["decision"], f"{_defined_at(path, 'decision')}: decision"
    # looked up, not imported (as callbacks are): a file that made a DecisionRule imported it, and loading stays fast
    rule_class = getattr(sys.modules.get("ablate.report.sections.sequential.rule"), "DecisionRule", None)
    if rule_class is None or not isinstance(found, rule_class):
        raise ExperimentError(
            f"{where} is a {type(found).__name__}; allowed: ablate.DecisionRule(metrics=..., margins=..., alpha=..., "
            f"max_seeds=..., budget=...)"
        )
    try:
        found.check(where)
    except ValueError as exc:
        raise ExperimentError(str(exc)) from None
    return found


def _multiplier_baseline_of(path: Path, namespace: dict, runs: list[RunConfig]) -> str:
    """The file's `multiplier_baseline`: a method's name (a run's name without its scale suffix "@..." and
    compute-point mark "~..."), checked against the file's runs; "" when it defines none."""
    if "multiplier_baseline" not in namespace:
        return ""
    found, where = namespace["multiplier_baseline"], f"{_defined_at(path, 'multiplier_baseline')}: multiplier_baseline"
    methods = sorted({r.name.split(COMPUTE_POINT_MARK)[0].split("@")[0] for r in runs} | {r.name for r in runs})
    if not isinstance(found, str) or found not in methods:
        raise ExperimentError(
            f"{where} is {found!r}; allowed: the name of one of the file's methods: {', '.join(methods)}"
        )
    return found


def _stack_of(path: Path, namespace: dict) -> int:
    """The file's `stack`: how many runs of one shape `ablate run` trains at once as one stacked model (1: none)."""
    if "stack" not in namespace:
        return 1
    found = namespace["stack"]
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        raise ExperimentError(
            f"{_defined_at(path, 'stack')}: stack is {found!r}; allowed: an int >= 1 (1: every run trains alone)"
        )
    return found


def experiment_stack(path: str | Path) -> int:
    """`ablate run`'s stack size from the file's `stack` (1 when it defines none). Raises ExperimentError."""
    path = Path(path)
    return _stack_of(path, _run_file(path))


def experiment_study(path: str | Path) -> tuple[object | None, list[int] | None]:
    """What a study (`ablate run --until-decided`) takes from the file: its `decision` (a DecisionRule, or None)
    and its own `seeds` (None when it defines none). Raises ExperimentError naming the file and the field."""
    path = Path(path)
    namespace = _run_file(path)
    return _decision_of(path, namespace), _seeds_of(path, namespace, None)


def check_runs_root(path: str | Path) -> Path:
    """--out must be a folder or not exist yet (it is created), and not under a file."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise ExperimentError(f"--out {path}: is a file; allowed: a folder (it is created if missing)")
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ExperimentError(f"--out {path}: {blocking} is a file; allowed: a folder (it is created if missing)")
    return out


def load_experiment(
    path: str | Path,
    only: str | Sequence[str] | None = None,
    seeds: list[int] | None = None,
    overrides: dict[str, str] | None = None,
) -> list[RunConfig]:
    """The runs of an experiment file as RunConfigs, checked as load_checked checks them (for code that changes
    them further: train() checks what it is given unchecked)."""
    return [checked.config for checked in load_checked(path, only, seeds, overrides)]


def load_checked(
    path: str | Path,
    only: str | Sequence[str] | None = None,
    seeds: list[int] | None = None,
    overrides: dict[str, str] | None = None,
) -> list[CheckedRun]:
    """The runs of an experiment file, one per variant x seed, with CLI overrides applied, each checked once
    (ablate.setup.checks.check_run: its data files exist and start readable, its names are known, this machine
    has what it asks). `only` is --only as typed (a string, or a list of
    them for a repeated flag): names or globs, comma-separated. Raises ExperimentError."""
    path = Path(path)
    namespace = _run_file(path)
    every_run = _runs_of(path, namespace)
    chosen = {r.name for r in select_runs(every_run, only, path)}
    chosen_seeds = _seeds_of(path, namespace, seeds)
    _decision_of(path, namespace)  # checked by every command, not only by a study
    _stack_of(path, namespace)
    multiplier_baseline = _multiplier_baseline_of(path, namespace, every_run)
    overrides = overrides or {}
    _check_name_override(overrides, [r for r in every_run if r.name in chosen])
    resolved, picked = [], set()  # picked: the chosen runs, by id (--set name=... renames one)
    for run in every_run:  # all of them when there are branches: a chosen branch needs its parent's identity
        if run.name not in chosen and not any(r.branch for r in every_run):
            continue
        is_chosen = run.name in chosen
        try:
            if run.experiment == "default":  # the file's name names the experiment unless the file says otherwise
                run = dataclasses.replace(run, experiment=path.stem)
            if multiplier_baseline and not run.multiplier_baseline:  # recorded in config.json, for the report
                run = dataclasses.replace(run, multiplier_baseline=multiplier_baseline)
            # recorded in config.json: ablate eval and ablate report load what the file registers from it
            run = dataclasses.replace(run, experiment_file=str(path.resolve()))
            run = apply_overrides(
                run, overrides if is_chosen else {k: v for k, v in overrides.items() if k != "name"}, from_text=True
            )
            check_data_config(run.data, run.model.vocab_size)  # once per variant: the seed changes no data field
            for seed in chosen_seeds or [run.train.seed]:
                seeded = validate(dataclasses.replace(run, train=dataclasses.replace(run.train, seed=seed)))
                resolved.append(seeded)
                if is_chosen:
                    picked.add((seeded.name, seed))
        except ConfigError as exc:
            raise ExperimentError(f"{path}: variant {run.name!r}: {exc}") from None
    checked = []
    for run in resolve_branches(resolved, str(path)):  # once per run that will train, before any compute
        if (run.name, run.train.seed) not in picked:
            continue
        try:  # optim.name and eval.tasks, which config cannot check; the device, float8 and the world size
            checked.append(check_run(run, prechecked=True))
        except ConfigError as exc:
            raise ExperimentError(f"{path}: variant {run.name!r}: {exc}") from None
    return checked


def experiment_callbacks(path: str | Path) -> list:
    """The file's module-level `callbacks`: Callback instances (ablate.training.callbacks) that every run of the file
    adds to its standard ones; [] when the file defines none. Raises ExperimentError naming the file and the field."""
    from types import ModuleType

    path = Path(path)
    namespace = _run_file(path)
    found = namespace.get("callbacks", [])
    if isinstance(found, ModuleType):  # `from ablate import callbacks`: the module, not a list of them
        return []
    where = f"{_defined_at(path, 'callbacks')}: callbacks"
    if not isinstance(found, (list, tuple)):
        raise ExperimentError(
            f"{where} is a {type(found).__name__}; allowed: a list of ablate.training.callbacks.Callback instances"
        )
    # looked up, not imported: loading an experiment stays clear of torch, and a file that made a Callback has
    # imported ablate.training.callbacks itself
    base = getattr(sys.modules.get("ablate.training.callbacks"), "Callback", None)
    for i, entry in enumerate(found):
        if base is None or not isinstance(entry, base):
            raise ExperimentError(
                f"{where}[{i}] is a {type(entry).__name__}; allowed: instances of a subclass of "
                f"ablate.training.callbacks.Callback"
            )
    return list(found)


def load_registrations(path: str | Path) -> None:
    """Execute an experiment file for what it registers (optimizers, components, tasks: ablate.components.registry),
    once per process as every command does. Raises ExperimentError naming the file."""
    _run_file(Path(path))


def recorded_experiment_files(path: str | Path) -> list[str]:
    """The experiment files that the run folders at or below `path` (a run, an experiment, a runs root, or a
    checkpoint inside a run) record in their config.json (RunConfig.experiment_file), in sorted order."""
    from ablate import rundir

    path = Path(path)
    run = next((p for p in (path, *path.parents) if (p / rundir.CONFIG).is_file()), None)
    configs = [run / rundir.CONFIG] if run is not None else sorted(path.rglob(rundir.CONFIG))
    files = set()
    for config in configs:
        try:
            recorded = rundir.read_json(config).get("config", {}).get("experiment_file", "")
        except rundir.RunFolderError:
            continue  # a damaged folder: the command that reads it says so
        if recorded:
            files.add(recorded)
    return sorted(files)


def load_recorded(path: str | Path, experiment: str | Path | None = None) -> list[str]:
    """Run `experiment`, or each experiment file the run folders at or below `path` record, for what it registers
    (`ablate eval` and `ablate export` before they read a run); the recorded files that are gone, to be said."""
    if experiment:
        load_registrations(experiment)
        return []
    files = recorded_experiment_files(path)
    for file in files:
        if Path(file).is_file():
            load_registrations(file)
    return [file for file in files if not Path(file).is_file()]
