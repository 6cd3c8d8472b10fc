"""Optimizers by name (`optim.name`): each is one class in one file of this package that registers itself, built
from the role parameter groups and the OptimConfig: `Cls(param_groups, cfg)`, and declaring its state size for the
memory estimate (state.py: `state_elements`, `transient_elements`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ablate.config import ConfigError, OptimConfig
from ablate.optim.roles import param_groups
from ablate.optim.state import ParamShapes

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


def _declaration(cfg: OptimConfig, asked) -> Callable[[ParamShapes, int], int]:
    """The static method of optim.name's class that `asked` (state_elements or transient_elements, below) asks
    for, by its name; ConfigError naming what to declare when the class has none (never a silent 0)."""
    check_optimizer_name(cfg)
    cls = OPTIMIZERS[cfg.name]
    declarations = (state_elements, transient_elements)
    missing = [d.__name__ for d in declarations if getattr(cls, d.__name__, None) is None]
    if asked.__name__ in missing:
        raise ConfigError(
            f"optim.name: {cfg.name!r} ({cls.__module__}.{cls.__qualname__}) declares no {' and no '.join(missing)}, "
            f"which the memory estimate (ablate plan, ablate run's fit check) needs: give the class the static "
            f"methods {', '.join(f'{d.__name__}(shapes, world) -> int' for d in declarations)} (fp32 elements per "
            f"rank: its state, and its step's temporaries; see ablate.optim.state)"
        )
    return getattr(cls, asked.__name__)


def state_elements(cfg: OptimConfig, shapes: ParamShapes, world: int) -> int:
    """The fp32 elements of the optimizer's state on each of `world` ranks, as its class declares them."""
    return int(_declaration(cfg, state_elements)(shapes, world))


def transient_elements(cfg: OptimConfig, shapes: ParamShapes, world: int) -> int:
    """The fp32 elements the optimizer's step needs beyond its state, on each of `world` ranks, as declared."""
    return int(_declaration(cfg, transient_elements)(shapes, world))


def _stacked_step(cls: type) -> Callable[[list], None] | None:
    step = getattr(cls, "stacked_step", None)
    return step if callable(step) else None


def stacked_step_of(optimizers: list) -> Callable[[list], None] | None:
    """The one call that steps every optimizer of a stack's members at once: their class's static
    `stacked_step(optimizers)` (Muon's batches Newton-Schulz over the stack), where they are all of one class that
    has one; else None (each optimizer takes its own step)."""
    kinds = {type(optimizer) for optimizer in optimizers}
    return _stacked_step(kinds.pop()) if len(kinds) == 1 else None


def steps_together(cfg: OptimConfig) -> bool:
    """Whether a stack of runs with optim.name's optimizer takes its step as one call (stacked_step_of): its
    temporaries are then every member's at once."""
    check_optimizer_name(cfg)
    return _stacked_step(OPTIMIZERS[cfg.name]) is not None
