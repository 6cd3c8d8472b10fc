"""What a run asks, checked before any compute: the names config.py cannot check (optim.name against the
optimizer registry, eval.tasks and eval.metrics against the task suite) and what the machine must have (a GPU for
train.device='cuda', float8 matmuls for train.float8, every step's batch a multiple of the world size).

Experiment loading calls these where a file loads; train() calls them again where a run starts (the real world
size). Nothing here trains: experiment loading imports this module and no training module.
"""

from __future__ import annotations

import os

import torch

from ablate.setup.auto import device as resolve_device
from ablate.data.batch_schedule import check_plan, run_plan
from ablate.config import ConfigError, RunConfig
from ablate.optim.registry import check_optimizer_name


def check_registered_names(run: RunConfig) -> RunConfig:
    """The names config (importing nothing of ablate) cannot check, optim.name and eval.tasks, against their
    registries: ConfigError if unknown."""
    check_optimizer_name(run.optim)
    if run.eval.tasks.strip():  # lazily: runs without tasks never load the suite
        from ablate.eval.suite import check_config_tasks, parse_metrics

        check_config_tasks(run.eval.tasks)
        try:
            parse_metrics(run.eval.metrics, "eval.metrics")
        except ValueError as error:
            raise ConfigError(str(error)) from None
    return run


def check_this_machine(run: RunConfig, world: int | None = None) -> RunConfig:
    """What a run asks of the machine it starts on, checked before any compute: where experiments load (the world
    size from torchrun's WORLD_SIZE, 1 without it) and again where training starts (the real world). A visible GPU
    for train.device='cuda', float8 matmuls for train.float8, and every step's batch a multiple of the world size.
    ConfigError otherwise."""
    device = resolve_device(run.train.device)
    if run.train.float8:
        check_float8(device)
    check_plan(run_plan(run), world or int(os.environ.get("WORLD_SIZE", 1)), run.train)
    return run


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
