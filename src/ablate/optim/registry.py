"""Optimizers by name (`optim.name`): each is one class in one file of this package that registers itself, built
from the role parameter groups and the OptimConfig: `Cls(param_groups, cfg)`."""

from __future__ import annotations

import torch
from torch import nn

from ablate.config import ConfigError, OptimConfig
from ablate.optim.roles import param_groups

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {}


def register(name: str):
    """Class decorator: make an optimizer available as optim.name=`name`."""

    def add(cls):
        if name in OPTIMIZERS:
            raise ValueError(f"optimizer {name!r} is registered twice: {OPTIMIZERS[name].__name__}, {cls.__name__}")
        OPTIMIZERS[name] = cls
        return cls

    return add


def check_optimizer_name(cfg: OptimConfig) -> None:
    """ConfigError unless optim.name is registered (config, which imports nothing of ablate, cannot know)."""
    if cfg.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name: {cfg.name!r} unknown; allowed: {', '.join(sorted(OPTIMIZERS))}")


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    check_optimizer_name(cfg)
    return OPTIMIZERS[cfg.name](param_groups(model, cfg), cfg)
