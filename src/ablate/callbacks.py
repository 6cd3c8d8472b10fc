"""Callbacks around the one training loop: logging, validation, checkpoints, the non-finite guard.

Each callback owns its state (saved in every checkpoint through `state_dict`, so a resumed run continues it), runs
in `order` (lower first), reads the Trainer but never writes its attributes, and reports only through
`trainer.log`: the one channel (MetricsChannel) to metrics.jsonl, TensorBoard and the console. What a callback
contributes to summary.json it returns from `summary()`. New concerns (the eval suite, loss spikes) are new
callbacks, not new branches in the loop.
"""
from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path

import torch

from ablate import rundir
from ablate.checkpoint import save_checkpoint
from ablate.parallel import mfu as model_flops_utilization


class Callback:
    name = "callback"  # the key of its state in checkpoints
    order = 50  # callbacks run in increasing order

    def pre_train(self, trainer) -> None:
        """Training (re)starts at trainer.step: after a resume, and after a rollback."""

    def before_update(self, trainer) -> bool:
        """After backward, before the optimizer step (trainer.last_loss and last_grad_norm are this step's).
        Returning False skips this step's update."""
        return True

    def post_step(self, trainer) -> None:
        """After each optimizer step; trainer.step counts it."""

    def post_train(self, trainer) -> None:
        """After the last step (also when a run is resumed from its final checkpoint and takes no step)."""

    def close(self) -> None:
        """Always called, on success or failure."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def summary(self) -> dict:
        return {}


def due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
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
        self.writer = SummaryWriter(str(self.run_dir / rundir.TENSORBOARD),
                                    purge_step=start_step + 1 if start_step else None)

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
    """Loss, lr, gradient norm, batch, tokens/s, MFU and memory every `log_every` steps (and the last)."""
    name, order = "train_metrics", 90

    def __init__(self):
        self.interval_seconds, self.interval_tokens = 0.0, 0
        self.throughput: list[float] = []  # tokens/s of each logged interval, for summary.json

    def post_step(self, trainer) -> None:
        # time in the step itself: validation, evals and checkpoints stay out of tokens/s
        self.interval_seconds += trainer.last_step_seconds
        self.interval_tokens += trainer.last_step_tokens
        if not due(trainer.step, trainer.run.train.log_every, trainer.max_steps):
            return
        tokens_per_second = self.interval_tokens / max(self.interval_seconds, 1e-9)
        # None when above 100%: the peak was measured too low (a busy machine), and the figure would mislead
        mfu = model_flops_utilization(tokens_per_second / trainer.dist.world, trainer.flops_per_token,
                                      trainer.peak_flops)
        memory = peak_memory_bytes(trainer.dist.device)
        trainer.log({"loss": trainer.last_loss, "lr": trainer.last_lr, "grad_norm": trainer.last_grad_norm,
                     "batch": trainer.last_batch, "tokens_per_second": tokens_per_second, "mfu": mfu,
                     "memory_bytes": memory, **trainer.data_counts()})
        self.throughput.append(tokens_per_second)
        seconds_per_step = self.interval_seconds / max(trainer.run.train.log_every, 1)
        eta = (trainer.max_steps - trainer.step) * seconds_per_step
        mfu_text = "mfu n/a (peak unreliable)" if mfu is None else f"mfu {100 * mfu:.1f}%"
        trainer.say(f"step {trainer.step}/{trainer.max_steps} loss {trainer.last_loss:.4f} lr {trainer.last_lr:.2e} "
                    f"gnorm {trainer.last_grad_norm:.3f} {tokens_per_second / 1e3:.2f}k tok/s {mfu_text} "
                    f"mem {memory / 2**30:.2f}GiB eta {_format_duration(eta)}")
        self.interval_seconds, self.interval_tokens = 0.0, 0

    def state_dict(self) -> dict:
        return {"throughput": self.throughput}

    def load_state_dict(self, state: dict) -> None:
        self.throughput = list(state.get("throughput", []))

    def summary(self) -> dict:
        return {"throughput": self.throughput}


class Validation(Callback):
    """Held-out loss every `val_every` steps and at the end; per-sequence losses kept as the items of paired
    comparisons between variants."""
    name, order = "validation", 20

    def __init__(self):
        self.last_val_loss = math.nan

    def post_step(self, trainer) -> None:
        if due(trainer.step, trainer.run.train.val_every, trainer.max_steps):
            self.validate(trainer)

    def validate(self, trainer) -> None:
        losses = trainer.validation_losses()
        self.last_val_loss = sum(losses.values()) / len(losses) if losses else math.nan
        trainer.log({"val/loss": self.last_val_loss})
        if trainer.dist.is_main:
            rundir.write_items(trainer.run_dir, trainer.step, "val_loss",
                               [{"id": i, "loss": loss} for i, loss in sorted(losses.items())])
        trainer.say(f"step {trainer.step} val_loss {self.last_val_loss:.4f}")

    def state_dict(self) -> dict:
        return {"last_val_loss": self.last_val_loss}

    def load_state_dict(self, state: dict) -> None:
        self.last_val_loss = state.get("last_val_loss", math.nan)

    def summary(self) -> dict:
        return {"final_val_loss": self.last_val_loss}


class Checkpointer(Callback):
    """DCP checkpoint every `ckpt_every` steps, at the steps branches start from (train.keep_steps, never rotated
    away) and at the end. Last in order, so every other callback's state at this step is in it."""
    name, order = "checkpointer", 100

    def post_step(self, trainer) -> None:
        t = trainer.run.train
        if due(trainer.step, t.ckpt_every, trainer.max_steps) or trainer.step in t.keep_steps:
            save_checkpoint(rundir.checkpoint_root(trainer.run_dir), trainer.step, trainer.model, trainer.optimizer,
                            trainer.resume_state(), trainer.dist, keep=t.keep_checkpoints, keep_steps=t.keep_steps)


class NonFiniteGuard(Callback):
    """Skips the update of a step whose loss or gradient is NaN/inf; stops a run that keeps having them."""
    name, order = "non_finite_guard", 0

    def __init__(self, patience: int = 5):
        self.patience, self.in_a_row = patience, 0

    def before_update(self, trainer) -> bool:
        finite = math.isfinite(trainer.last_loss) and math.isfinite(trainer.last_grad_norm)
        self.in_a_row = 0 if finite else self.in_a_row + 1
        return finite

    def post_step(self, trainer) -> None:
        if self.in_a_row >= self.patience:
            raise FloatingPointError(f"{trainer.run.name}: {self.in_a_row} steps in a row had a non-finite loss or "
                                     f"gradient (last at step {trainer.step}); lower optim.lr, set model.z_loss or "
                                     f"model.qk_norm, or check the data")

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row = state.get("in_a_row", 0)

