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
first eager steps at that size in this process (the compile and its recompile for a new shape, the optimizer's
state, cuBLAS's workspaces: nothing may be set up inside a capture), and dropped whenever a checkpoint is restored
(a restore may give the optimizer new tensors).

A stack (training.stack.StackedTrainer, whose members all have graphs on) is captured the same way, by StackGraphs:
A is every pass's stacked forward and backward, the members' slices of the gradients, and each stepping member's
clipping, figures and found_inf; on the host each member's verdict, as the eager stack asks it; B is the update of
the members that take theirs, captured for each set of them (one, almost always). A's graph is per batch size and
set of stepping members (a member masked as diverged changes it); any member's rollback drops them all.

On a CPU the same static steps run without capture (`capture=False`): what tests/test_cuda_graphs.py checks there
is that the graphed step's structure (its buffers, tensor learning rates, found_inf, figures) trains bit for bit as
the ordinary step does, a lone run's and a stack's; the capture itself only a GPU can show.
"""

from __future__ import annotations

import contextlib

import torch

from ablate.training.figures import PendingStep, figure_tensors

# eager steps a process takes before its first capture: the first compiles the model, creates the optimizer's
# state and cuBLAS's handles; the next ones run what was made (torch's own examples warm up with three)
EAGER_STEPS_BEFORE_CAPTURE = 3


class _Graphs:
    """What a lone run's graphs and a stack's share: the eager warm-up before a capture, counted per batch size."""

    def __init__(self, capture: bool):
        self.capture = capture
        self.steps: dict = {}
        self.eager_steps: dict[int, int] = {}  # batch size -> ordinary steps at it in this process since forget()
        self.captures = 0  # A graphs captured in all (a test reads it)

    def ready(self, batch: int) -> bool:
        """Whether a step of `batch` sequences now runs from graphs (after the warm-up's eager steps at that size)."""
        return self.eager_steps.get(batch, 0) >= EAGER_STEPS_BEFORE_CAPTURE

    def saw_eager_step(self, batch: int) -> None:
        self.eager_steps[batch] = self.eager_steps.get(batch, 0) + 1

    def forget(self) -> None:
        """Every graph dropped: a checkpoint was restored, and the optimizer's state may be new tensors."""
        self.steps, self.eager_steps = {}, {}


class StepGraphs(_Graphs):
    """The captured steps of one Trainer, by batch size. `capture=False`: the static step without CUDA graphs
    (CPU tests of its structure)."""

    def __init__(self, trainer, capture: bool = True):
        super().__init__(capture)
        self.trainer = trainer

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
        self.lrs = lr_tensors(t.optimizer, device)
        self.figures = self.nonfinite = None
        if not capture:
            return
        self.pool = torch.cuda.graph_pool_handle()
        t.optimizer.zero_grad(set_to_none=True)  # A's first backward writes the gradients B reads: in A's pool
        self.graph_gradients = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph_gradients, pool=self.pool):
            self.figures, self.nonfinite = self._gradients()
        self.graph_update = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph_update, pool=self.pool), tensor_lrs(t.optimizer, self.lrs, capture):
            t.optimizer.step()

    def load(self, host_passes) -> None:
        """The step's batch copied into A's input buffers (pinned on a GPU: the copies do not wait)."""
        for (parts, _), (buffers, _) in zip(host_passes, self.passes, strict=True):
            for part, buffer in zip(parts, buffers):
                copy_in(part, buffer)

    def replay_gradients(self) -> None:
        if self.capture:
            self.graph_gradients.replay()
        else:
            self.figures, self.nonfinite = self._gradients()

    def replay_update(self) -> None:
        t = self.trainer
        fill_lrs(t.optimizer, self.lrs)
        if self.capture:
            self.graph_update.replay()
        else:
            with tensor_lrs(t.optimizer, self.lrs, self.capture):
                t.optimizer.step()

    def _gradients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A: what Trainer.forward_backward and the start of decide_update do, from the buffers."""
        t = self.trainer
        loss_sum = t.accumulate(iter(self.passes))
        grad_norm = t.clip_gradients()
        figures, nonfinite = figure_tensors(loss_sum.double(), grad_norm)  # Trainer.stage_figures at world size 1
        t.optimizer.found_inf = nonfinite  # what Trainer.judge sets where the update is taken; B reads it here
        return figures, nonfinite


class StackGraphs(_Graphs):
    """The captured steps of a StackedTrainer, by batch size and the members stepping (`steps`). `capture=False`:
    the static stacked step without CUDA graphs (CPU tests of its structure)."""

    def __init__(self, stacked, capture: bool = True):
        if stacked.stack.has_routers:
            raise NotImplementedError(
                "StackGraphs: a stack whose model has routers (model.ffn='moe') hands each member its routing "
                "statistics on the host during the pass, which a capture cannot replay"
            )
        super().__init__(capture)
        self.stacked = stacked

    def decide(self, active: list[int], batch: int, lrs: dict[int, float]) -> dict:
        """The stacked step of the `active` members from its graphs (A captured first for a new batch size or set of
        members): A replayed, each member's verdict (StackedTrainer.decide), B for the members taking their update.
        Returns the members' PendingSteps, as StackedTrainer.decide does."""
        s = self.stacked
        members = s.members
        host = {k: list(members[k].host_passes(batch)) for k in active}
        rows = [host.get(k, host[active[0]]) for k in range(len(members))]  # the others: any batch, as eagerly
        key = (batch, tuple(active))
        if key not in self.steps:
            later = set(members[active[0]].batch_plan[members[active[0]].step :])
            # as a lone run's: sizes behind dropped; and a member masked since, the graphs of the old set
            self.steps = {
                held: graphed for held, graphed in self.steps.items() if held[0] in later and held[1] == key[1]
            }
            self.steps[key] = _CapturedStackStep(s, active, rows, self.capture)
            self.captures += 1
        graphed = self.steps[key]
        graphed.load(rows)
        graphed.replay_gradients()

        def judge(k):
            t = members[k]
            staged = PendingStep(
                t.step + 1, t.tokens + batch * t.seq_len, graphed.figures[k].clone(), graphed.nonfinite[k]
            )
            return t.judge(t.figures.add(staged), batch, lrs[k])

        decided = s.decide(active, judge)
        graphed.replay_update(tuple(k for k, pending in decided.items() if pending.take))
        return decided


class _CapturedStackStep:
    """A stack's graph A for one batch size and set of stepping members, its graphs B by the members taking their
    update, and the buffers they read and write."""

    def __init__(self, stacked, active: list[int], rows: list[list], capture: bool):
        """`rows`: each member's passes as Trainer.host_passes gives them (the members not stepping: another's), whose
        shapes and dtypes the stacked buffers take."""
        self.stacked, self.active, self.capture = stacked, list(active), capture
        device, size = stacked.members[0].dist.device, len(rows)
        self.passes = [
            ([None if part is None else part.new_empty((size, *part.shape), device=device) for part in parts], share)
            for parts, share in rows[0]
        ]
        self.lrs = {k: lr_tensors(stacked.members[k].optimizer, device) for k in self.active}
        self.updates: dict[tuple[int, ...], torch.cuda.CUDAGraph] = {}  # B, by the members taking their update
        self.figures = self.nonfinite = None
        if not capture:
            return
        self.pool = torch.cuda.graph_pool_handle()
        stacked.stack.zero_grad()  # A's first backward writes the gradients B reads: in A's pool
        self.graph_gradients = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph_gradients, pool=self.pool):
            self.figures, self.nonfinite = self._gradients()
        self.grads = {name: param.grad for name, param in stacked.stack.params.items()}

    def load(self, rows: list[list]) -> None:
        """The members' batches copied into A's stacked buffers, one copy per buffer."""
        for i, (buffers, _) in enumerate(self.passes):
            for j, buffer in enumerate(buffers):
                if buffer is not None:
                    copy_in(torch.stack([row[i][0][j] for row in rows]), buffer)

    def replay_gradients(self) -> None:
        if not self.capture:
            self.figures, self.nonfinite = self._gradients()
            return
        self.graph_gradients.replay()
        # the gradients A wrote, on the parameters again (the last step's zero_grad let them go): a B captured
        # later reads them there
        for name, param in self.stacked.stack.params.items():
            param.grad = self.grads[name]
        self.stacked.stack.member_grads()

    def replay_update(self, taking: tuple[int, ...]) -> None:
        """B for the members in `taking` (none: nothing), captured the first time those members take it."""
        if not taking:
            return
        members = self.stacked.members
        for k in taking:
            fill_lrs(members[k].optimizer, self.lrs[k])
        if not self.capture:
            with self._update_settings(taking):
                self.stacked.update(list(taking))
            return
        if taking not in self.updates:
            self.updates[taking] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.updates[taking], pool=self.pool), self._update_settings(taking):
                self.stacked.update(list(taking))
        self.updates[taking].replay()

    def _gradients(self) -> tuple[dict, dict]:
        """A: what the eager stacked step does before its verdicts, from the buffers: member index -> its figures
        and its non-finite flag (which its optimizer's found_inf is)."""
        stacked = self.stacked
        loss_sum = stacked.backward(self.passes)
        stacked.stack.member_grads()
        figures, nonfinite = {}, {}
        for k in self.active:
            t = stacked.members[k]
            figures[k], nonfinite[k] = figure_tensors(loss_sum[k].double(), t.clip_gradients())
            t.optimizer.found_inf = nonfinite[k]  # what Trainer.judge sets where the update is taken
        return figures, nonfinite

    @contextlib.contextmanager
    def _update_settings(self, taking: tuple[int, ...]):
        """B's settings (tensor_lrs) on every taking member's optimizer."""
        with contextlib.ExitStack() as settings:
            for k in taking:
                settings.enter_context(tensor_lrs(self.stacked.members[k].optimizer, self.lrs[k], self.capture))
            yield


def copy_in(host: torch.Tensor | None, buffer: torch.Tensor | None) -> None:
    """A host tensor copied into a graph's input buffer (pinned on a GPU: the copy does not wait)."""
    if buffer is not None:
        on_gpu = buffer.device.type == "cuda"
        buffer.copy_(host.pin_memory() if on_gpu else host, non_blocking=on_gpu)


def lr_tensors(optimizer, device: torch.device) -> list[torch.Tensor]:
    """The learning rates a captured update reads: one tensor per group, filled before each replay (float64, as a
    Python float)."""
    return [torch.zeros((), dtype=torch.float64, device=device) for _ in optimizer.param_groups]


def fill_lrs(optimizer, lrs: list[torch.Tensor]) -> None:
    for lr, group in zip(lrs, optimizer.param_groups):
        lr.fill_(group["lr"])


@contextlib.contextmanager
def tensor_lrs(optimizer, lrs: list[torch.Tensor], capture: bool):
    """B's settings around an optimizer's step: each group's learning rate as its tensor, and (for a capture)
    capturable, which torch's optimizers ask before a captured step; the groups' own values back after."""
    groups = optimizer.param_groups
    before = [(group["lr"], group.get("capturable", False)) for group in groups]
    for group, lr, (_, capturable) in zip(groups, lrs, before):
        group["lr"], group["capturable"] = lr, capturable or capture
    try:
        yield
    finally:
        for group, (lr, capturable) in zip(groups, before):
            group["lr"], group["capturable"] = lr, capturable
