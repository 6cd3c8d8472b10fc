"""Everything around the training step, one concern per file: the protocol (`Callback`, `Verdict`, `TrainerView`)
in base.py, importable from here; the standard callbacks in metrics.py, validation.py, checkpointing.py,
nonfinite.py, experts.py, stability.py and evals.py, imported from their own modules (writing a callback needs
none of them)."""

from ablate.training.callbacks.base import (
    TAKE,
    Callback,
    CallbackStateError,
    Divergence,
    StepValues,
    TrainerView,
    Verdict,
    whole,
)

__all__ = ["Callback", "Verdict", "StepValues", "TrainerView", "TAKE", "Divergence", "CallbackStateError", "whole"]
