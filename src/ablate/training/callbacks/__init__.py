"""Everything around the training step, one concern per file; the protocol (`Callback`, `Verdict`, `TrainerView`)
is in base.py and importable from here."""

from ablate.training.callbacks.base import TAKE, Callback, TrainerView, Verdict

__all__ = ["Callback", "Verdict", "TrainerView", "TAKE"]
