"""The NonFiniteGuard callback: a NaN/inf loss or gradient never reaches the weights, and a run that keeps making
them ends as diverged."""

from __future__ import annotations

import math

from ablate.training.callbacks.base import TAKE, Callback, Divergence, TrainerView, Verdict


class NonFiniteGuard(Callback):
    """Skips the update of a step whose loss or gradient is NaN/inf; stops a run that has `patience` of them in a
    row (Divergence: the run ends as diverged)."""

    name, order = "non_finite_guard", 0

    def __init__(self, patience: int = 5):
        self.patience, self.in_a_row = patience, 0

    def before_update(self, trainer: TrainerView) -> Verdict:
        finite = math.isfinite(trainer.last_loss) and math.isfinite(trainer.last_grad_norm)
        self.in_a_row = 0 if finite else self.in_a_row + 1
        return TAKE if finite else Verdict("skip", "non-finite loss or gradient")

    def post_step(self, trainer: TrainerView) -> None:
        if self.in_a_row >= self.patience:  # raised after the step, so the skipped step counts in status.json
            raise Divergence(
                f"{trainer.run_name}: {self.in_a_row} steps in a row had a non-finite loss or "
                f"gradient (last at step {trainer.step}); lower optim.lr, set model.z_loss or "
                f"model.qk_norm, or check the data"
            )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = state.get("in_a_row", 0)
