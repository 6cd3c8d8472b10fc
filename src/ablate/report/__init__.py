"""`ablate report`: many small runs -> which variant wins, how sure, and which tasks to trust.

runs.py     run folders -> runs, tasks, scale groups
stats.py    bootstrap CIs, seed-level tests (seeds + item-set noise), Benjamini-Hochberg, seeds needed, Spearman,
            Kendall, SNR, decision accuracy (numpy/scipy)
match.py    like with like: finals at equal tokens, scores over identical item sets
subjects.py groups (MMLU subjects) below an SNR floor, left out of their task's average
analyze.py  every figure, as one JSON-ready dict (report.json)
across.py   every task x metric's SNR and decision accuracy from each smaller scale against the task's target at
            the largest (its primary metric), against validation loss, and against itself
da.py       decision accuracy's bootstrap (variants sharing a seed resampled together, the items shared by every
            seed resampled once per replicate) and its coverage
tracking.py whether a continuous metric tracks its task (target DA, or correlation with its accuracy)
choose.py   each task's best measured metric (every metric a candidate, judged by signal and noise)
decide.py   the two families (primary metric, task metrics), one sentence per decision metric, the winner
calibrate.py constructed A/A and planted-effect studies through the whole report (scripts/calibrate_report.py)
grid/       grid() runs on their axes: optimum LR, batch size, model size (report["sweep"], its sections)
fmt.py      what the text shares: the Section, numbers as shown, markdown escaping
render.py   report.json -> report.md and report.html (plots.py draws the embedded PNGs)
sequential.py  adaptive studies (ablate run --until-decided): the decision rule, anytime-valid confidence sequences
            per contrast, the report's `sequential` section (render_sequential.py its table)

The package loads its modules on first use: an experiment file's `from ablate import DecisionRule` reads
sequential.py alone, not the analysis (numpy, scipy, matplotlib).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ablate.report.analyze import Options

__all__ = ["Options", "ReportError", "build_report", "write_report"]


def __getattr__(name: str):
    if name in ("Options", "build_report"):
        from ablate.report import analyze

        return getattr(analyze, name)
    if name == "ReportError":
        from ablate.report.runs import ReportError

        return ReportError
    raise AttributeError(f"module 'ablate.report' has no attribute {name!r}")


def write_report(runs_dir: str | Path, out_dir: str | Path | None = None, opts: Options | None = None) -> dict:
    """Write report.json, report.md and report.html into out_dir (default: runs_dir); return the report as read
    back from report.json, which is what the markdown and HTML are rendered from."""
    from ablate.report.analyze import build_report
    from ablate.report.render import to_html, to_json, to_markdown

    text = to_json(build_report(runs_dir, opts))
    out = Path(out_dir or runs_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(text)
    report = json.loads(text)
    (out / "report.md").write_text(to_markdown(report))
    (out / "report.html").write_text(to_html(report))
    return report
