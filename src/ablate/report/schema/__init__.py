"""report.json's schema: a frozen record (dataclass) per part, `Report` at the top. `Report.from_json(report)` reads
a report dict (raising SchemaError on a key the schema lacks) and `.to_json()` writes it back, keys in today's
order; the pipeline builds every report as a `Report` and the pages read it back with from_json, so the schema is
what report.json holds. docs/reports.md's
table of every figure is generated from the records (table.py).

record.py      the machinery: Record, figure(doc), ABSENT (a key only some reports hold), SchemaError
runs.py        what was read: overview, tasks, tokenizers
series.py      per scale group, per task x metric: finals, pairwise tests, curves
quality.py     a series' signal criteria
signal.py      across scales, the subject floor, the recommendation
decisions.py   the error control (inference) and the headline
sweep.py       grid() runs on their axes
multipliers.py compute multipliers on a ladder
sequential.py  an adaptive study
report.py      Report
table.py       the docs' table
"""

from ablate.report.schema.decisions import Decision, Family, Headline, Inference, OpenPair
from ablate.report.schema.multipliers import Multipliers, MultiplierRow
from ablate.report.schema.quality import Chance, Criteria, Quality, Ranking
from ablate.report.schema.record import ABSENT, Record, SchemaError
from ablate.report.schema.report import Report
from ablate.report.schema.runs import Change, Changes, Overview, RunRow, TaskRow, Tokenizers
from ablate.report.schema.sequential import Contrast, Rule, Sequential
from ablate.report.schema.series import (
    ComparedAt,
    Curve,
    Failure,
    Final,
    Group,
    ItemMismatch,
    LoggedCurve,
    Pairwise,
    Series,
    SeriesRun,
)
from ablate.report.schema.signal import AcrossScales, Choice, Recommendation, ScalePairs, ScaleRow, SubjectFloor
from ablate.report.schema.sweep import Sweep

__all__ = [
    "ABSENT",
    "AcrossScales",
    "Chance",
    "Change",
    "Changes",
    "Choice",
    "ComparedAt",
    "Contrast",
    "Criteria",
    "Curve",
    "Decision",
    "Failure",
    "Family",
    "Final",
    "Group",
    "Headline",
    "Inference",
    "ItemMismatch",
    "LoggedCurve",
    "MultiplierRow",
    "Multipliers",
    "OpenPair",
    "Overview",
    "Pairwise",
    "Quality",
    "Ranking",
    "Recommendation",
    "Record",
    "Report",
    "Rule",
    "RunRow",
    "ScalePairs",
    "ScaleRow",
    "SchemaError",
    "Sequential",
    "Series",
    "SeriesRun",
    "SubjectFloor",
    "Sweep",
    "TaskRow",
    "Tokenizers",
]
