"""report["overview"]["runs"] -> the runs table's tokenizer columns (each run's inputs/tokenizers.overview_fields)."""

from __future__ import annotations

from ablate.report.text.fmt import fmt


def runs_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The tokenizer columns of the runs table (header, a row of cells per run); none when no run has figures."""
    if not any(r.get("final_val_bpb") is not None or r.get("fertility") is not None for r in rows):
        return [], [[] for _ in rows]
    header = ["tokenizer", "val bpb", "fertility", "bytes/token"]
    cells = [
        [r.get("tokenizer") or ""] + [fmt(r.get(k)) for k in ("final_val_bpb", "fertility", "bytes_per_token")]
        for r in rows
    ]
    return header, cells
