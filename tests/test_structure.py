"""The shape of the code: imports run one way, and no module grows past 600 lines.

Every module of src/ablate (and kernels/, installed as ablate.kernels) is parsed with `ast`, so imports inside
functions count too: a lazy import is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ablate import rundir

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"ablate": REPO / "src" / "ablate", "ablate.kernels": REPO / "kernels"}
MAX_LINES = 600

# Each group may import only groups of lower layers (and itself). A group is a module of ablate named by its path
# below the package (`setup.checks`, `config`), or a package taken whole (`eval`: the suite's engine, tasks, metrics
# and agreement; `report`, `optim`, `kernels`, `training.callbacks`): the longest name here that a module's path
# starts with. A new module must be placed here (and in docs/architecture.md).
# The folders' own __init__ (a docstring each) import nothing; a folder is never a group for the modules in it.
FOLDERS = {"setup", "data", "training", "launch", "cost", "components"}
LAYERS = [
    {"text", "kernels", *FOLDERS},  # nothing else of ablate
    {"config"},  # the folder-name rule from text
    {"rundir", "components.registry", "components.parametrization"},  # the run folder; every component a config
    # field names, by name; how init, lr and multipliers scale with width and depth (arithmetic on ModelConfig)
    {"checkpoint_files"},  # a checkpoint's files, read and checked: below both training and eval.load
    {"data.sources", "data.mixture", "data.batch_schedule"},  # mixture: below data.prepare, which imports it
    {"data.tokenizer", "setup.overrides", "setup.auto"},  # auto: every "auto" (device, dtype, kernels, compile)
    {"data.token_files", "components.moe", "components.score_mods"},  # token files; MoE; attention score_mods
    {"model", "data.prepare", "optim", "eval"},  # eval: the suite (tasks, engine, metrics, suite, agreement)
    {"report", "data.tokenizer_stats", "setup.variants", "setup.components"},  # variants: variant, grid, branch
    # (no torch); components: the components a run names, checked on the meta device
    {"setup.checks"},  # a run checked once (CheckedRun), before compute
    {"setup.experiment"},  # loading an experiment file: nothing of training above here (test below)
    {"training.parallel", "cost.memory"},  # memory: the per-rank peak of a step, which plan and run check
    {"training.checkpoint"},
    {"training.callbacks", "eval.load"},  # eval.load: a run folder or checkpoint as an eval-mode model
    {"eval.checkpoints", "eval.export", "eval.lm_eval_model"},  # every checkpoint scored; transformers; lm-eval
    {"training.figures", "training.interrupt"},  # a step's figures on their way to the callbacks; Ctrl-C
    {"training.graphs"},  # a step replayed from CUDA graphs (train.cuda_graphs): the figures it stages
    {"training.trainer"},  # the Trainer and its step, above every callback it runs
    {"training.stack_eval"},  # a stack's members scored by the task suite in one pass (their EvalSuites record)
    {"training.stack"},  # runs of one shape stepped as one stacked model (members are Trainers)
    {"training.run"},  # the run's life and train()
    {"launch.sweep", "cost.plan", "launch.study"},  # study: the rounds of `ablate run --until-decided`
    {"launch.slurm"},
    {"cli.options"},  # the value each option accepts
    {"cli.run", "cli.plan", "cli.status", "cli.eval", "cli.export", "cli.report", "cli.tokenizer", "cli.lm_eval"},
    {"cli", "__init__"},  # the `ablate` parser and main; the public API
    {"__main__"},
]
LAYER = {group: i for i, layer in enumerate(LAYERS) for group in layer}

# Narrower rules, named in docs/architecture.md: the groups (outside its own) each may import.
ALLOWED = {
    **{folder: set() for folder in FOLDERS},
    "config": {"text"},
    "text": set(),
    "kernels": set(),
    "rundir": {"text"},
    "components.registry": {"config"},
    "components.score_mods": {"config", "components.registry"},
    "checkpoint_files": {"config", "rundir"},  # scoring a checkpoint reaches nothing of training
    "components.parametrization": {"config"},
    "components.moe": {"config", "kernels", "components.parametrization"},
    "model": {"config", "kernels", "components.moe", "components.registry", "components.score_mods"}
    | {"components.parametrization"},
    # the suite never imports callbacks, training or checkpoints; it asks setup.auto the one dtype rule
    "eval": {"config", "rundir", "setup.auto", "components.registry"},
    "report": {"rundir", "text"},  # no torch: reads run folders through rundir alone
}
# `ablate status`, `ablate report` and an experiment file's `from ablate import ...` start quickly
NO_TORCH = {
    "config",
    "components.registry",
    "rundir",
    "text",
    "report",
    "setup.variants",
    "setup.overrides",
    "data.tokenizer",
    "data.tokenizer_stats",
    "cli",
    "cli.status",
    "cli.report",
}


def _modules() -> dict[str, Path]:
    """{dotted module name: file} for every module of ablate."""
    found = {}
    for package, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def group_of(module: str) -> str:
    """ablate.setup.checks -> setup.checks, ablate.eval.suite -> eval, ablate.report.inputs.runs -> report, ablate (the
    package's __init__) -> __init__; a module no group names is its own path (and unplaced)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in LAYER and (name not in FOLDERS or end == len(parts)):
            return name
    return ".".join(parts)


def _target(module: str, name: str | None) -> str:
    """The ablate module an import names: `from ablate import rundir` names ablate.rundir, `from ablate.config
    import X` names ablate.config, `from ablate import ConfigError` names ablate itself."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def imports_of(path: Path) -> set[str]:
    """The ablate modules a file imports, at the top or inside functions; and any top-level package names it
    imports (for the torch check)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; use `from ablate... import`"
            for alias in node.names:
                found.add(_target(node.module, alias.name) if node.module.split(".")[0] == "ablate" else node.module)
    return found


def ablate_imports(module: str) -> set[str]:
    return {m for m in imports_of(MODULES[module]) if m.split(".")[0] == "ablate"}


# Inside `report` (one group above), its rooms import one way too (docs/architecture.md): report.json's schema (its
# records, importing nothing) and the pure statistics, what is read, the options, the text's shared parts (fmt.py,
# plots.py), the sections (each its computation and its rendering: the decisions', the signal's, the sweep's among
# them), then the page that assembles them (report.md and report.html), the orchestrator and the whole-report
# calibration. A room is a folder of report/ or a module named by its path below it: the longest name here that a
# module's path starts with (text.render is its own room, text.fmt is text's).
REPORT_ROOMS = "schema stats inputs options text sections text.render analyze calibrate".split()
# Narrower: the rooms (outside its own) each may import. stats knows nothing of runs; run folders are read in inputs.
REPORT_ALLOWED = {"schema": set(), "stats": set(), "inputs": {"stats", "schema"}}
# A section reads no other section: what one needs of another reaches it as a value (the decisions take the signal
# section's recommendation as one), passed by analyze; what two share of the runs is in inputs (failures.py).
SEQUENTIAL_SECTION = "ablate.report.sections.sequential"


def _report_room(module: str) -> str | None:
    parts = module.split(".")
    if len(parts) <= 2 or parts[:2] != ["ablate", "report"]:
        return None
    for end in range(len(parts), 2, -1):
        if ".".join(parts[2:end]) in REPORT_ROOMS:
            return ".".join(parts[2:end])
    return parts[2]


def test_the_report_rooms_import_one_way():
    rank = {room: i for i, room in enumerate(REPORT_ROOMS)}
    rooms = {_report_room(m) for m in MODULES} - {None}
    assert rooms <= set(rank), f"place {sorted(rooms - set(rank))} in REPORT_ROOMS (and docs/architecture.md)"
    wrong = []
    for module in MODULES:
        room = _report_room(module)
        for target in ablate_imports(module) if room else ():
            other = _report_room(target)
            if other is not None and rank[other] > rank[room]:
                wrong.append(f"{module} ({room}) imports {target} ({other})")
            if other not in (None, room) and room in REPORT_ALLOWED and other not in REPORT_ALLOWED[room]:
                allowed = sorted(REPORT_ALLOWED[room]) or "nothing else of the report"
                wrong.append(f"{module} ({room}) imports {target}; {room} may import only {allowed}")
    assert not wrong, "\n".join(wrong)


def _section_of(module: str) -> str | None:
    """ablate.report.sections.signal.choose -> signal; None outside the sections."""
    parts = module.split(".")
    return parts[3] if len(parts) > 4 and parts[:3] == ["ablate", "report", "sections"] else None


def test_a_section_imports_no_other_section():
    crossings = set()
    for module in MODULES:
        section = _section_of(module)
        for target in ablate_imports(module) if section else ():
            other = _section_of(target)
            if other not in (None, section):
                crossings.add((section, other))
    assert _section_of("ablate.report.sections.signal.choose") == "signal"
    assert _section_of("ablate.report.analyze") is None
    assert not crossings, f"sections importing another section: {sorted(crossings)}; pass the value instead"


def test_the_study_driver_imports_only_the_sequential_section():
    report = {m for m in ablate_imports("ablate.launch.study") if m.startswith("ablate.report")}
    assert report, "the rule sees the driver's imports"
    outside = sorted(m for m in report if not m.startswith(f"{SEQUENTIAL_SECTION}."))
    assert not outside, f"ablate.launch.study imports {outside}"


def test_every_module_is_placed_in_a_layer():
    unplaced = sorted({group_of(m) for m in MODULES} - set(LAYER))
    assert not unplaced, f"add {unplaced} to LAYERS in tests/test_structure.py (and docs/architecture.md)"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module):
    group = group_of(module)
    for target in sorted(ablate_imports(module)):
        other = group_of(target)
        if other == group:
            continue
        assert LAYER[other] < LAYER[group], (
            f"{module} imports {target}: layer {LAYER[group]} ({group}) may import "
            f"only lower layers, and {other} is layer {LAYER[other]}"
        )
        if group in ALLOWED:
            assert other in ALLOWED[group], (
                f"{module} imports {target}; {group} may import only "
                f"{sorted(ALLOWED[group]) or 'nothing else of ablate'}"
            )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if group_of(m) in NO_TORCH))
def test_run_folder_readers_never_import_torch(module):
    heavy = sorted(m for m in imports_of(MODULES[module]) if m.split(".")[0] in ("torch", "triton", "transformers"))
    assert not heavy, f"{module} imports {heavy}"


def test_eval_training_callback_is_outside_the_eval_package():
    """The one module that joins the eval engine and the training callbacks."""
    assert "ablate.training.callbacks.evals" in MODULES
    assert {"ablate.training.callbacks.base", "ablate.eval.suite"} <= ablate_imports("ablate.training.callbacks.evals")


# The names inside a run folder (rundir spells each once). The data cache keeps a tokenizer.json of its own.
RUN_FOLDER_NAMES = {
    rundir.CONFIG,
    rundir.SUMMARY,
    rundir.STATUS,
    rundir.METRICS,
    rundir.EVALS,
    rundir.LOCK,
    rundir.ERROR,
    rundir.LOGS,
    rundir.CHECKPOINTS,
    rundir.TOKENIZER,
    rundir.TENSORBOARD,
    rundir.EVAL_ITEMS,
    rundir.CKPT_META,
    rundir.CKPT_REASON,
}
PREFIXES = (rundir.STEP_PREFIX, rundir.TMP_PREFIX, rundir.DAMAGED_PREFIX)  # of checkpoint and eval_items folders
ELSEWHERE = {
    ("ablate.data.prepare", rundir.TOKENIZER),
    ("ablate.eval.tasks", rundir.CONFIG),
}  # an oe-eval request folder's config.json, not a run's


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "ablate.rundir"))
def test_run_folder_names_are_spelled_in_rundir_alone(module):
    """A string (or f-string piece) that names a file or folder of a run folder: use rundir's name for it."""
    spelled = []
    for node in ast.walk(ast.parse(MODULES[module].read_bytes())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            names = [n for n in RUN_FOLDER_NAMES if text == n or text.endswith("/" + n)] + [
                p for p in PREFIXES if text.startswith(p)
            ]
            spelled += [(node.lineno, text) for n in names if (module, n) not in ELSEWHERE]
    assert not spelled, f"{MODULES[module]}: run-folder names spelled out (line, text): {spelled}; use ablate.rundir"


def test_the_package_is_a_few_rooms():
    """src/ablate/ is folders by job and the few files every job shares: a newcomer meets at most 17 entries."""
    entries = sorted(p.name for p in ROOTS["ablate"].iterdir() if p.name != "__pycache__")
    assert len(entries) <= 17, f"src/ablate/ holds {len(entries)} entries: {entries}; put the new one in a folder"
    assert {"setup", "data", "training", "launch", "cost", "cli", "eval", "report"} <= set(entries)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]}: {lines} lines; split it (at most {MAX_LINES})"


def test_the_rules_see_real_imports():
    """The parser finds what is there (a rule that sees nothing passes vacuously)."""
    assert ablate_imports("ablate.model") == {
        *("ablate.config", "ablate.kernels", "ablate.components.moe"),
        *("ablate.components.registry", "ablate.components.score_mods", "ablate.components.parametrization"),
    }
    assert "ablate.rundir" in ablate_imports("ablate.report.inputs.runs")
    assert "ablate.eval.engine" in ablate_imports("ablate.eval.suite")
    assert {group_of("ablate.eval.engine"), group_of("ablate.eval.load")} == {"eval", "eval.load"}
    assert group_of("ablate.training.callbacks.stability") == "training.callbacks"
    assert len(MODULES) > 40


# ---------------------------------------------------------------------------------------------------------------
# the import graph as a whole: no cycles, and loading an experiment stays clear of training


def import_graph() -> dict[str, set[str]]:
    """{module: the ablate modules it imports (at the top or inside functions)} for every module of ablate."""
    return {m: ablate_imports(m) - {m} for m in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state, path = {}, []  # state: "open" while on the current path, "done" once all it reaches is searched

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            found = None if target in state else visit(target)
            if found:
                return found
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        found = None if module in state else visit(module)
        if found:
            return found
    return None


def reached_from(start: str) -> dict[str, str]:
    """{module: the chain of imports from `start` to it} for every module `start` imports, directly or not."""
    graph, chains, todo = import_graph(), {start: start}, [start]
    while todo:
        module = todo.pop()
        for target in sorted(graph.get(module, ())):
            if target not in chains:
                chains[target] = f"{chains[module]} -> {target}"
                todo.append(target)
    del chains[start]
    return chains


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    """Two modules that import each other (even inside a function) are one module in two files: neither can be
    read, tested or placed in a layer alone."""
    cycle = find_cycle(import_graph())
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


# The modules that train (and those that start training): loading or checking an experiment reaches none of them
CALLBACK_MODULES = tuple(sorted(m for m in MODULES if m.startswith("ablate.training.callbacks.")))
TRAINING = {
    "ablate.training.run",
    "ablate.training.trainer",
    *CALLBACK_MODULES,
    "ablate.training.checkpoint",
    "ablate.training.parallel",
    # not ablate.model: checking a run builds its components on the meta device (ablate.setup.components)
    "ablate.launch.sweep",
    "ablate.launch.slurm",
}


@pytest.mark.parametrize("module", ["ablate.setup.experiment", "ablate.setup.variants", "ablate.setup.checks"])
def test_loading_an_experiment_imports_no_training_module(module):
    reached = reached_from(module)
    bad = sorted(reached[m] for m in TRAINING & set(reached))
    assert not bad, f"{module} reaches training modules: {bad}"


def test_the_training_modules_are_named_right():
    """A renamed training module must be renamed in TRAINING too, or the rule above checks nothing for it."""
    assert TRAINING <= set(MODULES)
    assert {"ablate.config", "ablate.setup.checks", "ablate.setup.variants", "ablate.eval.suite"} <= set(
        reached_from("ablate.setup.experiment")
    )  # the walk follows imports (checks imports the suite inside a function)


# The modules that start runs, the only ones that import the run module (ablate.training.run): everything below it in
# LAYERS (experiment loading included) and planning beside it never do
RUN_STARTERS = {"ablate", "ablate.launch.sweep", "ablate.launch.slurm"}


def test_only_the_modules_that_start_runs_import_the_run_module():
    importers = {m for m, targets in import_graph().items() if "ablate.training.run" in targets}
    assert "ablate.launch.sweep" in importers  # the rule sees real imports
    assert importers <= RUN_STARTERS, (
        f"{sorted(importers - RUN_STARTERS)} import ablate.training.run; only {sorted(RUN_STARTERS)} may "
        "(they start runs)"
    )
    assert all(LAYER[group_of(m)] > LAYER["training.run"] for m in RUN_STARTERS)


def test_callbacks_read_only_what_trainer_view_declares():
    """Every `trainer.<name>` a standard callback touches is declared in TrainerView (the typed contract), so the
    protocol says what callbacks really read."""
    view = next(
        node
        for node in ast.walk(ast.parse(MODULES["ablate.training.callbacks.base"].read_bytes()))
        if isinstance(node, ast.ClassDef) and node.name == "TrainerView"
    )
    declared = {n.target.id for n in view.body if isinstance(n, ast.AnnAssign)}
    declared |= {n.name for n in view.body if isinstance(n, ast.FunctionDef)}
    read = {}
    for module in CALLBACK_MODULES:
        for node in ast.walk(ast.parse(MODULES[module].read_bytes())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                read.setdefault(node.attr, f"{module}:{node.lineno}")
    assert len(CALLBACK_MODULES) >= 8 and len(read) > 10  # the scan sees every callback module and its reads
    undeclared = {name: where for name, where in read.items() if name not in declared}
    assert not undeclared, f"callbacks read trainer attributes TrainerView does not declare: {undeclared}"


def test_pyproject_lists_every_package_of_the_tree():
    """A folder of src/ablate/ left out of pyproject's `packages` is not installed: the editable install of a fresh
    venv fails on one listed but gone, and a wheel leaves out one that is new (the wheel test is in the slow tier)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    src = REPO / "src"
    tree = {".".join(p.parent.relative_to(src).parts) for p in (src / "ablate").rglob("__init__.py")}
    tree |= {"ablate.kernels", "ablate_evals", "ablate_evals.lm_eval_tasks"}  # package-dir maps these
    assert listed == tree, f"in pyproject, not in the tree: {sorted(listed - tree)}; missing: {sorted(tree - listed)}"
