"""report["overview"]["runs"] (RunRow records) -> the runs table's tokenizer columns (each run's
inputs/tokenizers.overview_fields)."""

from __future__ import annotations

from ablate.report.schema import RunRow
from ablate.report.text.fmt import fmt


def runs_table(rows: list[RunRow]) -> tuple[list[str], list[list[str]]]:
    """The tokenizer columns of the runs table (header, a row of cells per run); none when no run has figures."""
    if not any(r.final_val_bpb is not None or r.fertility is not None for r in rows):
        return [], [[] for _ in rows]
    header = ["tokenizer", "val bpb", "fertility", "bytes/token"]
    cells = [[r.tokenizer or "", fmt(r.final_val_bpb), fmt(r.fertility), fmt(r.bytes_per_token)] for r in rows]
    return header, cells
