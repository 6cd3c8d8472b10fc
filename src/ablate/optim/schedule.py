"""Learning-rate schedules as pure functions of training progress, and setting the lr of each role's group.

A schedule depends only on (step, total steps) so a run can be resumed, or branched from a checkpoint into a new
decay, without any scheduler state.
"""

from __future__ import annotations

import math

import torch

from ablate.config import ScheduleConfig


def lr_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based) of `total_steps`."""
    progress = step / max(total_steps, 1)
    warmup = cfg.warmup
    warmup_steps = math.ceil(warmup * total_steps)  # ceil: the last warmup step reaches the peak, never passes it
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    floor = cfg.min_lr_ratio
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "cosine":
        t = (progress - warmup) / max(1 - warmup, 1e-12)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    # wsd: stable at the peak, then decay over the last `decay` share of the run with the chosen shape
    decay_start = 1 - cfg.decay
    if progress < decay_start:
        return 1.0
    t = min((progress - decay_start) / cfg.decay, 1.0)
    shape = {"linear": 1 - t, "cosine": 0.5 * (1 + math.cos(math.pi * t)), "sqrt": 1 - math.sqrt(t)}[cfg.decay_shape]
    return floor + (1 - floor) * shape


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Each group's lr: `lr` times its role's multiplier (groups come from ablate.optim.param_groups)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
