"""Optimizers by name, the parameter-role table, and learning-rate schedules.

- roles.py: ROLES, the table of parameter roles (embedding, hidden, vector, head) with their weight decay and lr
  multiplier; assign_roles and param_groups.
- registry.py: optimizers registered by `optim.name` (in ablate.components.registry, beside every other component);
  build_optimizer, check_optimizer_name; state_elements and
  transient_elements, what each declares about its memory (for ablate.cost.memory); steps_together and
  stacked_step_of, whether and how it batches a stack's step.
- state.py: ParamShapes and shard_elements, what an optimizer's memory declarations are computed from.
- adamw.py, muon.py: one optimizer each (a new optimizer is one more file, imported below).
- schedule.py: lr_factor (pure function of progress) and set_lr (lr x each role's multiplier).
"""

from ablate.optim import adamw, muon  # noqa: E402,F401  (importing registers them)
from ablate.optim.registry import (
    build_optimizer,
    check_optimizer_name,
    optimizer_class,
    register,
    stacked_step_of,
    state_elements,
    steps_together,
    transient_elements,
)
from ablate.optim.roles import ROLES, Role, RoleError, assign_roles, param_groups
from ablate.optim.schedule import lr_factor, set_lr
from ablate.optim.state import ParamShapes, shard_elements

__all__ = [
    "ParamShapes",
    "ROLES",
    "Role",
    "RoleError",
    "assign_roles",
    "build_optimizer",
    "check_optimizer_name",
    "lr_factor",
    "optimizer_class",
    "param_groups",
    "register",
    "set_lr",
    "shard_elements",
    "stacked_step_of",
    "state_elements",
    "steps_together",
    "transient_elements",
]
