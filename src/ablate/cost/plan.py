"""`ablate plan FILE`: what each run costs before any compute, as two tables.

For every run: parameters (counted on a meta-device model, nothing allocated), FLOPs per token and in all (a branch
counts only its steps after the branch point), tokens, steps, tokens per parameter, the per-rank memory peak under
FSDP2 at a given world size (ablate.cost.memory walks a step's timeline), and the wall time at this machine's peak
FLOP/s. With `--stack K`, a third: the runs in stacks of up to K (training.stack.plan_stacks), each stack's memory on
its one device and the largest stack of its shape that fits.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate import rundir
from ablate.config import ConfigError, RunConfig
from ablate.cost.memory import (
    Memory,
    breakdown,
    estimate_memory,
    estimate_stack_memory,
    format_bytes,
    largest_stack,
    model_shapes,
    precision_of,
)
from ablate.data.batch_schedule import check_plan, largest_pass
from ablate.setup import auto
from ablate.setup.checks import CheckedRun
from ablate.text import aligned
from ablate.training import stack as training_stack
from ablate.training.parallel import peak_flops_for


# ---------------------------------------------------------------------------------------------------------------
# a run's cost


@dataclass
class RunPlan:
    run: RunConfig
    rank_micro_batch: int  # the most sequences one rank takes in a forward pass (largest_pass)
    params: int
    non_embedding: int  # parameters outside the embedding table (an untied head counts)
    active: int  # parameters one token uses: with experts, top_k of the routed ones (else params)
    kv_bytes_per_token: int  # what a bf16 KV cache keeps per token over every layer, as model.kv_cache_bytes_per_token
    flops_per_token: float  # 6N + attention, as model.flops_per_token
    steps: int  # optimizer steps this run trains: for a branch, those after its branch step
    tokens: int  # tokens this run trains
    model_tokens: int  # tokens the final model has seen (a branch's parent's share included)
    memory: Memory
    peak_flops: float  # per device
    peak_source: str  # where the peak comes from

    @property
    def flops(self) -> float:
        return self.flops_per_token * self.tokens

    @property
    def tokens_per_param(self) -> float:
        return self.model_tokens / self.params

    def seconds(self, world: int, mfu: float = 1.0) -> float:
        return self.flops / (world * self.peak_flops * mfu)


_PEAKS: dict[tuple[str, torch.dtype], float] = {}


def _machine_peak(device_type: str, dtype: torch.dtype) -> float:
    """This machine's peak FLOP/s per device: a known GPU's, else measured once and kept in $ABLATE_CACHE (the
    trainer's MFU uses the same)."""
    if (device_type, dtype) not in _PEAKS:
        device = torch.device(device_type, 0) if device_type == "cuda" else torch.device(device_type)
        _PEAKS[device_type, dtype] = peak_flops_for(device, dtype)
    return _PEAKS[device_type, dtype]


def plan_run(checked: CheckedRun, world: int = 1, device_type: str | None = None) -> RunPlan:
    """Parameters, FLOPs, tokens, steps and per-rank memory of a checked run at `world` ranks, before any compute."""
    run = checked.config
    device_type = device_type or auto.device_type(run.train.device)
    seq = run.data.seq_len
    batches = checked.batch_plan  # a branch's: 0 for the steps its parent trained
    try:
        check_plan(batches, world, run.train)
    except ConfigError as exc:
        raise ConfigError(f"{run.name}: {exc}") from None
    start, parent_tokens = (run.branch["step"], run.branch["tokens"]) if run.branch else (0, 0)
    shapes = model_shapes(run)
    compute_dtype = precision_of(run, device_type).compute_dtype
    if run.train.peak_flops:
        peak, source = run.train.peak_flops, "set by train.peak_flops"
    else:
        dtype_name = str(compute_dtype).replace("torch.", "")
        peak = _machine_peak(device_type, compute_dtype)
        source = f"this GPU's, {dtype_name}" if device_type == "cuda" else f"measured on this CPU, {dtype_name}"
    return RunPlan(
        run=run,
        rank_micro_batch=largest_pass(batches, world, run.train.micro_batch),
        params=shapes.total,
        non_embedding=shapes.total - run.model.vocab_size * run.model.d_model,
        active=shapes.active,
        kv_bytes_per_token=shapes.kv_cache_bytes_per_token,
        flops_per_token=shapes.flops_per_token,
        steps=len(batches) - start,
        tokens=sum(batches) * seq,
        model_tokens=parent_tokens + sum(batches) * seq,
        memory=estimate_memory(checked, world, device_type, shapes),
        peak_flops=peak,
        peak_source=source,
    )


def _how_runs_compute(plans: list[RunPlan], world: int) -> str:
    """Device, dtype, kernels and compile as each run will resolve its "auto"s, runs alike grouped."""
    hows: dict[str, list[str]] = {}
    for p in plans:
        choices = auto.for_run(p.run, torch.device(auto.device_type(p.run.train.device)), p.seconds(world))
        hows.setdefault(choices.describe(), []).append(p.run.name)
    if len(hows) == 1:
        return f"{next(iter(hows))} (every run)"
    return "; ".join(f"{how} ({', '.join(dict.fromkeys(names))})" for how, names in hows.items())


def earlier_mfu(out_root: str | Path, experiment: str) -> tuple[float | None, str]:
    """The median MFU in the summaries of finished runs, this experiment's under `out_root`, else any there; and
    where it came from. (None, why) when none reports one."""
    root = Path(out_root)
    for folder in (root / experiment, root):
        values = []
        for path in sorted(folder.glob(f"**/{rundir.SUMMARY}")) if folder.is_dir() else []:
            try:
                value = rundir.read_json(path).get("mfu")
            except rundir.RunFolderError:
                continue
            if isinstance(value, (int, float)) and 0 < value <= 1:
                values.append(float(value))
        if values:
            return statistics.median(values), f"the median of {len(values)} finished runs under {folder}"
    return None, f"no finished run under {root} reports one"


# ---------------------------------------------------------------------------------------------------------------
# the report


def _count(n: float, billion: str = "B") -> str:
    """3 significant digits with K, M, B (G for rates), T."""
    for unit, size in (("T", 1e12), (billion, 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def _flops(n: float) -> str:
    return f"{n:.3g}".replace("e+", "e")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    if minutes < 48 * 60:
        return f"{minutes // 60}h{minutes % 60:02d}m"
    return f"{minutes // 1440}d{minutes // 60 % 24:02d}h"


def format_report(
    plans: list[RunPlan], world: int, device_memory: int | None, mfu: float | None, mfu_source: str
) -> str:
    """Two tables (compute, then per-rank memory), a row per variant (its seeds cost the same) and the whole
    experiment's; the peak FLOP/s and the MFU the times assume."""
    variants: dict[str, list[RunPlan]] = {}
    for p in plans:
        variants.setdefault(p.run.name, []).append(p)
    mfu_label = f"time@{100 * mfu:.0f}%" if mfu else None
    sparse = any(p.active != p.params for p in plans)  # experts: the parameters a token uses apart
    rows = [
        ["run", "seeds", "params"]
        + (["active"] if sparse else [])
        + ["non-emb", "FLOP/token", "KV/token", "steps", "tokens", "tokens/param", "FLOPs", "time@100%"]
        + ([mfu_label] if mfu else [])
    ]
    for name, same in variants.items():
        p = same[0]
        rows.append(
            [name, str(len(same)), _count(p.params)]
            + ([_count(p.active)] if sparse else [])
            + [
                _count(p.non_embedding),
                _count(p.flops_per_token),
                format_bytes(p.kv_bytes_per_token),
                str(p.steps),
                _count(p.tokens),
                f"{p.tokens_per_param:.3g}",
                _flops(p.flops),
                _duration(p.seconds(world)),
            ]
            + ([_duration(p.seconds(world, mfu))] if mfu else [])
        )
    rows.append(
        ["all runs", str(len(plans))]
        + [""] * (5 if sparse else 4)
        + [
            str(sum(p.steps for p in plans)),
            _count(sum(p.tokens for p in plans)),
            "",
            _flops(sum(p.flops for p in plans)),
            _duration(sum(p.seconds(world) for p in plans)),
        ]
        + ([_duration(sum(p.seconds(world, mfu) for p in plans))] if mfu else [])
    )
    peaks = sorted({f"{_count(p.peak_flops, 'G')}FLOP/s ({p.peak_source})" for p in plans})
    lines = [
        f"compute over {world} device{'s' if world > 1 else ''}: a branch counts only its steps after the branch "
        f"point; tokens/param counts every token its final model saw",
        aligned(rows),
        "",
        f"peak per device: {', '.join(peaks)}",
        f"computes as (ablate.setup.auto): {_how_runs_compute(plans, world)}",
        "KV/token: a bf16 KV cache per token over every layer (2 x kv heads x head dim, or MLA's kv_lora_rank + "
        "qk_rope_dim, per layer)"
        + ("; active: the parameters one token uses, FLOPs counted from them" if sparse else ""),
        "time@100%: FLOPs / (devices x peak), a lower bound"
        + (f"; time@{100 * mfu:.0f}%: at the MFU of {mfu_source}" if mfu else f" (MFU: {mfu_source})"),
        "",
    ]
    fits_label = f"fits {format_bytes(device_memory)}" if device_memory else None
    rows = [
        ["run", "precision", "micro-batch", "params", "grads", "optimizer", "activations", "per rank", "peak at"]
        + ([fits_label] if device_memory else [])
    ]
    for name, same in variants.items():
        p, mem = same[0], same[0].memory
        rows.append(
            [
                name,
                precision_of(p.run, auto.device_type(p.run.train.device)).mode,
                f"{p.rank_micro_batch}x{p.run.data.seq_len}",
                format_bytes(mem.params),
                format_bytes(mem.grads),
                format_bytes(mem.optimizer),
                format_bytes(mem.activations + mem.gathered),
                format_bytes(mem.total),
                mem.moment,
            ]
            + ([_fits(mem.total, device_memory)] if device_memory else [])
        )
    lines += [
        f"memory per rank at the step's peak, {f'FSDP2 over {world} ranks' if world > 1 else 'one device'} "
        f"(activations: saved for backward by one micro-batch, with the "
        f"{'gathered parameters' if world > 1 else 'bf16 weight copies of a bf16 run'} and loss buffers alive then)",
        aligned(rows, text_columns=(0, 1, 8)),
    ]
    if any(auto.device_type(p.run.train.device) == "cpu" for p in plans):
        lines.append(
            "on CPU these are live tensor bytes; the process's RSS adds its libraries and the pages malloc "
            "keeps (scripts/bench_plan.py --rss: 1.4-3.4x these figures)"
        )
    return "\n".join(lines)


TIGHT = 0.8  # above this share of the device: within the estimate's error of not fitting


def _fits(need: int, have: int) -> str:
    if need > have:
        return "NO"
    return "tight" if need > TIGHT * have else "yes"


def unfit(plans: list[RunPlan], device_memory: int | None) -> list[tuple[RunConfig, Memory]]:
    """The runs whose per-rank peak exceeds the device memory."""
    if device_memory is None:
        return []
    return [(p.run, p.memory) for p in plans if p.memory.total > device_memory]


# ---------------------------------------------------------------------------------------------------------------
# stacks: runs of one shape trained as one stacked model on one device (`--stack K`, training.stack)


@dataclass
class StackPlan:
    number: int  # as the report numbers the stacks, from 1
    members: list[RunConfig]  # the runs it trains, in plan_stacks's order
    memory: Memory  # the device's peak over a step of all of them (cost.memory.estimate_stack_memory)
    largest: int | None  # the most runs of its shape one device fits as a stack; None: no device memory known

    @property
    def label(self) -> str:
        return ", ".join(f"{run.name} seed{run.train.seed}" for run in self.members)


def plan_stacks(runs: list[CheckedRun], size: int, device_memory: int | None) -> tuple[list[StackPlan], list[str]]:
    """The runs in stacks of at most `size` as training.stack.plan_stacks groups them, each with its memory and the
    largest stack of its shape that fits `device_memory`; and plan_stacks's line for each run that trains alone."""
    grouped, alone = training_stack.plan_stacks(runs, size)
    return [_plan_stack(number, members, device_memory) for number, members in enumerate(grouped, 1)], alone


def _plan_stack(number: int, members: list[CheckedRun], device_memory: int | None) -> StackPlan:
    device_type = auto.device_type(members[0].config.train.device)
    shapes = model_shapes(members[0].config)  # one model for the stack: its members differ only in init scale
    largest = None
    if device_memory is not None:  # members may differ in optimizer: K of whichever needs the most must fit
        largest = min(largest_stack(checked, device_memory, device_type, shapes) for checked in members)
    memory = estimate_stack_memory(members, device_type, shapes)
    return StackPlan(number, [checked.config for checked in members], memory, largest)


def format_stacks(stacks: list[StackPlan], alone: list[str], size: int, device_memory: int | None) -> str:
    """A row per stack (its memory on its one device, whether it fits, the largest stack of its shape that would,
    its members), then the runs that train alone and why."""
    known = device_memory is not None
    rows = [
        ["stack", "runs", "params", "grads", "optimizer", "activations", "per device", "peak at"]
        + ([f"fits {format_bytes(device_memory)}", "largest K"] if known else [])
        + ["members"]
    ]
    for s in stacks:
        mem = s.memory
        rows.append(
            [str(s.number), str(len(s.members))]
            + [format_bytes(n) for n in (mem.params, mem.grads, mem.optimizer, mem.activations + mem.gathered)]
            + [format_bytes(mem.total), mem.moment]
            + ([_fits(mem.total, device_memory), str(s.largest)] if known else [])
            + [s.label]
        )
    lines = [
        "",
        f"stacks of up to {size} runs of one shape, each trained as one model on one device (training.stack): memory "
        "at the step's peak, every member's parameters, gradients, optimizer state and activations (an optimizer "
        "step's temporaries once where its members step one after another)",
        aligned(rows, text_columns=(0, 7, len(rows[0]) - 1)),
        "largest K: the most runs of the stack's shape that fit the device as one stack (--stack K)"
        if known
        else "largest K: unknown, no device memory to fit (no GPU visible): give --device-memory SIZE, e.g. 80GiB",
    ]
    if alone:
        lines += ["trains alone:"] + [f"  {line}" for line in alone]
    return "\n".join(lines)


def unfit_stacks(stacks: list[StackPlan], device_memory: int | None) -> list[StackPlan]:
    """The stacks whose peak exceeds the device memory."""
    if device_memory is None:
        return []
    return [s for s in stacks if s.memory.total > device_memory]


def stack_refusal(unfit: list[StackPlan], device_memory: int) -> str:
    """The message naming each stack that cannot fit, what it needs, and the largest stack of its shape that would."""

    def most(k: int) -> str:
        return "not even one run of its shape fits" if k == 0 else f"at most {k} of its shape fit: --stack {k}"

    lines = [
        f"stack {s.number} ({s.label}) needs ~{format_bytes(s.memory.total)} ({breakdown(s.memory)}); {most(s.largest)}"
        for s in unfit
    ]
    return (
        f"{len(unfit)} stack{'s' if len(unfit) != 1 else ''} cannot fit in {format_bytes(device_memory)} of device "
        f"memory:\n  " + "\n  ".join(lines) + "\nallowed: a smaller --stack (every member's parameters, gradients, "
        "optimizer state and activations are on the one device), a smaller train.micro_batch, or a smaller model"
    )
