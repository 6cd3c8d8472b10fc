"""Every boolean and enumerated model knob, and every registered component a model field names, turned on at least
once in one tiny forward and backward: the loss is finite and near log(vocab) at init, every parameter gets a
gradient, and no position sees a later one (a knob that loses the causal mask fails here, whatever else tests it).
A new knob is found by its annotation: nothing to add here unless it needs another field set to be read."""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest
import torch

from ablate.components import registry
from ablate.config import ModelConfig, RunConfig
from ablate.model import Transformer
from ablate.setup.checks import check_registered_names

TINY = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
COMPONENT_FIELDS = {"ffn": "ffn", "norm": "norm", "score_mod": "score_mod"}  # model field -> registry kind
# what a knob's value needs beside it to be read (validation refuses it otherwise)
NEEDS = {
    ("attention", "mla"): {"n_kv_heads": None},
    ("moe_balance", "bias"): {"ffn": "moe"},
    ("score_mod", "alibi"): {"pos": "nope"},
    # away from the base sizes, so the multipliers act
    ("parametrization", "mup"): {"base_width": 16},
    ("parametrization", "completep"): {"base_width": 16, "base_depth": 1},
}


def knob_values() -> list[tuple[str, object]]:
    """(field, value) for every non-default value of every bool, Literal or registry-named model field."""
    hints = typing.get_type_hints(ModelConfig)
    found = []
    for f in dataclasses.fields(ModelConfig):
        tp = hints[f.name]
        if tp is bool:
            values = [not f.default]
        elif typing.get_origin(tp) is typing.Literal:
            values = [v for v in typing.get_args(tp) if v != f.default]
        elif f.name in COMPONENT_FIELDS:
            values = [n for n, e in registry.entries(COMPONENT_FIELDS[f.name]).items() if e.builtin and n != f.default]
        else:
            continue
        found += [(f.name, v) for v in values]
    return found


def test_the_knobs_are_found():
    names = {name for name, _ in knob_values()}
    assert {"qk_norm", "tie_embeddings", "pos", "attention", "ffn", "norm", "score_mod", "kernels"} <= names


@pytest.mark.parametrize("name, value", knob_values(), ids=lambda x: str(x))
def test_every_knob_trains_causally(name, value):
    cfg = dataclasses.replace(TINY, **{name: value, **NEEDS.get((name, value), {})})
    check_registered_names(RunConfig(model=cfg))  # the knob is one a run may hold
    torch.manual_seed(0)
    model = Transformer(cfg, 16)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    loss, _ = model.loss(tokens, tokens)
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(cfg.vocab_size)) < 1.0
    loss.backward()
    without = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    unused = {"router.bias"}  # the bias balancing moves it by a rule after the step, not by its gradient
    assert not [n for n in without if not n.endswith(tuple(unused))], f"{name}={value!r}: no gradient: {without}"
    changed = tokens.clone()
    changed[:, -1] = (tokens[:, -1] + 1) % cfg.vocab_size
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :-1], model(changed)[:, :-1], msg=f"{name}={value!r} sees ahead")
