"""The parametrization (model.parametrization): how init, learning rates and the forward's multipliers change with
width and depth, so a hyperparameter tuned on a small model keeps its meaning on a large one.

- "sp", the standard parametrization: every init std, learning rate and multiplier as configured, at any size.
- "mup", μP (Tensor Programs V, Yang et al. 2022), in the form with an output multiplier. With m = d_model /
  base_width and each matrix's own fan-in ratio r = fan_in / base fan_in (the same matrix of the model built at
  base_width):
  - hidden matrices (every nn.Linear but the head, the experts' matrices): init std x 1/sqrt(r), and the lr
    multiplier the optimizer declares (`width_lr_multiplier(shape, base_shape)`: 1/r for AdamW, whose per-entry
    update does not shrink with width; Muon's, from its spectral scale, in optim/muon.py);
  - embedding, vectors and the output head: init and lr as configured (an embedding's output does not grow with
    width, nor do a vector's);
  - the output logits x 1/m, so the head's update, which grows with the width it sums over, stays the same size;
  - attention scores q.k x sqrt(base head width) / head width (1/head_dim, not 1/sqrt(head_dim): queries and keys
    become correlated as they train, and their dot product grows as head_dim, not its square root).
- "completep", CompleteP (Dey et al. 2025, arXiv 2505.01618, depth-μP with alpha = 1): "mup" and, with
  L = n_layers / base_depth, each residual branch x 1/L and the output projections' init drawn for base_depth
  layers (the branch multiplier, not a smaller init, keeps the stream's variance from growing with depth). At
  alpha = 1 AdamW's hidden and vector learning rates do not change with depth, so no lr rule is added.

At base_width (and base_depth) every multiplier is exactly 1 and "mup" and "completep" are "sp", bit for bit.
Not scaled (say so where it matters): AdamW's eps and weight decay (CompleteP also scales eps by 1/(m L) and the
decay by m; at these widths eps = 1e-8 sits far below the second moment's root), and dropout.
"""

from __future__ import annotations

import dataclasses
import math

from ablate.config import ConfigError, ModelConfig

PARAMETRIZATIONS = ("sp", "mup", "completep")


def scales_width(cfg: ModelConfig) -> bool:
    return cfg.parametrization in ("mup", "completep")


def width_multiplier(cfg: ModelConfig) -> float:
    """m = d_model / base_width under mup and completep; 1 under sp."""
    return cfg.d_model / cfg.base_width if scales_width(cfg) else 1.0


def depth_multiplier(cfg: ModelConfig) -> float:
    """L = n_layers / base_depth under completep; 1 otherwise."""
    return cfg.n_layers / cfg.base_depth if cfg.parametrization == "completep" else 1.0


def base_config(cfg: ModelConfig) -> ModelConfig:
    """The model at base_width (same depth, so its parameters have the same names): each matrix's fan-in there is
    the one its init and lr are relative to."""
    return dataclasses.replace(cfg, d_model=cfg.base_width) if scales_width(cfg) else cfg


def logit_multiplier(cfg: ModelConfig) -> float:
    """What the output logits are multiplied by: 1/m under mup and completep (1 at base_width)."""
    return 1.0 / width_multiplier(cfg)


def attention_scale(cfg: ModelConfig, qk_width: int, base_qk_width: int) -> float | None:
    """The scale of the attention scores q.k for query/key heads `qk_width` wide: sqrt(base) / width under mup and
    completep where the width differs from the base model's; None (SDPA's own 1/sqrt(width), bit for bit)
    otherwise."""
    if not scales_width(cfg) or qk_width == base_qk_width:
        return None
    return math.sqrt(base_qk_width) / qk_width


def residual_multiplier(cfg: ModelConfig) -> float:
    """What each residual branch (attention's and the FFN's output) is multiplied by: base_depth / n_layers under
    completep, 1 otherwise."""
    return 1.0 / depth_multiplier(cfg)


def residual_init_layers(cfg: ModelConfig) -> int:
    """The depth the output projections' init std 1/sqrt(2 * layers) is drawn for: base_depth under completep."""
    return cfg.base_depth if cfg.parametrization == "completep" else cfg.n_layers


def residual_init_std(cfg: ModelConfig) -> float:
    """The init std of a projection that writes into the residual stream (attention's and the FFN's output): GPT-2's
    1/sqrt(2 * layers) scaling, so the stream's variance at init does not grow with depth (layers: base_depth under
    completep, whose branch multipliers do that instead). Written as it always was (std times the scale): the same
    float, so the same weights for a given seed."""
    return cfg.init_std * (1 / math.sqrt(2 * residual_init_layers(cfg)))


def hidden_init_multiplier(shape: tuple[int, ...], base_shape: tuple[int, ...]) -> float:
    """A hidden matrix's init std relative to its configured one: 1/sqrt(fan-in ratio), fan-in the last dim."""
    return math.sqrt(base_shape[-1] / shape[-1])


def check_parametrization(cfg: ModelConfig) -> None:
    """ConfigError, naming the field and what it accepts, for base sizes that cannot define the scaling."""
    name = cfg.parametrization
    if name == "sp":  # base sizes are read only by the others (a grid may sweep the parametrization beside them)
        return
    if cfg.base_width <= 0:
        raise ConfigError(
            f"model.base_width: {cfg.base_width} under model.parametrization={name!r}; allowed: a positive d_model "
            f"(the width whose numbers the standard parametrization gives exactly, e.g. the tuned proxy's)"
        )
    if cfg.base_width % cfg.n_heads:
        raise ConfigError(
            f"model.base_width: {cfg.base_width} is not a multiple of model.n_heads={cfg.n_heads}; allowed: a "
            f"d_model the base model can have (its heads are base_width / n_heads wide)"
        )
    if name == "completep" and cfg.base_depth <= 0:
        raise ConfigError(
            f"model.base_depth: {cfg.base_depth} under model.parametrization='completep'; allowed: a positive "
            f"n_layers (the depth its residual branches and init are relative to)"
        )
