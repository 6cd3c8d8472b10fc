"""Write the report of a fixed set of constructed studies into OUT (one folder each: report.json, report.md,
report.html), so a refactor of ablate.report can be checked byte for byte:

    python scripts/report_identity.py /tmp/ref        # before the change
    python scripts/report_identity.py /tmp/new        # after it
    diff -r /tmp/ref /tmp/new                         # empty: the same report

It runs on a tree from before the report's rooms (issue 36) too, so either side can be an older commit: export it
(`git archive REV | tar -x -C DIR`) and run this file from the current tree with PYTHONPATH=DIR/src and
REPORT_IDENTITY_TREE=DIR (its tests/ hold the run-set builders of that commit).

The studies are the docs' fixtures (tests/report_fixtures.py) and the run sets the report tests build (their own
helpers, imported from tests/: a compute-multipliers ladder among them, with and without --baseline), plus two
calibration designs held in memory, built in one fixed folder so the runs' path reads the same. The time the
analysis took (report["seconds"]) is set to 0 before rendering: it is the one figure that differs from run to run.
As write_report does: the report through its schema's records where the tree has them (ablate.report.schema),
report.json, then the text rendered from it.
"""

from __future__ import annotations

import importlib
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(os.environ.get("REPORT_IDENTITY_TREE") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(REPO / "tests"))

from report_fixtures import build_grid_experiment, build_toy_experiment  # noqa: E402
from test_report_decisions import _tokenizer_runs  # noqa: E402
from test_report_inference import _clear_effect_study  # noqa: E402
from test_report_multipliers import _write_ladder  # noqa: E402
from test_report_sequential import _write_study  # noqa: E402
from test_report_signal import BPB_CLEAN, _grouped, _ladder, _mc_experiment  # noqa: E402
from test_sequential import three_variant_study  # noqa: E402

from ablate.report import Options, build_report  # noqa: E402

FAST = Options(bootstrap=0)
SCALED = Options(bootstrap=200, scale=["model.d_model"])
WORK = Path("/tmp/ablate-report-identity")  # the studies' run folders: one path, so report.json's runs_dir agrees


def _module(*names: str):
    """ablate.report's module by its path (sections.sequential.rule), else by an older one (inference.sequential),
    else where it was before the rooms."""
    for name in names:
        try:
            return importlib.import_module(f"ablate.report.{name}")
        except ModuleNotFoundError:
            continue
    return importlib.import_module(f"ablate.report.{names[-1].split('.')[-1]}")


def _sequential(root: Path) -> Path:
    sequential = _module("sections.sequential.rule", "inference.sequential")

    seeds = {"baseline": 6, "slow": 3, "twin": 6}
    three_variant_study(root, seeds)
    _write_study(root, sequential.DecisionRule(margins={"val_loss": 0.01}, max_seeds=6), seeds)
    return root


def _batches(root: Path) -> Path:
    """Five batch sizes at one LR: B_crit is fitted, with its bootstrap interval."""
    return build_grid_experiment(root, lrs=(3e-3,), batches=(4, 8, 16, 32, 64), steps=tuple(range(5, 405, 5)))


def _multipliers(root: Path) -> Path:
    return _write_ladder(root, {"fast": 1.3, "same": 1.0, "huge": 5.0}, rungs=(32, 64, 128))


LADDER = Options(scale=["model.d_model"], baseline="baseline", bootstrap=200, multiplier_target=1e14)


def _tokenizers(root: Path) -> Path:
    _tokenizer_runs(root, {"A": "text-1", "B": "text-1"})
    return root


def _clear(root: Path) -> Path:
    _clear_effect_study(root, np.random.default_rng(1))
    return root


# name -> (build the run folders under a path, the options)
STUDIES = {
    "toy": (build_toy_experiment, Options()),
    "toy_finished": (lambda root: build_toy_experiment(root, unfinished=False), FAST),
    "grid": (build_grid_experiment, Options()),
    "grid_sizes": (lambda root: build_grid_experiment(root, batches=(16,), sizes=(16, 32, 64, 128)), Options()),
    "grid_batches": (_batches, Options()),
    "sequential": (_sequential, FAST),
    "clear_effect": (_clear, FAST),
    "ladder": (_ladder, SCALED),
    "grouped": (_grouped, Options(bootstrap=100, scale=["model.d_model"], subject_snr_floor=1.0)),
    "mc": (lambda root: _mc_experiment(root, BPB_CLEAN), FAST),
    "tokenizers": (_tokenizers, FAST),
    "multipliers": (_multipliers, LADDER),
    "compute_points": (_multipliers, Options(scale=["model.d_model"], bootstrap=0)),  # no --baseline: the note
}


def _write(folder: Path, report) -> None:
    """As write_report does: report.json, then the pages from what it holds. report: the Report record (or, in a
    tree from before the sections built records, the report's dict)."""
    render = _module("text.render")
    if dataclasses.is_dataclass(report):
        report = dataclasses.replace(report, seconds=0.0)
        text = render.to_json(report.to_json())
        written = type(report).from_json(json.loads(text))
    else:
        report = report | {"seconds": 0.0}
        try:  # where the tree has the schema
            from ablate.report.schema import Report
        except ModuleNotFoundError:
            Report = None
        text = render.to_json(Report.from_json(report).to_json() if Report else report)
        written = json.loads(text)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(text)
    (folder / "report.md").write_text(render.to_markdown(written))
    (folder / "report.html").write_text(render.to_html(written))


def main(out: Path) -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    for name, (build, opts) in STUDIES.items():
        build(WORK / name)
        _write(out / name, build_report(WORK / name, opts))
        print(name, flush=True)
    from ablate.report.analyze import analyze_runs

    calibrate = _module("inference.calibrate")

    for name, design in (
        ("calibration_planted", calibrate.Design(effect=3.0)),
        ("calibration_null", calibrate.Design(scales=1, variants=4, seeds=2)),
    ):
        runs, tasks, opts = calibrate.study(np.random.default_rng(7), design)
        _write(out / name, analyze_runs(runs, tasks, opts, name))
        print(name, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
