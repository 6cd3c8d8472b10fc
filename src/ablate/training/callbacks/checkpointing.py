"""The Checkpointer callback: when a run saves its DCP checkpoints (how they are written and kept is
ablate.training.checkpoint's)."""

from __future__ import annotations

from ablate import rundir
from ablate.training.callbacks.base import Callback, TrainerView, due
from ablate.training.checkpoint import save_checkpoint


class Checkpointer(Callback):
    """DCP checkpoint every `every` steps, at `keep_steps` (the steps branches start from, never rotated away) and
    at the end; the newest `keep` others are kept. Last in order, so every other callback's state at this step is
    in it."""

    name, order = "checkpointer", 100

    def __init__(self, every: int, keep: int, keep_steps: list[int]):
        self.every, self.keep, self.keep_steps = every, keep, keep_steps

    def acts_at(self, trainer: TrainerView) -> bool:
        return due(trainer.step, self.every, trainer.max_steps) or trainer.step in self.keep_steps

    def post_step(self, trainer: TrainerView) -> None:
        if self.acts_at(trainer):
            save_checkpoint(
                rundir.checkpoint_root(trainer.run_dir),
                trainer.step,
                trainer.model,
                trainer.optimizer,
                trainer.resume_state(),
                trainer.dist,
                keep=self.keep,
                keep_steps=self.keep_steps,
            )
