"""What a run reports as it trains: the metrics channel (metrics.jsonl + TensorBoard + console) the trainer writes
through, the TrainMetrics callback (loss, lr, tokens/s, MFU, memory), and the memory peak they both read.

The memory-peak helpers live here because memory is one of the run's metrics: TrainMetrics logs it as memory_bytes,
the trainer puts it in summary.json as peak_memory_bytes, and the run resets it at its start (ablate.training.run).
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
from pathlib import Path

import torch

from ablate import rundir
from ablate.training.callbacks.base import Callback, TrainerView, due
from ablate.training.parallel import mfu as model_flops_utilization

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


# What TrainMetrics logs of the machine, not of the run: a stack's are the whole stack's, a rerun's another machine's
MACHINE_FIGURES = ("tokens_per_second", "mfu", "memory_bytes")


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


def mfu_text(trainer: TrainerView, mfu: float | None) -> str:
    """The console's MFU: only against a datasheet's peak or train.peak_flops. A measured peak (CPU, a GPU not in
    the table) is rough and a shared machine's speed swings (6.9%, 90.3% and n/a were seen in one CPU run), so
    it is recorded in metrics.jsonl and summary.json (ablate plan's time estimates use it) but not shown."""
    if trainer.peak_flops_source == "measured":
        return ""
    return " mfu n/a (peak unreliable)" if mfu is None else f" mfu {100 * mfu:.1f}%"


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

    def acts_at(self, trainer: TrainerView) -> bool:
        return due(trainer.step, self.log_every, trainer.max_steps)

    def post_step(self, trainer: TrainerView) -> None:
        # time in the step itself: validation, evals and checkpoints stay out of tokens/s
        self.interval_seconds += trainer.last_step_seconds
        self.interval_tokens += trainer.last_step_tokens
        if not self.acts_at(trainer):
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
        trainer.say(
            f"step {trainer.step}/{trainer.max_steps} loss {trainer.last_loss:.4f} lr {trainer.last_lr:.2e} "
            f"gnorm {trainer.last_grad_norm:.3f} {tokens_per_second / 1e3:.2f}k tok/s{mfu_text(trainer, mfu)} "
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
