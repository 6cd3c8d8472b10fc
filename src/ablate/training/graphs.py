"""CUDA graphs for a step at world size 1 (train.cuda_graphs): a small model's step launches its few hundred kernels
from two replays instead of one host call each.

A step is two graphs, because the callbacks' verdict on the update sits between its halves, on the host:
  A: every pass's forward and backward (micro-batch accumulation included), clipping by the run's norm, and the
     step's figures (loss over the passes, grad norm, the non-finite flag); then, on the host, the figures handed
     to StepFigures and the callbacks asked (Trainer.judge), exactly as an un-graphed step asks them;
  B: the optimizer's update, replayed only where the verdict takes it; a non-finite step's update is skipped on
     the device by the fused optimizer's found_inf, which A writes.
Both replay the kernels the un-graphed step launches, on the same memory: the step's numbers do not change
(checked on a GPU by scripts/gpu_acceptance.py, which compares the losses bit for bit). On the host a step then
copies its batch into A's input buffers, replays A, copies its figures out (they are read later, in batches),
asks the callbacks, fills the learning rate into B's tensors and replays B.

A graph is captured per batch size (a batch ramp gets one per size, the sizes behind it dropped), after the run's
first eager steps in this process (the compile, the optimizer's state, cuBLAS's workspaces: nothing may be set up
inside a capture), and dropped whenever a checkpoint is restored (a restore may give the optimizer new tensors). On
a CPU the same static step runs without capture (`capture=False`): what tests/test_cuda_graphs.py checks there is
that the graphed step's structure (its buffers, tensor learning rates, found_inf, figures) trains bit for bit as
the ordinary step does; the capture itself only a GPU can show.
"""

from __future__ import annotations

import contextlib

import torch

from ablate.training.figures import PendingStep, figure_tensors

# eager steps a process takes before its first capture: the first compiles the model, creates the optimizer's
# state and cuBLAS's handles; the next ones run what was made (torch's own examples warm up with three)
EAGER_STEPS_BEFORE_CAPTURE = 3


class StepGraphs:
    """The captured steps of one Trainer, by batch size. `capture=False`: the static step without CUDA graphs
    (CPU tests of its structure)."""

    def __init__(self, trainer, capture: bool = True):
        self.trainer = trainer
        self.capture = capture
        self.steps: dict[int, _CapturedStep] = {}
        self.eager_steps = 0  # ordinary steps taken in this process since the last forget()
        self.captures = 0  # graphs captured in all (a test reads it)

    def ready(self) -> bool:
        """Whether steps now run from graphs (after the warm-up's eager steps)."""
        return self.eager_steps >= EAGER_STEPS_BEFORE_CAPTURE

    def saw_eager_step(self) -> None:
        self.eager_steps += 1

    def forget(self) -> None:
        """Every graph dropped: a checkpoint was restored, and the optimizer's state may be new tensors."""
        self.steps, self.eager_steps = {}, 0

    def train_step(self, batch: int, lr: float, start: float) -> None:
        """The step from its graphs (captured first for a new batch size): A replayed, the callbacks' verdict, B
        where the update is taken."""
        t = self.trainer
        host = list(t.host_passes(batch))
        if batch not in self.steps:
            # the sizes no later step takes are dropped, and their memory with them (a ramp only grows)
            later = set(t.batch_plan[t.step :])
            self.steps = {size: graphed for size, graphed in self.steps.items() if size in later}
            self.steps[batch] = _CapturedStep(t, host, self.capture)
            self.captures += 1
        graphed = self.steps[batch]
        graphed.load(host)
        graphed.replay_gradients()
        pending = t.figures.add(
            PendingStep(t.step + 1, t.tokens + batch * t.seq_len, graphed.figures.clone(), graphed.nonfinite)
        )
        decided = t.judge(pending, batch, lr)
        if decided is None:
            return  # rolled back: the restore dropped the graphs
        if decided.take:
            graphed.replay_update()
        t.complete_step(decided, batch, start)


class _CapturedStep:
    """Graphs A and B of one batch size, with the buffers they read and write."""

    def __init__(self, trainer, host_passes: list, capture: bool):
        """`host_passes`: a step's passes as Trainer.host_passes gives them, whose shapes and dtypes the buffers
        take (their values are copied in by load)."""
        t = self.trainer = trainer
        self.capture, device = capture, t.dist.device
        self.passes = [
            ([None if part is None else torch.empty_like(part, device=device) for part in parts], share)
            for parts, share in host_passes
        ]
        # the learning rate B reads: one tensor per group, filled before each replay (float64, as a Python float)
        self.lrs = [torch.zeros((), dtype=torch.float64, device=device) for _ in t.optimizer.param_groups]
        self.figures = self.nonfinite = None
        if not capture:
            return
        self.pool = torch.cuda.graph_pool_handle()
        t.optimizer.zero_grad(set_to_none=True)  # A's first backward writes the gradients B reads: in A's pool
        self.graph_gradients = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph_gradients, pool=self.pool):
            self.figures, self.nonfinite = self._gradients()
        self.graph_update = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph_update, pool=self.pool), self._update_settings():
            t.optimizer.step()

    def load(self, host_passes) -> None:
        """The step's batch copied into A's input buffers (pinned on a GPU: the copies do not wait)."""
        on_gpu = self.trainer.dist.device.type == "cuda"
        for (parts, _), (buffers, _) in zip(host_passes, self.passes, strict=True):
            for part, buffer in zip(parts, buffers):
                if buffer is not None:
                    buffer.copy_(part.pin_memory() if on_gpu else part, non_blocking=on_gpu)

    def replay_gradients(self) -> None:
        if self.capture:
            self.graph_gradients.replay()
        else:
            self.figures, self.nonfinite = self._gradients()

    def replay_update(self) -> None:
        t = self.trainer
        for lr, group in zip(self.lrs, t.optimizer.param_groups):
            lr.fill_(group["lr"])
        if self.capture:
            self.graph_update.replay()
        else:
            with self._update_settings():
                t.optimizer.step()

    def _gradients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A: what Trainer.forward_backward and the start of decide_update do, from the buffers."""
        t = self.trainer
        loss_sum = t.accumulate(iter(self.passes))
        grad_norm = t.clip_gradients()
        figures, nonfinite = figure_tensors(loss_sum.double(), grad_norm)  # Trainer.stage_figures at world size 1
        t.optimizer.found_inf = nonfinite  # what Trainer.judge sets where the update is taken; B reads it here
        return figures, nonfinite

    @contextlib.contextmanager
    def _update_settings(self):
        """B's settings around the optimizer's step: each group's learning rate as its tensor, and (for a capture)
        capturable, which torch's optimizers ask before a captured step; the groups' own values back after."""
        groups = self.trainer.optimizer.param_groups
        before = [(group["lr"], group.get("capturable", False)) for group in groups]
        for group, lr, (_, capturable) in zip(groups, self.lrs, before):
            group["lr"], group["capturable"] = lr, capturable or self.capture
        try:
            yield
        finally:
            for group, (lr, capturable) in zip(groups, before):
                group["lr"], group["capturable"] = lr, capturable
