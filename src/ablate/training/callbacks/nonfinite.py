"""The NonFiniteGuard callback: a run that keeps making NaN/inf losses or gradients ends as diverged.

The update of such a step never reaches the weights: the trainer skips it (on the device, through the fused
optimizer's `found_inf`, without waiting for a host read; or on the host where the optimizer cannot) and counts it
in summary.json's skipped_steps. This callback counts them in a row, from the figures each step hands it."""

from __future__ import annotations

from ablate.training.callbacks.base import Callback, Divergence, StepValues, TrainerView


class NonFiniteGuard(Callback):
    """Stops a run that has `patience` steps in a row with a non-finite loss or gradient (Divergence: the run ends
    as diverged at the last of them, whenever the trainer hands it their figures)."""

    name, order = "non_finite_guard", 0

    def __init__(self, patience: int = 5):
        self.patience, self.in_a_row = patience, 0

    def step_values(self, trainer: TrainerView, values: StepValues) -> None:
        self.in_a_row = 0 if values.finite else self.in_a_row + 1
        if self.in_a_row >= self.patience:
            raise Divergence(
                f"{trainer.run_name}: {self.in_a_row} steps in a row had a non-finite loss or "
                f"gradient (last at step {values.step}); lower optim.lr, set model.z_loss or "
                f"model.qk_norm, or check the data",
                step=values.step,
            )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = state.get("in_a_row", 0)
