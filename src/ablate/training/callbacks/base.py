"""Callbacks around the one training loop (ablate.training.trainer): logging, validation, checkpoints, the non-finite guard;
and the contract every callback, standard or your own, follows.

A callback is a subclass of `Callback` that overrides the hooks it needs. The trainer calls them, in `order` (lower
first; the standard ones run from 0 to 100, yours default to 50):

- `pre_train(trainer)`: training (re)starts at trainer.step: first start, resume, and again after a rollback.
- `before_update(trainer) -> Verdict`: after backward, before the optimizer step (trainer.last_loss and
  last_grad_norm are this step's). Every callback is asked, none skipped because another objected; the trainer
  then acts once on the strongest verdict: stop, then rollback, then skip, then take (None counts as take).
- `post_step(trainer)`: after each step; trainer.step counts it (skipped updates too).
- `post_train(trainer)`: after the last step (also when a run resumed from its final checkpoint takes no step).
- `close()`: always, on success or failure.

A callback reads the trainer through `TrainerView` (the attributes and methods listed there) and never writes its
attributes; its settings come through its constructor. It owns its state: `state_dict()` is saved in every
checkpoint under the callback's `name` (unique within a run) and handed back to `load_state_dict` on resume, so a
resumed run continues it. What it adds to summary.json it returns from `summary(trainer)`.

Reporting: metrics go through `trainer.log` (metrics.jsonl and TensorBoard, rank 0) and console lines through
`trainer.say`. Callbacks whose results are files write those files themselves, on rank 0, with ablate.rundir's
helpers: Validation writes eval_items/step_N/val_loss.jsonl, the eval suite (ablate.training.callbacks.evals) evals.jsonl and
eval_items/step_N/<task>_<format>.jsonl, the Checkpointer checkpoints/.

Your own callbacks join the standard ones (all run by `order`): `ablate.training.run(run, callbacks=[...])`, or a
module-level `callbacks = [...]` in an experiment file (every run of the file). Each run gets a deep copy of what
you passed, so keep in `__init__` only settings and state that copy (open files and the like belong in
pre_train). Every rank calls every hook: a hook that runs collectives (a forward pass of the sharded model,
all_reduce) must run them on every rank.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from ablate import rundir

from ablate.data import tokenizer_stats
from ablate.training.checkpoint import save_checkpoint
from ablate.training.parallel import mfu as model_flops_utilization

if TYPE_CHECKING:
    from ablate.data.token_files import PreparedData
    from ablate.model import Transformer
    from ablate.training.parallel import Dist

ACTIONS = ("take", "skip", "rollback", "stop")  # the verdicts, weakest first


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


class TrainerView(Protocol):
    """What a callback may read of the trainer (read only), and the methods it may call."""

    step: int  # steps taken so far (a skipped update counts as a step)
    tokens: int  # training tokens seen so far
    max_steps: int
    seq_len: int
    last_loss: float  # this step's training loss, averaged over ranks
    last_grad_norm: float
    last_lr: float
    last_batch: int  # this step's global batch (sequences)
    last_step_tokens: int
    last_step_seconds: float  # the step itself, without validation, evals or checkpoints
    rollbacks: list[dict]  # {from_step, to_step, reason} of each rollback so far
    flops_per_token: float  # the model's, at seq_len (for MFU)
    peak_flops: float  # one device's, at the precision the run computes in
    run_name: str
    run_dir: Path
    model: Transformer  # sharded (FSDP2): a forward pass needs every rank
    optimizer: torch.optim.Optimizer
    dist: Dist  # rank, world, device, is_main
    data: PreparedData  # .train, .val (TokenData), .val_indices(), .tokenizer_path, .vocab_size

    def log(self, fields: dict, *, tensorboard_only: bool = False) -> None:
        """A metrics.jsonl line {step, tokens, **fields} and TensorBoard scalars (rank 0)."""

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


def due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


PROC_CLEAR_REFS = Path("/proc/self/clear_refs")  # writing "5" resets the process's peak resident set (Linux)
PROC_STATUS = Path("/proc/self/status")  # its VmHWM line: that peak since the last reset


def reset_peak_memory(device: torch.device) -> None:
    """Start the memory peak afresh at a run's start, so runs one after another in one process (a sweep's
    worker) each report their own: CUDA's peak counters, or on CPU the process's peak resident set."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # not Linux, or /proc not writable: the peak stays the process's
        PROC_CLEAR_REFS.write_text("5")


def peak_memory_bytes(device: torch.device) -> int:
    """The peak since reset_peak_memory: on CUDA the bytes of live tensors (max_memory_allocated); on CPU the
    process's resident memory (VmHWM), everything it holds, not only tensors. Where the CPU peak cannot be reset
    or read, the process's peak since it started (ru_maxrss)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # in kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class MetricsChannel:
    """metrics.jsonl + TensorBoard + console on rank 0; other ranks drop what they are given.

    `truncate(step)` forgets what was written after `step` (a resume or rollback continues from there), so the
    logs read as if the run had never stopped."""

    def __init__(self, run_dir: Path, prefix: str, enabled: bool):
        self.run_dir, self.prefix, self.enabled = run_dir, prefix, enabled
        self.path = run_dir / rundir.METRICS
        self.file = self.writer = None

    def open(self, start_step: int) -> None:
        if not self.enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        self.truncate(start_step)
        self.writer = SummaryWriter(
            str(self.run_dir / rundir.TENSORBOARD), purge_step=start_step + 1 if start_step else None
        )

    def truncate(self, step: int) -> None:
        if not self.enabled:
            return
        if self.file is not None:
            self.file.close()
        if self.path.exists():  # a torn last line is dropped too
            rundir.rewrite_jsonl(self.path, [row for row in rundir.read_jsonl(self.path) if row.get("step", 0) <= step])
        self.file = self.path.open("a")

    def log(self, step: int, tokens: int, fields: dict, *, tensorboard_only: bool = False) -> None:
        """One metrics.jsonl line {step, tokens, **fields} (unless tensorboard_only) and a TensorBoard scalar per
        finite number, tagged train/<key> unless the key names its own section ("val/loss")."""
        if not self.enabled:
            return
        if not tensorboard_only:
            self.file.write(json.dumps({"step": step, "tokens": tokens, **fields}) + "\n")
            self.file.flush()
        for key, value in fields.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.writer.add_scalar(key if "/" in key else f"train/{key}", value, step)
        self.writer.flush()

    def print(self, text: str) -> None:
        if self.enabled:
            print(f"{self.prefix} {text}", flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.writer is not None:
            self.writer.close()


class TrainMetrics(Callback):
    """Loss, lr, gradient norm, batch, tokens/s, MFU and memory every `log_every` steps (and the last); the run's
    tokens_per_second and mfu for summary.json."""

    name, order = "train_metrics", 90

    def __init__(self, log_every: int):
        self.log_every = log_every
        self.interval_seconds, self.interval_tokens = 0.0, 0
        self.throughput: list[float] = []  # tokens/s of each logged interval

    @staticmethod
    def mfu(trainer: TrainerView, tokens_per_second: float) -> float | None:
        """The model FLOPs utilisation of a speed over all ranks; None when above 100%: the peak was measured too
        low (a busy machine), and the figure would mislead."""
        return model_flops_utilization(
            tokens_per_second / trainer.dist.world, trainer.flops_per_token, trainer.peak_flops
        )

    def post_step(self, trainer: TrainerView) -> None:
        # time in the step itself: validation, evals and checkpoints stay out of tokens/s
        self.interval_seconds += trainer.last_step_seconds
        self.interval_tokens += trainer.last_step_tokens
        if not due(trainer.step, self.log_every, trainer.max_steps):
            return
        tokens_per_second = self.interval_tokens / max(self.interval_seconds, 1e-9)
        mfu = self.mfu(trainer, tokens_per_second)
        memory = peak_memory_bytes(trainer.dist.device)
        trainer.log(
            {
                "loss": trainer.last_loss,
                "lr": trainer.last_lr,
                "grad_norm": trainer.last_grad_norm,
                "batch": trainer.last_batch,
                "tokens_per_second": tokens_per_second,
                "mfu": mfu,
                "memory_bytes": memory,
                **trainer.data_counts(),
            }
        )
        self.throughput.append(tokens_per_second)
        seconds_per_step = self.interval_seconds / max(self.log_every, 1)
        eta = (trainer.max_steps - trainer.step) * seconds_per_step
        mfu_text = "mfu n/a (peak unreliable)" if mfu is None else f"mfu {100 * mfu:.1f}%"
        trainer.say(
            f"step {trainer.step}/{trainer.max_steps} loss {trainer.last_loss:.4f} lr {trainer.last_lr:.2e} "
            f"gnorm {trainer.last_grad_norm:.3f} {tokens_per_second / 1e3:.2f}k tok/s {mfu_text} "
            f"mem {memory / 2**30:.2f}GiB eta {_format_duration(eta)}"
        )
        self.interval_seconds, self.interval_tokens = 0.0, 0

    def state_dict(self) -> dict:
        return {"throughput": self.throughput}

    def load_state_dict(self, state: dict) -> None:
        self.throughput = list(state.get("throughput", []))

    def summary(self, trainer: TrainerView) -> dict:
        tokens_per_second = sum(self.throughput) / len(self.throughput) if self.throughput else math.nan
        return {"tokens_per_second": tokens_per_second, "mfu": self.mfu(trainer, tokens_per_second)}


class Validation(Callback):
    """Held-out loss of the first `sequences` validation sequences every `every` steps and at the end, forward
    passes of at most `micro_batch` sequences per rank; per-sequence losses kept (eval_items/step_N/val_loss.jsonl)
    as the items of paired comparisons between variants. Also in bits per byte (val/bpb: what runs of different
    tokenizers compare on), and summary.json gets the tokenizer's figures on the validation documents."""

    name, order = "validation", 20

    def __init__(self, every: int, sequences: int, micro_batch: int, doc_mask: bool):
        self.every, self.sequences, self.micro_batch, self.doc_mask = every, sequences, micro_batch, doc_mask
        self.last_val_loss = math.nan
        self.scored = None  # (tokens, UTF-8 bytes) the validation sequences' targets hold: fixed, counted once

    def post_step(self, trainer: TrainerView) -> None:
        if due(trainer.step, self.every, trainer.max_steps):
            self.validate(trainer)

    def validate(self, trainer: TrainerView) -> None:
        losses = self.losses(trainer)
        self.last_val_loss = sum(losses.values()) / len(losses) if losses else math.nan
        trainer.log({"val/loss": self.last_val_loss, "val/bpb": self.bits_per_byte(trainer)})
        if trainer.dist.is_main:
            rundir.write_items(
                trainer.run_dir,
                trainer.step,
                "val_loss",
                [{"id": i, "loss": loss} for i, loss in sorted(losses.items())],
            )
        trainer.say(f"step {trainer.step} val_loss {self.last_val_loss:.4f}")

    @torch.no_grad()
    def losses(self, trainer: TrainerView) -> dict[int, float]:
        """Loss of each held-out sequence ({sequence index: mean token loss}), split over ranks for the forward
        passes and gathered on every rank. Every rank runs the same number of forward passes, as FSDP2 needs."""
        d, size = trainer.dist, self.micro_batch
        indices = [int(i) for i in trainer.data.val_indices(self.sequences, trainer.seq_len)]
        count, mine = len(indices), indices[d.rank :: d.world]
        passes = -(-count // (size * d.world))
        losses = {}
        trainer.model.eval()
        for k in range(passes):
            part = mine[k * size : (k + 1) * size]
            chunk = part or [0]  # a rank with nothing left still runs a forward, on item 0, and keeps nothing
            inputs, targets, doc_ids = [
                x.to(d.device, non_blocking=True) for x in trainer.data.val.batch(chunk, trainer.seq_len)
            ]
            # a chunk of logits at a time: a 50k vocabulary never is whole
            per_token = trainer.model.per_token_loss(inputs, targets, doc_ids if self.doc_mask else None)
            losses.update(zip(part, per_token.mean(dim=1).tolist()))
        trainer.model.train()
        gathered = [None] * d.world
        torch.distributed.all_gather_object(gathered, losses)
        return {i: loss for part in gathered for i, loss in part.items()}

    def state_dict(self) -> dict:
        return {"last_val_loss": self.last_val_loss}

    def load_state_dict(self, state: dict) -> None:
        self.last_val_loss = state.get("last_val_loss", math.nan)

    def bits_per_byte(self, trainer: TrainerView) -> float:
        if self.scored is None:
            self.scored = tokenizer_stats.scored_text(trainer.data, self.sequences, trainer.seq_len)
        return tokenizer_stats.bits_per_byte(self.last_val_loss, *self.scored)

    def summary(self, trainer: TrainerView) -> dict:
        val = trainer.data.val
        return {
            "final_val_loss": self.last_val_loss,
            "final_val_bpb": self.bits_per_byte(trainer),
            "val_scored": dict(zip(("tokens", "bytes"), self.scored)),
            "tokenizer": tokenizer_stats.validation_figures(trainer.data.tokenizer_path, val.tokens, val.doc_starts),
        }


class Checkpointer(Callback):
    """DCP checkpoint every `every` steps, at `keep_steps` (the steps branches start from, never rotated away) and
    at the end; the newest `keep` others are kept. Last in order, so every other callback's state at this step is
    in it."""

    name, order = "checkpointer", 100

    def __init__(self, every: int, keep: int, keep_steps: list[int]):
        self.every, self.keep, self.keep_steps = every, keep, keep_steps

    def post_step(self, trainer: TrainerView) -> None:
        if due(trainer.step, self.every, trainer.max_steps) or trainer.step in self.keep_steps:
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


class NonFiniteGuard(Callback):
    """Skips the update of a step whose loss or gradient is NaN/inf; stops a run that has `patience` of them in a
    row (FloatingPointError: the run ends as diverged)."""

    name, order = "non_finite_guard", 0

    def __init__(self, patience: int = 5):
        self.patience, self.in_a_row = patience, 0

    def before_update(self, trainer: TrainerView) -> Verdict:
        finite = math.isfinite(trainer.last_loss) and math.isfinite(trainer.last_grad_norm)
        self.in_a_row = 0 if finite else self.in_a_row + 1
        return TAKE if finite else Verdict("skip", "non-finite loss or gradient")

    def post_step(self, trainer: TrainerView) -> None:
        if self.in_a_row >= self.patience:  # raised after the step, so the skipped step counts in status.json
            raise FloatingPointError(
                f"{trainer.run_name}: {self.in_a_row} steps in a row had a non-finite loss or "
                f"gradient (last at step {trainer.step}); lower optim.lr, set model.z_loss or "
                f"model.qk_norm, or check the data"
            )

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = state.get("in_a_row", 0)


class ExpertBalance(Callback):
    """After each step of a model with experts (model.ffn="moe"): every MoE layer's routing of the step (tokens per
    expert, balancing and router z-losses, choices dropped over capacity), summed over its micro-batches and every
    rank; with `update_bias` (moe_balance="bias"), each router's bias moved from that load (DeepSeek-V3), once per
    optimizer step and alike on every rank, so any world size routes the same. First in order, so validation and
    the checkpoint see the moved bias. A skipped update still moves the bias (the load was measured); a rollback
    restores it with the weights. Every `log_every` steps: per layer the share of choices each expert took and its
    max over mean (1: balanced), the mean losses, the share of choices dropped."""

    name, order = "expert_balance", 5

    def __init__(self, log_every: int, update_bias: bool):
        self.log_every, self.update_bias = log_every, update_bias

    def pre_train(self, trainer: TrainerView) -> None:
        for router in trainer.model.routers().values():
            router.take_step_stats()  # a rolled-back step's routing is forgotten

    def post_step(self, trainer: TrainerView) -> None:
        routers = trainer.model.routers()
        stats = torch.stack([router.take_step_stats() for router in routers.values()])
        torch.distributed.all_reduce(stats)  # every rank's passes: [load per expert..., aux, z, dropped, passes]
        loads, (aux, z, dropped, passes) = stats[:, :-4], stats[:, -4:].unbind(dim=1)
        if self.update_bias:
            for router, load in zip(routers.values(), loads):
                router.update_bias(load)
        if not due(trainer.step, self.log_every, trainer.max_steps):
            return
        shares = (loads / loads.sum(dim=1, keepdim=True).clamp(min=1)).tolist()
        fields = {
            "moe/aux_loss": (aux / passes.clamp(min=1)).mean().item(),
            "moe/z_loss": (z / passes.clamp(min=1)).mean().item(),
            "moe/dropped": (dropped.sum() / loads.sum().clamp(min=1)).item(),
        }
        for layer, share in zip(routers, shares):
            fields[f"moe/load_max_over_mean/layer{layer}"] = max(share) * len(share)
            fields[f"moe/load/layer{layer}"] = [round(x, 5) for x in share]  # metrics.jsonl only: not a scalar
        trainer.log(fields)
