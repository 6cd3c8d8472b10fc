"""The global batch as a pure function of the tokens seen, like the learning rate of the step.

A run's batch schedule is decided before it starts: `batch_plan` lists the global batch of every optimizer step, so
the number of steps, the LR schedule's length and any step's batch are known from the config alone, and a run
resumed in the middle of a ramp takes exactly the steps it would have taken. Every batch of a plan is a multiple of
train.micro_batch (config.validate refuses a batch_start or stage that is not: a ramp would silently change it).

The plan does not depend on the world size; the world only splits each step: every rank takes batch / world of its
sequences in passes of at most micro_batch (`rank_passes`), so one experiment file trains the same numbers on 1
process, N gloo processes or N GPUs, and only a batch that is not a multiple of the world is refused.
"""

from __future__ import annotations

import math

from ablate.config import ConfigError, RunConfig, TrainConfig, parse_batch_stages


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
    return min(target, _round_to(start * 2**doublings, train.micro_batch))


def total_tokens(train: TrainConfig, seq_len: int) -> int:
    """The run's length in tokens: max_tokens if set, else what max_steps at global_batch would see."""
    return train.max_tokens or train.max_steps * train.global_batch * seq_len


def batch_plan(train: TrainConfig, seq_len: int, start_step: int = 0, start_tokens: int = 0) -> list[int]:
    """The global batch of every step, until the run has seen its total tokens. A constant batch without
    max_tokens is max_steps steps of global_batch, as before schedules existed. A branch starts at `start_step`
    having seen `start_tokens` (its parent trained the steps before: 0 in the plan)."""
    if (
        train.batch_schedule == "constant"
        and not train.max_tokens
        and start_tokens == start_step * train.global_batch * seq_len
    ):
        return [0] * start_step + [train.global_batch] * (train.max_steps - start_step)
    plan, seen, total = [0] * start_step, start_tokens, total_tokens(train, seq_len)
    while seen < total:
        # the last step takes only what is left (in whole micro-batches): every schedule ends at the same tokens
        left = -(-(total - seen) // seq_len)
        batch = min(batch_at(seen, train), -(-left // train.micro_batch) * train.micro_batch)
        plan.append(batch)
        seen += batch * seq_len
    return plan


def run_batch_plan(run: RunConfig) -> list[int]:
    """The global batch of every step of a run: a branch's starts where its parent's checkpoint is (0 before).
    Computed once, by check_run: a checked run (ablate.setup.checks.CheckedRun) carries it as `batch_plan`."""
    branch = run.branch or {"step": 0, "tokens": 0}
    return batch_plan(run.train, run.data.seq_len, branch["step"], branch["tokens"])


def rank_passes(batch: int, world: int, micro_batch: int) -> list[int]:
    """The forward passes one rank takes for a step of `batch` sequences: its share batch / world, in as few passes
    of at most micro_batch as can be, as equal as can be (sizes differ by at most 1). [] for a step not trained here
    (0: a step a branch's parent took)."""
    share = batch // world
    count = -(-share // micro_batch)
    return [share // count + (k < share % count) for k in range(count)]


def rank_micro_batches(indices, world: int, rank: int, micro_batch: int, read):
    """This rank's forward passes of a step whose global order of sequences is `indices`: yields, per pass,
    read(its sequences) (the data's (inputs, targets, doc_ids)) and the pass's `share`, by which its mean loss is
    divided. Every rank reads the same global order and takes its own slice: ranks see different data, and the
    global batch is the same at any world size. share = the rank's sequences / the pass's, so the passes' divided
    losses sum to the mean over the rank's sequences (k equal passes: each divided by k), and ranks with equal
    shares average to the step's mean, at any world size."""
    batch = len(indices)
    per_rank = batch // world
    mine = indices[rank * per_rank : (rank + 1) * per_rank]
    done = 0
    for size in rank_passes(batch, world, micro_batch):
        yield read(mine[done : done + size]), per_rank / size
        done += size


def largest_pass(plan: list[int], world: int, micro_batch: int) -> int:
    """The most sequences one rank takes in one forward pass over the whole plan: micro_batch, or less when every
    step's share per rank is smaller (the reference run's 16 over 2 ranks: 8)."""
    return max((max(rank_passes(b, world, micro_batch), default=0) for b in plan), default=0)


def check_plan(plan: list[int], world: int, train: TrainConfig) -> None:
    """Every step's batch must split evenly over the ranks (equal shares keep the loss and the gradient a mean over
    the step's sequences, and every rank takes as many passes as the others): ConfigError naming the field that
    sets the first that cannot."""
    if train.global_batch % world:
        raise ConfigError(
            f"train.global_batch: {train.global_batch} is not a multiple of the world size ({world}): "
            f"each rank takes an equal share of a step's sequences; allowed: multiples of {world}"
        )
    bad = sorted({b for b in plan if b % world})
    if not bad:
        return
    if train.batch_schedule in ("ramp", "dynamic") and train.batch_start % world:
        where = f"train.batch_start: {train.batch_start}"
    elif train.batch_schedule == "stages" and any(b % world for _, b in parse_batch_stages(train.batch_stages)):
        where = f"train.batch_stages: {train.batch_stages!r}"
    else:  # the ramp's steps between its ends, or a last step that takes what is left: whole micro-batches
        where = (
            f"train.batch_schedule: {train.batch_schedule!r} with train.micro_batch={train.micro_batch} (ramp "
            f"steps and a last step of what is left are whole micro-batches)"
        )
    raise ConfigError(
        f"{where} gives steps of {bad[:5]} sequences, not multiples of the world size ({world}); "
        f"allowed: batches that are multiples of {world} (e.g. train.micro_batch a multiple of {world})"
    )


def lr_batch_scale(batch: int, train: TrainConfig) -> float:
    """The LR multiplier of a step whose batch differs from global_batch: 1, sqrt(B / B_max) or B / B_max."""
    ratio = batch / train.global_batch
    return {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[train.batch_lr_scaling]
