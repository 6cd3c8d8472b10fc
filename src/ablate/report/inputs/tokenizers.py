"""What the runs record of their tokenizers: which tokenizer each run used, its figures (summary.json "tokenizer":
fertility, bytes per token on its validation documents) for the runs table, and whether the runs' validation
compares at all (one definition of validation; bits per byte on the same text). The tokenizers section
(sections/tokenizers/) and the adaptive study's contrasts (sections/sequential/) read these.

A run's tokenizer is the sha256 of its tokenizer.json (summary.json), or, when some finished run has none (older
runs), what its config says: data.tokenizer, and for a BPE trained by ablate its vocabulary and training text.
"""

from __future__ import annotations

import json
import os

from ablate.report.inputs.runs import Run

BPB = "bpb"
TRAINING_TEXT_FIELDS = ("source", "val_source", "val_fraction", "max_documents", "text_field")  # what a BPE learns on


def _figures(run: Run) -> dict:
    figures = (run.summary or {}).get("tokenizer")
    return figures if isinstance(figures, dict) else {}


def tokenizer_label(run: Run) -> str:
    """bpe:8192, or the tokenizer file's name."""
    data, model = run.config.get("data", {}), run.config.get("model", {})
    given = data.get("tokenizer", "bpe")
    return f"bpe:{model.get('vocab_size')}" if given == "bpe" else os.path.basename(str(given))


def _from_config(run: Run) -> str:
    data = run.config.get("data", {})
    if data.get("tokenizer", "bpe") != "bpe":
        return str(data.get("tokenizer"))
    trained_on = {k: data.get(k) for k in TRAINING_TEXT_FIELDS}
    return json.dumps([tokenizer_label(run), trained_on], sort_keys=True, default=str)


def identities(runs: list[Run]) -> dict[str, str]:
    """run label -> its tokenizer's identity, over the finished runs."""
    finished = [r for r in runs if r.status == "finished"]
    exact = all(_figures(r).get("sha256") for r in finished)
    return {r.label: _figures(r)["sha256"] if exact else _from_config(r) for r in finished}


def mixed_validation(runs: list[Run]) -> str | None:
    """Why the finished runs' validation losses do not compare at all (None: one definition): runs from before
    validation scored whole documents fixed by their bytes (summary.json val_scored.documents) scored their first
    validation sequences instead, other text and other per-item ids (sequences, not documents)."""
    finished = [r for r in runs if r.status == "finished" and r.summary is not None]
    old = [r.label for r in finished if "documents" not in (r.summary.get("val_scored") or {})]
    if old and len(old) < len(finished):
        return (
            f"{len(old)} of {len(finished)} runs scored validation sequences (trained before validation scored "
            f"whole documents: other text, other items), the rest validation documents; retrain those "
            f"({', '.join(old[:4])}{', ...' if len(old) > 4 else ''}) to compare validation"
        )
    return None


def different_text(runs: list[Run]) -> str | None:
    """Why the finished runs' bits per byte do not compare (None: they scored the same validation text): bits per
    byte across tokenizers compare only on the same text, since a text offset repeats on every seed and no seed
    count averages it away. Which text a run scored is the sha256 of its scored validation bytes (summary.json
    val_scored.text_sha256); a run without one cannot show it scored the others' text."""
    finished = [r for r in runs if r.status == "finished"]
    hashes = {r.label: ((r.summary or {}).get("val_scored") or {}).get("text_sha256") for r in finished}
    unknown = [label for label, h in hashes.items() if not h]
    if unknown:
        return (
            f"bits per byte compare only on the same text, which {len(unknown)} of {len(hashes)} runs do not record "
            f"(val_scored.text_sha256: trained before ablate recorded it)"
        )
    if len(set(hashes.values())) > 1:
        return (
            f"bits per byte compare only on the same text, and the runs scored {len(set(hashes.values()))} "
            f"different validation texts (other data configs, or runs from before validation scored whole documents: "
            "then each tokenizer's first validation sequences, other text)"
        )
    return None


def overview_fields(run: Run) -> dict:
    """What the runs table shows of a run's tokenizer, beside its losses."""
    summary, figures = run.summary or {}, _figures(run)
    return {
        "tokenizer": tokenizer_label(run),
        "final_val_bpb": summary.get("final_val_bpb"),
        "fertility": figures.get("fertility"),
        "bytes_per_token": figures.get("bytes_per_token"),
        "continued_word_rate": figures.get("continued_word_rate"),
        "vocab_use": figures.get("vocab_use"),
    }
