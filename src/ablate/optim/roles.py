"""The parameter roles: which parameters each optimizer rule applies to, in one table.

Every parameter of the model gets exactly one role. The role decides its weight decay, its lr multiplier
(`optim.<role>_lr_scale`) and, for Muon, whether it is orthogonalised (hidden, and expert: each expert's matrix) or
updated by AdamW (the rest). A parameter that no row takes (a 4-D tensor, a matrix outside any nn.Linear) is refused
by name rather than given a silent default: a new kind of parameter needs a decision, made here.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from torch import nn

from ablate.config import OptimConfig

OUTPUT_HEAD = "lm_head"  # the model's output projection (model.Transformer.lm_head)

Rule = Callable[[str, nn.Module, nn.Parameter], bool]  # (owning module's name, module, parameter) -> takes it?


def _is_embedding(module_name: str, module: nn.Module, param: nn.Parameter) -> bool:
    return isinstance(module, nn.Embedding)


def _is_head(module_name: str, module: nn.Module, param: nn.Parameter) -> bool:
    return module_name == OUTPUT_HEAD and param.ndim == 2


def _is_hidden(module_name: str, module: nn.Module, param: nn.Parameter) -> bool:
    # nn.Linear subclasses count too (torchao's float8 linears)
    return isinstance(module, nn.Linear) and param.ndim == 2 and module_name != OUTPUT_HEAD


def _is_expert(module_name: str, module: nn.Module, param: nn.Parameter) -> bool:
    # (experts, out, in) in a module that says it stacks experts (moe.Experts): one matrix per expert
    return param.ndim == 3 and getattr(module, "stacks_experts", False)


def _is_vector(module_name: str, module: nn.Module, param: nn.Parameter) -> bool:
    return param.ndim == 1


@dataclass(frozen=True)
class Role:
    name: str
    takes: str  # the rule in words, for error messages and readers
    weight_decay: bool  # decoupled weight decay of optim.weight_decay, or none
    lr_scale: str  # the OptimConfig field multiplying optim.lr for this role
    rule: Rule


ROLES = (
    #    name         which parameters                                            decay  lr multiplier
    Role(
        "embedding",
        "the weight of an nn.Embedding (a tied output head is it)",
        False,
        "embedding_lr_scale",
        _is_embedding,
    ),
    Role("hidden", "a 2-D weight of an nn.Linear other than the output head", True, "hidden_lr_scale", _is_hidden),
    # the experts' matrices are hidden matrices, a stack of them: the same decay and lr multiplier, and Muon
    # orthogonalises each expert's matrix on its own (a router is an nn.Linear: hidden)
    Role("expert", "a 3-D (experts, out, in) weight of moe.Experts", True, "hidden_lr_scale", _is_expert),
    Role("vector", "a 1-D parameter: norm weights and biases", False, "vector_lr_scale", _is_vector),
    Role("head", f"the weight of the untied output projection ({OUTPUT_HEAD})", True, "head_lr_scale", _is_head),
)


class RoleError(ValueError):
    """A parameter that no role, or more than one, takes."""


def _named_parameters_once(model: nn.Module):
    """(full name, owning module's name, module, parameter) for each parameter, a tied one once: under the first
    module that holds it (the embedding before the output head, as the model registers them)."""
    seen = set()
    for module_name, module in model.named_modules():
        for short_name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            yield (f"{module_name}.{short_name}" if module_name else short_name), module_name, module, param


def assign_roles(model: nn.Module) -> dict[str, str]:
    """{parameter name: role name} for every parameter; RoleError naming the first one with no role or several."""
    roles = {}
    for name, module_name, module, param in _named_parameters_once(model):
        matches = [role.name for role in ROLES if role.rule(module_name, module, param)]
        if len(matches) != 1:
            found = "no role" if not matches else f"several roles ({', '.join(matches)})"
            allowed = "; ".join(f"{role.name}: {role.takes}" for role in ROLES)
            raise RoleError(
                f"parameter {name} (shape {tuple(param.shape)}, in {type(module).__name__}) has {found}; "
                f"each parameter needs exactly one of ({allowed}); add a rule to ablate.optim.ROLES"
            )
        roles[name] = matches[0]
    return roles


def param_groups(model: nn.Module, cfg: OptimConfig, lr_multipliers: dict[str, float] | None = None) -> list[dict]:
    """One optimizer parameter group per role that has parameters, in ROLES order, and within a role one per
    distinct multiplier in `lr_multipliers` ({parameter name: x lr}, the parametrization's; absent: 1), in the
    order first met. Each group carries its `role`, its `lr_scale` (set_lr multiplies the schedule's lr by it: the
    role's optim.<role>_lr_scale times the parametrization's multiplier) and its weight decay."""
    roles = assign_roles(model)
    params = {name: param for name, _, _, param in _named_parameters_once(model)}
    multipliers = lr_multipliers or {}
    groups = []
    for role in ROLES:
        by_multiplier: dict[float, list[nn.Parameter]] = {}
        for name, role_name in roles.items():
            if role_name == role.name:
                by_multiplier.setdefault(multipliers.get(name, 1.0), []).append(params[name])
        # no empty groups: DCP's optimizer state dict refuses more than one
        for multiplier, mine in by_multiplier.items():
            scale = getattr(cfg, role.lr_scale) * multiplier  # x 1.0 leaves a float as it is: sp's groups unchanged
            groups.append(
                {
                    "params": mine,
                    "role": role.name,
                    "lr_scale": scale,
                    "lr": cfg.lr * scale,
                    "weight_decay": cfg.weight_decay if role.weight_decay else 0.0,
                }
            )
    return groups
