"""The contract every callback around the one training loop (ablate.training.trainer) follows, standard or your
own: the hooks of `Callback`, the `Verdict` on an update, what a callback may read (`TrainerView`), and `due`, the
step cadence the periodic ones share. The standard callbacks are beside this file, one concern each: metrics.py
(TrainMetrics, and the metrics channel), validation.py, checkpointing.py, nonfinite.py, experts.py, stability.py,
evals.py.

A callback is a subclass of `Callback` that overrides the hooks it needs. The trainer calls them, in `order` (lower
first; the standard ones run from 0 to 100, yours default to 50):

- `pre_train(trainer)`: training (re)starts at trainer.step: first start, resume, and again after a rollback.
- `before_update(trainer) -> Verdict`: after backward, before the optimizer step (trainer.last_loss and
  last_grad_norm are this step's). Every callback is asked, none skipped because another objected; the trainer
  then acts once on the strongest verdict: stop, then rollback, then skip, then take (None counts as take).
  Reading trainer.last_loss or last_grad_norm here makes the step wait for the device (on a GPU, the queue
  drains): do it only where the verdict needs this step's figures (a spike policy that skips or rolls back).
- `step_values(trainer, values)`: each step's figures as the host reads them (`StepValues`: loss, grad norm),
  in step order, after the step: at once when the run reads every step, else in batches at the steps where a
  callback `acts_at` (and at the end), so that ordinary steps never wait for the device. What only needs to be
  known, not to decide the update (a logged spike, the count of non-finite steps), belongs here.
- `acts_at(trainer) -> bool`: whether post_step will act at trainer.step (log, validate, checkpoint): the
  trainer then hands every pending step to step_values first, so what a callback writes at a step follows every
  step before it (a run that diverged stops before anything is written for a step after its divergence).
- `post_step(trainer)`: after each step; trainer.step counts it (skipped updates too).
- `post_train(trainer)`: after the last step (also when a run resumed from its final checkpoint takes no step).
- `close()`: always, on success or failure.

A callback reads the trainer through `TrainerView` (the attributes and methods listed there) and never writes its
attributes; its settings come through its constructor. It owns its state: `state_dict()` is saved in every
checkpoint under the callback's `name` (unique within a run) and handed back to `load_state_dict` on resume, so a
resumed run continues it. What it adds to summary.json it returns from `summary(trainer)`.

Reporting: metrics go through `trainer.log` (metrics.jsonl and TensorBoard, rank 0) and console lines through
`trainer.say`. Callbacks whose results are files write those files themselves, on rank 0, with ablate.rundir's
helpers: Validation writes eval_items/step_N/val_loss.jsonl, the eval suite (ablate.training.callbacks.evals)
evals.jsonl and eval_items/step_N/<task>_<format>.jsonl, the Checkpointer checkpoints/.

Your own callbacks join the standard ones (all run by `order`): `ablate.train(run, callbacks=[...])`, or a
module-level `callbacks = [...]` in an experiment file (every run of the file). Each run gets a deep copy of what
you passed, so keep in `__init__` only settings and state that copy (open files and the like belong in
pre_train). Every rank calls every hook: a hook that runs collectives (a forward pass of the sharded model,
all_reduce) must run them on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ablate.data.token_files import PreparedData
    from ablate.model import Transformer
    from ablate.training.parallel import Dist

ACTIONS = ("take", "skip", "rollback", "stop")  # the verdicts, weakest first


class Divergence(Exception):
    """The run diverged: a final state (status.json "diverged", never retried), not a failure with a traceback.
    Raised by the non-finite guard, by a "stop" verdict, and by a rollback with no checkpoint to return to; any
    other exception, a FloatingPointError among them, is a failure. `step`: the step it diverged at, where it is
    learnt of later (the guard reads steps in batches); None: the trainer's current step."""

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step


class CallbackStateError(Exception):
    """A callback could not take back the state a checkpoint saved for it: a bug in the callback (or a state of
    another version of it), never a damaged checkpoint, so no checkpoint is set aside for it."""

    def __init__(self, callback: str, ckpt: Path, exc: BaseException):
        super().__init__(
            f"callback {callback!r} failed to load its state from {ckpt}: {type(exc).__name__}: {exc} "
            f"(load_state_dict gets {{}} when the checkpoint holds no state for it; the checkpoint is kept)"
        )


@dataclass(frozen=True)
class Verdict:
    """A callback's word on this step's update (from before_update): "take" it; "skip" it (the weights stay, the
    batch is spent; counted in summary.json's skipped_steps); "rollback" (restore the newest checkpoint, then go on
    with the data after the batches read since); "stop" (the run ends as diverged, `reason` in status.json)."""

    action: str = "take"
    reason: str = ""

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"Verdict action {self.action!r}; allowed: {', '.join(ACTIONS)}")

    @property
    def strength(self) -> int:
        return ACTIONS.index(self.action)


TAKE = Verdict()


@dataclass(frozen=True)
class StepValues:
    """One step's figures on the host (Callback.step_values)."""

    step: int  # the step they are of, counted as trainer.step counts it (from 1)
    tokens: int  # training tokens seen by the end of it
    loss: float  # its training loss, averaged over ranks
    grad_norm: float  # its gradient norm before clipping

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


class TrainerView(Protocol):
    """What a callback may read of the trainer (read only), and the methods it may call."""

    step: int  # steps taken so far (a skipped update counts as a step)
    tokens: int  # training tokens seen so far
    max_steps: int
    seq_len: int
    last_loss: float  # this step's training loss, averaged over ranks (reading it waits for the device)
    last_grad_norm: float  # (so does this)
    last_lr: float
    last_batch: int  # this step's global batch (sequences)
    last_step_tokens: int
    last_step_seconds: float  # the step itself, without validation, evals or checkpoints
    rollbacks: list[dict]  # {from_step, to_step, reason} of each rollback so far
    flops_per_token: float  # the model's, at seq_len (for MFU)
    peak_flops: float  # one device's, at the precision the run computes in
    peak_flops_source: str  # "datasheet", "train.peak_flops" or "measured" (rough: MFU not printed)
    run_name: str
    run_dir: Path
    model: Transformer  # sharded (FSDP2): a forward pass needs every rank
    optimizer: torch.optim.Optimizer
    dist: Dist  # rank, world, device, is_main
    data: PreparedData  # .train, .val (TokenData), .eos_id, .tokenizer_path, .vocab_size

    def log(self, fields: dict, *, tensorboard_only: bool = False, at: StepValues | None = None) -> None:
        """A metrics.jsonl line {step, tokens, **fields} and TensorBoard scalars (rank 0); `at`: the line of that
        earlier step (from step_values) instead of this one's."""

    def say(self, text: str) -> None:
        """A console line prefixed with the run's name (rank 0)."""

    def data_counts(self) -> dict:
        """Tokens drawn per data source so far, {"data/tokens/<source>": n} ({} for one source)."""

    def resume_state(self) -> dict:
        """What a checkpoint stores beside model, optimizer and RNG (the callbacks' states among it)."""


class Callback:
    name = "callback"  # the key of its state in checkpoints: give each of your callbacks its own
    order = 50  # callbacks run in increasing order

    def pre_train(self, trainer: TrainerView) -> None:
        """Training (re)starts at trainer.step: after a resume, and after a rollback."""

    def before_update(self, trainer: TrainerView) -> Verdict | None:
        """After backward, before the optimizer step: the verdict on this step's update."""
        return TAKE

    def step_values(self, trainer: TrainerView, values: StepValues) -> None:
        """Each step's figures, in step order, after the step (see the module's docstring)."""

    def acts_at(self, trainer: TrainerView) -> bool:
        """Whether post_step acts at trainer.step: every pending step reaches step_values first."""
        return False

    def post_step(self, trainer: TrainerView) -> None:
        """After each step; trainer.step counts it."""

    def post_train(self, trainer: TrainerView) -> None:
        """After the last step (also when a run is resumed from its final checkpoint and takes no step)."""

    def close(self) -> None:
        """Always called, on success or failure."""

    def state_dict(self) -> dict:
        """JSON-able state, saved in every checkpoint under `name`."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """The state a checkpoint saved ({} when it holds none for this callback)."""

    def summary(self, trainer: TrainerView) -> dict:
        """Figures for summary.json (keys of its own, or the places kept for final_val_loss, tokens_per_second and
        mfu)."""
        return {}


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A parameter (or gradient) whole at any world size: above world size 1 an FSDP2 parameter is this rank's
    shard (a DTensor) and is gathered from every rank (a collective: call it on every rank); at world size 1 it is
    already whole."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def due(step: int, every: int, last: int) -> bool:
    """Whether a periodic callback acts at `step`: every `every` steps (0: only the last) and at the `last`."""
    return step == last or (every > 0 and step % every == 0)
