"""The global batch as a pure function of the tokens seen, like the learning rate of the step.

A run's batch schedule is decided before it starts: `batch_plan` lists the global batch of every optimizer step, so
the number of steps, the LR schedule's length and any step's batch are known from the config alone, and a run
resumed in the middle of a ramp takes exactly the steps it would have taken.
"""
from __future__ import annotations

import math

from ablate.config import ConfigError, TrainConfig, parse_batch_stages


def _round_to(batch: float, multiple: int) -> int:
    """Down to a multiple of `multiple` (never below it): every batch splits into whole micro-batches."""
    return max(multiple, int(batch) // multiple * multiple)


def batch_at(tokens_seen: int, train: TrainConfig) -> int:
    """The global batch (sequences) of the step that starts after `tokens_seen` tokens."""
    kind, start, target = train.batch_schedule, train.batch_start, train.global_batch
    if kind == "constant":
        return target
    if kind == "ramp":  # linear in tokens from batch_start to global_batch
        share = min(tokens_seen / train.batch_ramp_tokens, 1.0)
        return _round_to(start + (target - start) * share, train.micro_batch)
    if kind == "stages":
        return next(batch for begin, batch in reversed(parse_batch_stages(train.batch_stages)) if tokens_seen >= begin)
    # dynamic: the batch doubles each time the tokens seen double past batch_ramp_tokens (B proportional to the
    # data seen, in powers of two), up to global_batch
    if tokens_seen < train.batch_ramp_tokens:
        return _round_to(start, train.micro_batch)
    doublings = int(math.floor(math.log2(tokens_seen / train.batch_ramp_tokens))) + 1
    return min(target, _round_to(start * 2 ** doublings, train.micro_batch))


def total_tokens(train: TrainConfig, seq_len: int) -> int:
    """The run's length in tokens: max_tokens if set, else what max_steps at global_batch would see."""
    return train.max_tokens or train.max_steps * train.global_batch * seq_len


def batch_plan(train: TrainConfig, seq_len: int, start_step: int = 0, start_tokens: int = 0) -> list[int]:
    """The global batch of every step, until the run has seen its total tokens. A constant batch without
    max_tokens is max_steps steps of global_batch, as before schedules existed. A branch starts at `start_step`
    having seen `start_tokens` (its parent trained the steps before: 0 in the plan)."""
    if train.batch_schedule == "constant" and not train.max_tokens and start_tokens == start_step * \
            train.global_batch * seq_len:
        return [0] * start_step + [train.global_batch] * (train.max_steps - start_step)
    plan, seen, total = [0] * start_step, start_tokens, total_tokens(train, seq_len)
    while seen < total:
        # the last step takes only what is left (in whole micro-batches): every schedule ends at the same tokens
        left = -(-(total - seen) // seq_len)
        batch = min(batch_at(seen, train), -(-left // train.micro_batch) * train.micro_batch)
        plan.append(batch)
        seen += batch * seq_len
    return plan


def run_plan(run) -> list[int]:
    """The batch plan of a RunConfig: a branch's starts where its parent's checkpoint is (0 before)."""
    branch = run.branch or {"step": 0, "tokens": 0}
    return batch_plan(run.train, run.data.seq_len, branch["step"], branch["tokens"])


def check_plan(plan: list[int], micro_batch: int, world: int, where: str = "train.batch_schedule") -> None:
    """Every batch must split into micro_batch x world sequences per pass; ConfigError naming the first that cannot."""
    per_pass = micro_batch * world
    bad = sorted({b for b in plan if b % per_pass})  # 0: a step a branch's parent took
    if bad:
        raise ConfigError(f"{where}: global batches {bad[:5]} are not multiples of train.micro_batch ({micro_batch}) "
                          f"x world size ({world}); allowed: multiples of {per_pass} (set batch_start, "
                          f"batch_stages or micro_batch to fit)")


def lr_batch_scale(batch: int, train: TrainConfig) -> float:
    """The LR multiplier of a step whose batch differs from global_batch: 1, sqrt(B / B_max) or B / B_max."""
    ratio = batch / train.global_batch
    return {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[train.batch_lr_scaling]
