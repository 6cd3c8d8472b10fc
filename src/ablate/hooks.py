"""Small objects the training loop calls after each step and at the end: logging, validation, checkpointing.

Each hook sees the Trainer (train.py) and decides from `trainer.step` whether it has work. New concerns (the eval
suite, stability monitors) are new hooks, not new branches in the loop.
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


class Hook:
    def after_step(self, trainer) -> None:
        pass

    def at_end(self, trainer) -> None:
        pass

    def close(self) -> None:
        pass


def due(step: int, every: int, last: int) -> bool:
    return step == last or (every > 0 and step % every == 0)


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class MetricsLogger(Hook):
    """metrics.jsonl + TensorBoard + a console line, every `log_every` steps (and the last), on rank 0.

    On resume the lines and events after the checkpoint's step are dropped, so a resumed run's logs read as if it
    had never stopped.
    """

    def __init__(self, run_dir: Path, trainer, start_step: int):
        self.enabled = trainer.dist.is_main
        self.every = trainer.run.train.log_every
        self.interval_start = time.perf_counter()
        self.interval_tokens = 0
        self.train_seconds = 0.0
        self.path = run_dir / rundir.METRICS
        if not self.enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        if self.path.exists():  # keep only what the checkpoint we resume from had seen (a torn line is dropped)
            kept = [row for row in rundir.read_jsonl(self.path) if row.get("step", 0) <= start_step]
            rundir.rewrite_jsonl(self.path, kept)
        self.file = self.path.open("a")
        self.writer = SummaryWriter(str(run_dir / rundir.TENSORBOARD),
                                    purge_step=start_step + 1 if start_step else None)

    def after_step(self, trainer) -> None:
        self.interval_tokens += trainer.tokens_per_step
        if not due(trainer.step, self.every, trainer.max_steps):
            return
        elapsed = time.perf_counter() - self.interval_start - trainer.pause_seconds
        trainer.pause_seconds = 0.0
        self.train_seconds += elapsed
        tokens_per_second = self.interval_tokens / max(elapsed, 1e-9)

        # None when above 100%: the peak was measured too low (a busy machine), and the figure would mislead
        mfu = model_flops_utilization(tokens_per_second / trainer.dist.world, trainer.flops_per_token,
                                      trainer.peak_flops)
        mfu_text = "mfu n/a (peak unreliable)" if mfu is None else f"mfu {100 * mfu:.1f}%"
        record = {"step": trainer.step, "tokens": trainer.tokens, "loss": trainer.last_loss, "lr": trainer.last_lr,
                  "grad_norm": trainer.last_grad_norm, "tokens_per_second": tokens_per_second, "mfu": mfu,
                  "memory_bytes": peak_memory_bytes(trainer.dist.device)}
        trainer.throughput.append(tokens_per_second)
        self.interval_start, self.interval_tokens = time.perf_counter(), 0
        if not self.enabled:
            return
        self.write(record)
        eta = (trainer.max_steps - trainer.step) * elapsed / max(self.every, 1)
        print(f"[{trainer.run.name} seed{trainer.run.train.seed}] step {trainer.step}/{trainer.max_steps} "
              f"loss {record['loss']:.4f} lr {record['lr']:.2e} gnorm {record['grad_norm']:.3f} "
              f"{tokens_per_second / 1e3:.2f}k tok/s {mfu_text} "
              f"mem {record['memory_bytes'] / 2**30:.2f}GiB eta {_format_duration(eta)}", flush=True)

    def write(self, record: dict) -> None:
        """One metrics.jsonl line and a TensorBoard scalar per numeric field (tagged by section)."""
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for key, value in record.items():
            if key not in ("step", "tokens") and isinstance(value, (int, float)) and math.isfinite(value):
                tag = key if "/" in key else f"train/{key}"
                self.writer.add_scalar(tag, value, record["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.writer.close()


class PeriodicHook(Hook):
    """Work done every `interval(trainer)` steps and at the last step; its time is left out of tokens/s."""

    def interval(self, trainer) -> int:
        raise NotImplementedError

    def run(self, trainer) -> None:
        raise NotImplementedError

    def after_step(self, trainer) -> None:
        if due(trainer.step, self.interval(trainer), trainer.max_steps):
            start = time.perf_counter()
            self.run(trainer)
            trainer.pause_seconds += time.perf_counter() - start


class Validation(PeriodicHook):
    """Held-out loss every `val_every` steps and at the end, logged through the MetricsLogger."""

    def __init__(self, logger: MetricsLogger):
        self.logger = logger

    def interval(self, trainer) -> int:
        return trainer.run.train.val_every

    def run(self, trainer) -> None:
        losses = trainer.validation_losses()
        trainer.last_val_loss = sum(losses.values()) / len(losses) if losses else math.nan
        self.logger.write({"step": trainer.step, "tokens": trainer.tokens, "val/loss": trainer.last_val_loss})
        if trainer.dist.is_main:  # per-sequence losses: the items of paired comparisons between variants
            rundir.write_items(trainer.run_dir, trainer.step, "val_loss",
                               [{"id": i, "loss": loss} for i, loss in sorted(losses.items())])
            print(f"[{trainer.run.name} seed{trainer.run.train.seed}] step {trainer.step} "
                  f"val_loss {trainer.last_val_loss:.4f}", flush=True)


class Checkpointer(PeriodicHook):
    """DCP checkpoint every `ckpt_every` steps and at the end."""

    def __init__(self, ckpt_root: Path):
        self.ckpt_root = ckpt_root

    def interval(self, trainer) -> int:
        return trainer.run.train.ckpt_every

    def run(self, trainer) -> None:
        save_checkpoint(self.ckpt_root, trainer.step, trainer.model, trainer.optimizer, trainer.resume_state(),
                        trainer.dist, keep=trainer.run.train.keep_checkpoints)


class NonFiniteGuard(Hook):
    """Stops a run whose loss stays NaN/inf; single bad steps are skipped by the loop and counted."""

    def __init__(self, patience: int = 5):
        self.patience = patience

    def after_step(self, trainer) -> None:
        if trainer.consecutive_skips >= self.patience:
            raise FloatingPointError(f"{trainer.run.name}: {trainer.consecutive_skips} steps in a row had a "
                                     f"non-finite loss or gradient (last at step {trainer.step}); lower optim.lr, "
                                     f"set model.z_loss or model.qk_norm, or check the data")
