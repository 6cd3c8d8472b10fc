"""Which seeds of each variant failed or diverged, as their run folders record it: the fixed report's decisions and
the adaptive study's contrasts read failures through this (a variant with such a seed never wins on its
survivors)."""

from __future__ import annotations

from ablate.report.schema import Failure

FAILED_STATES = ("diverged", "failed")  # a variant with a seed in one of these never wins on its survivors


def failed_seeds(runs_by_variant: dict) -> dict[str, Failure]:
    """Variants with a failed or diverged seed, each with its runs and the seeds in each failed state (runs:
    anything with .seed and .status). The fixed report and the adaptive study read failures through this."""
    out = {}
    for variant, runs in runs_by_variant.items():
        by_state = {state: sorted(r.seed for r in runs if r.status == state) for state in FAILED_STATES}
        if any(by_state.values()):
            out[variant] = Failure(seeds=len(runs), by_state=by_state)
    return out


def failure_texts(failed: dict[str, Failure]) -> dict[str, str]:
    """failed_seeds' records -> variant -> 'k of n seeds diverged' (or failed)."""
    out = {}
    for variant, f in failed.items():
        parts = [f"{len(seeds)} of {f.seeds} seeds {state}" for state, seeds in f.by_state.items() if seeds]
        if parts:
            out[variant] = ", ".join(parts)
    return out
