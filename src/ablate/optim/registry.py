"""Optimizers by name (`optim.name`), in the one registry (ablate.components.registry) that an experiment file adds to
with `ablate.register_optimizer(name)`: each is one class, built from the role parameter groups and the
OptimConfig: `Cls(param_groups, cfg)`, and declaring its state size for the memory estimate (state.py:
`state_elements`, `transient_elements`): one without them is refused wherever runs are checked, before any compute."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ablate.components import registry
from ablate.config import ConfigError, OptimConfig
from ablate.optim.roles import assign_roles, param_groups
from ablate.optim.state import ParamShapes


def register(name: str):
    """Class decorator: make an optimizer available as optim.name=`name` (ablate.register_optimizer)."""

    def add(cls):
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise registry.RegistryError(
                f"register_optimizer({name!r}): {getattr(cls, '__qualname__', cls)!r} is not a torch.optim.Optimizer "
                f"subclass; allowed: a class built as Cls(param_groups, optim_config)"
            )
        registry.register("optimizer", name, cls)
        return cls

    return add


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    return registry.lookup("optimizer", name).obj


def check_optimizer_name(cfg: OptimConfig) -> None:
    """ConfigError unless optim.name is registered and its class declares its memory (config, which imports
    nothing of ablate, cannot know)."""
    registry.lookup("optimizer", cfg.name)
    _declaration(cfg, state_elements)
    _declaration(cfg, transient_elements)


def build_optimizer(model: nn.Module, cfg: OptimConfig, base_shapes: dict | None = None) -> torch.optim.Optimizer:
    """optim.name's optimizer over the role groups; with `base_shapes` (Transformer.base_shapes under mup or
    completep), each hidden matrix's lr multiplied as its class declares (width_lr_multiplier)."""
    check_optimizer_name(cfg)
    multipliers = width_lr_multipliers(model, cfg, base_shapes) if base_shapes is not None else None
    return optimizer_class(cfg.name)(param_groups(model, cfg, multipliers), cfg)


WIDTH_SCALED_ROLES = ("hidden", "expert")  # under μP the other roles keep their lr (components/parametrization.py)


def check_width_scaling(cfg: OptimConfig) -> None:
    """ConfigError unless optim.name's class declares how its hidden matrices' lr scales with width (μP)."""
    entry = registry.lookup("optimizer", cfg.name)
    if not callable(getattr(entry.obj, "width_lr_multiplier", None)):
        raise ConfigError(
            f"optim.name: {cfg.name!r} ({entry.obj.__qualname__} in {entry.file}) declares no width_lr_multiplier, "
            f"which model.parametrization 'mup'/'completep' needs: give the class a static method "
            f"width_lr_multiplier(shape, base_shape) -> float, the lr of a hidden matrix of `shape` relative to the "
            f"same matrix at model.base_width (AdamW: base fan-in / fan-in; see ablate.optim.muon for a spectral "
            f"rule), or use model.parametrization='sp'"
        )


def width_lr_multipliers(model: nn.Module, cfg: OptimConfig, base_shapes: dict) -> dict[str, float]:
    """{parameter name: lr multiplier} for the hidden and expert matrices, as optim.name's class declares."""
    check_width_scaling(cfg)
    rule = optimizer_class(cfg.name).width_lr_multiplier
    shapes = {name: tuple(param.shape) for name, param in model.named_parameters()}
    # a compiled block's parameters are named through its wrapper (layers.0._orig_mod.attn...): the base model's not
    return {
        name: float(rule(shapes[name], tuple(base_shapes[name.replace("._orig_mod", "")])))
        for name, role in assign_roles(model).items()
        if role in WIDTH_SCALED_ROLES
    }


def _declaration(cfg: OptimConfig, asked) -> Callable[[ParamShapes, int], int]:
    """The static method of optim.name's class that `asked` (state_elements or transient_elements, below) asks
    for, by its name; ConfigError naming what to declare when the class has none (never a silent 0)."""
    entry = registry.lookup("optimizer", cfg.name)
    cls = entry.obj
    declarations = (state_elements, transient_elements)
    missing = [d.__name__ for d in declarations if getattr(cls, d.__name__, None) is None]
    if asked.__name__ in missing:
        raise ConfigError(
            f"optim.name: {cfg.name!r} ({cls.__qualname__} in {entry.file}) declares no {' and no '.join(missing)}, "
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
    return _stacked_step(optimizer_class(cfg.name)) is not None
