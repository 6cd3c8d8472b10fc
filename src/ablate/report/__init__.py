"""`ablate report`: many small runs -> which variant wins, how sure, and which tasks to trust.

The report's rooms, by job (each folder's __init__ maps its files):

schema/     what report.json holds, one frozen record a part, each field described (docs/reports.md's table is
            generated from them); the pipeline builds every report as one
stats/      pure statistics that know nothing of runs: seed-level tests and their noise model, seeds needed,
            decision accuracy's bootstrap, the adaptive designs' boundaries and confidence sequences
inputs/     what is read: run folders -> runs and tasks, like with like (equal tokens, identical item sets),
            the runs' tokenizers compared
text/       what the text shares (fmt.py, plots.py), and render.py: report.json -> report.md and report.html,
            the sections in reading order
sections/   one folder per section, its computation and its rendering: decisions/ (how sure: a pair over seeds,
            the two families (Benjamini-Hochberg), the winner, the headline and the report's opening), signal/
            (which signal to trust: SNR and decision accuracy across scales, tracking, each task's best metric),
            sequential/ (an adaptive study's rule, decisions and words; the only part launch/study.py imports),
            multipliers/ (compute multipliers), sweep/ (grid() runs on their axes: optimum LR, batch size, model
            size, their fits), tokenizers/ (runs of different tokenizers)
analyze.py  the orchestrator: every figure, as one record (schema.Report, report.json); build_report
options.py  the report's options declared once (Options): defaults, help, what each `ablate report` flag accepts
calibrate.py  constructed A/A and planted-effect studies through the whole report (scripts/calibrate_report.py)

The rooms import one way (tests/test_structure.py): schema, stats < inputs < options < text (its shared parts) <
sections < text/render.py < analyze < calibrate; schema and stats import nothing else of the report, inputs only
stats. A section reads no other section (what one needs of another reaches it as a value), but for the crossings
tests/test_structure.py names.

The package loads its modules on first use: an experiment file's `from ablate import DecisionRule` reads
sections/sequential/rule.py (and the statistics it checks a rule with), not the analysis (numpy, scipy, matplotlib).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ablate.report.options import Options

__all__ = ["Options", "ReportError", "build_report", "write_report"]


def __getattr__(name: str):
    if name == "Options":
        from ablate.report.options import Options

        return Options
    if name == "build_report":
        from ablate.report.analyze import build_report

        return build_report
    if name == "ReportError":
        from ablate.report.inputs.runs import ReportError

        return ReportError
    raise AttributeError(f"module 'ablate.report' has no attribute {name!r}")


def write_report(runs_dir: str | Path, out_dir: str | Path | None = None, opts: Options | None = None) -> dict:
    """Write report.json, report.md and report.html into out_dir (default: runs_dir); return the report as read
    back from report.json, which is what the markdown and HTML are rendered from."""
    from ablate.report.analyze import build_report
    from ablate.report.schema import Report
    from ablate.report.text.render import to_html, to_json, to_markdown

    text = to_json(build_report(runs_dir, opts).to_json())
    out = Path(out_dir or runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(text)
    report = json.loads(text)
    written = Report.from_json(report)  # what report.json holds (non-finite figures null): what the pages show
    (out / "report.md").write_text(to_markdown(written))
    (out / "report.html").write_text(to_html(written))
    return report
