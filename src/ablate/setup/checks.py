"""A run checked once, before any compute: `check_run` turns a RunConfig into a CheckedRun (the config validated,
its names known, its data files readable, what it asks of this machine present, and its device, dtype and batch
schedule resolved) that experiment loading makes, sweeps carry and train() takes as it is.

The checks ablate.config cannot make alone: optim.name and model.ffn/norm/score_mod against the registry (with their
options and, for a user's component, its shapes on the meta device), eval.tasks and eval.metrics against the suite,
a GPU for train.device='cuda', float8 matmuls for train.float8, every step's batch a multiple of the world size.
Nothing here trains: experiment loading imports this module and no training module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from ablate.config import ConfigError, RunConfig, validate
from ablate.data.batch_schedule import check_plan, run_batch_plan
from ablate.data.prepare import check_data_config
from ablate.components.parametrization import check_parametrization
from ablate.optim.registry import check_optimizer_name, check_width_scaling
from ablate.setup.components import check_components
from ablate.setup.auto import device as resolve_device
from ablate.setup.auto import uses_bf16


@dataclass(frozen=True)
class CheckedRun:
    """A RunConfig checked for a world of `world` ranks, with what its "auto" fields and batch schedule resolve to
    (`checked.config.name`, `checked.batch_plan`): a plain record, which pickles and copies as its fields do."""

    config: RunConfig
    world: int
    device: torch.device  # train.device resolved (ablate.setup.auto)
    bf16: bool  # train.dtype resolved: bf16 mixed precision, or fp32 throughout
    batch_plan: tuple[int, ...]  # the global batch of every step (0 before a branch's start)


def check_run(run: RunConfig | CheckedRun, world: int | None = None, prechecked: bool = False) -> CheckedRun:
    """`run` checked once for a world of `world` ranks (torchrun's WORLD_SIZE, 1 without it, when None); a
    CheckedRun for that world is returned as it is. `prechecked`: validated and its data config checked already
    (experiment loading does both once per variant, not once per seed). Raises ConfigError naming the field and
    its allowed values."""
    world = world or int(os.environ.get("WORLD_SIZE", 1))
    if isinstance(run, CheckedRun):
        if run.world == world:
            return run
        run, prechecked = run.config, True  # only the world differs: its config and data were checked
    if not prechecked:
        validate(run)
        check_data_config(run.data, run.model.vocab_size)
    run = check_registered_names(run)
    device = resolve_device(run.train.device)
    if run.train.float8:
        check_float8(device)
    plan = run_batch_plan(run)
    check_plan(plan, world, run.train)
    if run.train.cuda_graphs is True:
        refusal = cuda_graphs_refusal(run, device, world)
        if refusal is not None:
            raise ConfigError(f"train.cuda_graphs=True: {refusal}; allowed here: False or 'auto'")
    return CheckedRun(run, world, device, uses_bf16(run.train.dtype, device), tuple(plan))


def check_registered_names(run: RunConfig) -> RunConfig:
    """The names config (importing nothing of ablate) cannot check against the registry (ablate.components.registry):
    optim.name (and, under μP, its width rule and the base sizes), model.ffn/norm/score_mod with their options,
    eval.tasks. ConfigError if unknown; returns the run with the digests of the user code it trains with
    (user_code) and of its user tasks (eval.task_code)."""
    check_optimizer_name(run.optim)
    check_parametrization(run.model)
    if run.model.parametrization != "sp":
        check_width_scaling(run.optim)
    run = check_components(run)
    if run.eval.tasks.strip():  # lazily: runs without tasks never load the suite
        from ablate.eval.suite import check_config_tasks, parse_metrics, user_task_code

        check_config_tasks(run.eval.tasks)
        try:
            parse_metrics(run.eval.metrics, "eval.metrics")
        except ValueError as error:
            raise ConfigError(str(error)) from None
        task_code = user_task_code(run.eval.tasks)
        if task_code != run.eval.task_code:
            run = replace(run, eval=replace(run.eval, task_code=task_code))
    return run


def cuda_graphs_refusal(run: RunConfig, device: torch.device, world: int) -> str | None:
    """Why this run's step cannot be replayed from CUDA graphs (training.graphs), None if it can: what a capture
    needs (a CUDA device, world size 1, a capturable optimizer step, static shapes and no host reads inside the
    step) and what no lease has shown captured bit for bit yet."""
    from ablate.components import registry
    from ablate.setup.components import used

    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device, and this run trains on {device.type}"
    if world > 1:
        return f"world size {world}: FSDP2's collectives and hooks are not captured (world size 1 only)"
    optimizer = registry.lookup("optimizer", run.optim.name)
    if not getattr(optimizer.obj, "captures_step", False):
        return (
            f"optim.name={run.optim.name!r} ({optimizer.qualname}) does not say its step can be captured (a class "
            f"attribute captures_step = True: a step with no host reads, its learning rate read from the group's "
            f"tensor)"
        )
    for kind, name in used(run).items():
        entry = registry.lookup(kind, name)
        if getattr(entry.obj, "cuda_graphs", True) is False:
            why = getattr(entry.obj, "cuda_graphs_why", "it says its forward cannot be captured")
            return f"{registry.FIELD_OF[kind]}={name!r} ({entry.qualname}): {why}"
    unproven = {
        "model.dropout": run.model.dropout > 0,
        "train.float8": run.train.float8,
        "data.doc_mask": run.data.doc_mask,
    }
    for field_name, is_set in unproven.items():
        if is_set:
            return f"{field_name} is set, and a step with it has not been shown captured bit for bit yet"
    return None


FLOAT8_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9), Hopper (9.0) and newer


def check_float8(device: torch.device) -> None:
    """Refuse train.float8 where float8 matmuls do not exist, or torchao is missing: before any compute, where
    experiments load (check_this_machine), and again in parallelize."""
    if device.type != "cuda":
        raise ConfigError(
            f"train.float8: float8 training needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper "
            f"or newer), but this run is on {device.type}; allowed here: False"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < FLOAT8_MIN_CAPABILITY:
        raise ConfigError(
            f"train.float8: float8 training needs compute capability >= 8.9, but "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}; "
            f"allowed here: False"
        )
    try:
        import torchao.float8  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("train.float8: needs torchao; install it with pip install 'ablate[float8]'") from None
