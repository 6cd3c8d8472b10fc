"""The components a run names (model.ffn, model.norm, model.score_mod, optim.name), checked before any compute:
each is registered (ablate.components.registry), its options (model.options) are ones it declares, of their types,
and a user's component keeps the shape it is given, built and run on the meta device (no memory, no compute). The
run comes back with `user_code`, the digest of every user component it trains with: part of its identity, so an
edited component never resumes an old folder.
"""

from __future__ import annotations

import dataclasses
import typing

import torch

from ablate import model as _model  # noqa: F401  (the shipped FFNs, norms and score_mods register themselves)
from ablate import optim as _optim  # noqa: F401  (the shipped optimizers)
from ablate.components import registry
from ablate.config import ConfigError, ModelConfig, RunConfig, describe_type, matches_type

MODEL_KINDS = ("ffn", "norm", "score_mod")


def used(run: RunConfig) -> dict[str, str]:
    """{kind: name} of the components the run trains with."""
    m = run.model
    named = {"optimizer": run.optim.name, "ffn": m.ffn, "norm": m.norm, "score_mod": m.score_mod}
    return {kind: name for kind, name in named.items() if name}


def check_components(run: RunConfig) -> RunConfig:
    """`run` with its components checked and its user_code set; ConfigError naming the field otherwise."""
    entries = {kind: registry.lookup(kind, name) for kind, name in used(run).items()}
    _check_options(run.model, [e for kind, e in entries.items() if kind in MODEL_KINDS])
    for kind, entry in entries.items():
        if kind in MODEL_KINDS and not entry.builtin:
            _check_shapes(run.model, kind, entry)
    user_code = {entry.key: entry.digest for entry in entries.values() if not entry.builtin}
    return dataclasses.replace(run, user_code=user_code) if user_code != run.user_code else run


def _check_options(cfg: ModelConfig, entries: list[registry.Entry]) -> None:
    declared = {}
    for entry in entries:
        options = getattr(entry.obj, "Options", None)
        if options is not None:
            hints = typing.get_type_hints(options)
            declared.update({f.name: (hints[f.name], entry) for f in dataclasses.fields(options)})
    for name, value in cfg.options.items():
        if name not in declared:
            allowed = ", ".join(sorted(declared)) or "none (no component in use declares options)"
            raise ConfigError(
                f"model.options.{name}: no component of this run declares it ({', '.join(e.key for e in entries)}); "
                f"allowed: {allowed}"
            )
        tp, entry = declared[name]
        if not matches_type(value, tp):
            raise ConfigError(
                f"model.options.{name}: got {value!r} ({type(value).__name__}); allowed: {describe_type(tp)} "
                f"({entry.qualname}.Options in {entry.file})"
            )


def _check_shapes(cfg: ModelConfig, kind: str, entry: registry.Entry) -> None:
    """Build the component and call it on the meta device: it must keep the shape it is given."""
    where = f"model.{kind}: {entry.name!r} ({entry.qualname} in {entry.file})"
    x_shape, scores_shape = (2, 8, cfg.d_model), (2, cfg.n_heads, 8, 8)
    try:
        with torch.device("meta"):
            if kind == "ffn":
                out = [entry.obj(cfg, i)(torch.empty(x_shape)) for i in sorted({0, cfg.n_layers - 1})]
            elif kind == "norm":
                norm = entry.obj(cfg, cfg.d_model)
                if not hasattr(norm, "reset_parameters"):
                    raise ConfigError("a norm must have reset_parameters() (its init: the identity map)")
                out = [norm(torch.empty(x_shape))]
            else:
                index = [
                    torch.arange(n).view([-1 if d == a else 1 for d in range(4)])
                    for a, n in enumerate((2, cfg.n_heads, 8, 8))
                ]
                out = [entry.obj(cfg)(torch.empty(scores_shape), *index)]
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except Exception as exc:  # the user's code failed to build or run: say where
        raise ConfigError(f"{where}: building or calling it failed: {type(exc).__name__}: {exc}") from None
    want = scores_shape if kind == "score_mod" else x_shape
    for result in out:
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != want:
            got = tuple(result.shape) if isinstance(result, torch.Tensor) else type(result).__name__
            raise ConfigError(f"{where}: its forward maps shape {want} to {got}; allowed: the same shape")
