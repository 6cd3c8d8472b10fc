"""report.json as a whole: `Report`, the top record."""

from __future__ import annotations

from ablate.report.schema.decisions import Headline, Inference
from ablate.report.schema.multipliers import Multipliers
from ablate.report.schema.record import Record, figure, record
from ablate.report.schema.runs import Overview, TaskRow, Tokenizers
from ablate.report.schema.sequential import Sequential
from ablate.report.schema.series import Group
from ablate.report.schema.signal import AcrossScales, Recommendation, ScalePairs, SubjectFloor
from ablate.report.schema.sweep import Sweep


@record
class Report(Record):
    """Every figure of the report: the markdown and HTML are rendered from it."""

    schema: int = figure("report.json's schema version")
    experiment: str = figure("the experiment's name (config.json, else the folder's)")
    runs_dir: str = figure("the folder read")
    # report/options.py's Options declares these fields once, with their help and what each flag accepts; a second
    # declaration here would drift from it (tests/test_report_schema.py checks the keys are Options' fields)
    options: dict = figure("the options the report ran with: report/options.py's Options (ablate report --help)")
    overview: Overview = figure("every run folder read")
    tasks: list[TaskRow] = figure("the tasks the runs were scored on")
    groups: list[Group] = figure("per scale group, the largest last")
    across_scales: list[AcrossScales] = figure(
        "every task x metric's SNR and decision accuracy across scales; empty without a smaller scale"
    )
    scale_pairs: ScalePairs | None = figure(
        "decision accuracy for every pair of scales against their compute ratio; null without >= 2 scales",
        optional=True,
    )
    subject_floor: list[SubjectFloor] = figure("groups left out below --subject-snr-floor; empty without it")
    recommendation: Recommendation = figure("each task's metric, its evidence, and why each other metric lost")
    inference: Inference = figure("the study's error control: the two families")
    sweep: Sweep | None = figure("grid() runs on their axes; null without a grid")
    multipliers: Multipliers | None = figure(
        "compute multipliers on a ladder; null without compute points or --baseline"
    )
    sequential: Sequential | None = figure("the adaptive study; null unless the folder holds one (study.json)")
    headline: Headline = figure("the report in words")
    tokenizers: Tokenizers = figure("the runs' tokenizers and what validation is compared by")
    cannot_compute: list[str] = figure("each figure these runs cannot give, and what it needs")
    seconds: float = figure("the time the analysis took")
