"""A step's figures (its loss over ranks and its gradient norm) on their way from the device to the callbacks.

A step leaves them on the device (`stage`); they are read to the host in one read for every step not yet read
(`read`), at the steps where something needs them, and handed on in step order once their steps are over
(`finished`). On a GPU an ordinary step then never waits for the device: the host runs ahead, queueing the next.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ablate.training.callbacks import StepValues


@dataclass
class PendingStep:
    """A step whose figures have not yet reached the callbacks."""

    step: int
    tokens: int
    figures: torch.Tensor  # [loss, grad norm(, Ctrl-C flags summed over ranks)], float64, on the device
    nonfinite: torch.Tensor  # 1.0 where the loss or the gradient is not finite (fp32, on the device: found_inf)
    values: StepValues | None = None  # once read
    stop: bool = False  # a rank asked to stop (Ctrl-C), once read
    take: bool = False  # its update goes to the optimizer (which skips it on the device if non-finite), else skipped
    over: bool = False  # the step is over: trainer.step counts it


def figure_tensors(
    loss: torch.Tensor, grad_norm: torch.Tensor, stop: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's figures as one float64 tensor [loss, grad norm(, Ctrl-C flags)], and its non-finite flag (1.0 where
    the loss or the gradient is not finite: the fused optimizer's found_inf), both on the device."""
    figures = torch.stack([loss, grad_norm.double(), *([] if stop is None else [stop])])
    return figures, (~torch.isfinite(figures[:2]).all()).float()  # one isfinite of both: 5 ops fewer than two


class StepFigures:
    """The steps whose figures are on their way, oldest first, and the newest figures read (`last`)."""

    def __init__(self):
        self.pending: list[PendingStep] = []
        self.last = StepValues(0, 0, math.nan, math.nan)

    def stage(
        self, step: int, tokens: int, loss: torch.Tensor, grad_norm: torch.Tensor, stop: torch.Tensor | None
    ) -> PendingStep:
        """Step `step`'s figures, left on the device: its loss over ranks (float64), its grad norm, and, above world
        size 1, the Ctrl-C flags summed over ranks."""
        return self.add(PendingStep(step, tokens, *figure_tensors(loss, grad_norm, stop)))

    def add(self, pending: PendingStep) -> PendingStep:
        """A step whose figures are made (a graphed step's, training.graphs), on its way; returned."""
        self.pending.append(pending)
        return pending

    def read(self) -> None:
        """The figures of every step not yet read, to the host in one read (where a step waits for the device)."""
        unread = [p for p in self.pending if p.values is None]
        if not unread:
            return
        rows = torch.stack([p.figures for p in unread]).tolist()
        for pending, row in zip(unread, rows):
            pending.values = StepValues(pending.step, pending.tokens, row[0], row[1])
            pending.stop = len(row) > 2 and row[2] > 0
        self.last = unread[-1].values

    def finished(self) -> Iterator[PendingStep]:
        """The steps that are over, oldest first, each taken off the list as it is handed out (read first)."""
        self.read()
        while self.pending and self.pending[0].over:
            yield self.pending.pop(0)

    def drop_newest(self) -> None:
        """Forget the newest step: it never happened (a Ctrl-C or a rollback before its update)."""
        self.pending.pop()

    def restored(self, step: int, tokens: int, loss: float) -> None:
        """After a checkpoint's restore: nothing pending, the last loss the checkpoint holds."""
        self.pending = []
        self.last = StepValues(step, tokens, loss, math.nan)
