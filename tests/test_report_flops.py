"""The report's torch-free FLOPs count (report/inputs/flops.py) against the model's (Transformer.flops_per_token)."""

import dataclasses

import pytest
import torch

from ablate.config import ModelConfig
from ablate.model import Transformer
from ablate.report.inputs.flops import MODEL_DEFAULTS, flops_per_token, run_flops

SMALL = {"vocab_size": 96, "d_model": 48, "n_layers": 3, "n_heads": 4}
CONFIGS = {
    "swiglu, tied": {},
    "gelu, untied, layernorm": {"ffn": "gelu", "tie_embeddings": False, "norm": "layernorm"},
    "relu, ffn_hidden": {"ffn": "relu", "ffn_hidden": 40},
    "gqa, qk_norm": {"n_kv_heads": 2, "qk_norm": True},
    "mqa, qk_norm, layernorm": {"n_kv_heads": 1, "qk_norm": True, "norm": "layernorm"},
    "nope": {"pos": "nope", "n_kv_heads": 2},
    "moe, shared, every 2nd layer": {
        "ffn": "moe",
        "moe_experts": 4,
        "moe_top_k": 2,
        "moe_shared_experts": 1,
        "moe_every": 2,
    },
    "moe, top 1, moe_hidden, untied": {"ffn": "moe", "moe_top_k": 1, "moe_hidden": 24, "tie_embeddings": False},
    "mla": {"attention": "mla"},
    "mla, q_lora, kv_lora, layernorm": {"attention": "mla", "q_lora_rank": 16, "kv_lora_rank": 20, "norm": "layernorm"},
    "mla, nope": {"attention": "mla", "pos": "nope"},
    "mla, qk_rope_dim, moe": {"attention": "mla", "qk_rope_dim": 4, "ffn": "moe", "moe_shared_experts": 2},
}


@pytest.mark.parametrize("name", CONFIGS)
def test_flops_per_token_equals_the_models_count(name):
    cfg = ModelConfig(**SMALL, **CONFIGS[name])
    with torch.device("meta"):  # shapes only: no weights drawn
        expected = Transformer(cfg, max_seq_len=64).flops_per_token(64)
    config = {"model": dataclasses.asdict(cfg), "data": {"seq_len": 64}}  # as config.json holds it
    assert flops_per_token(config) == (expected, "")


def test_fields_an_older_config_lacks_take_todays_defaults():
    cfg = ModelConfig(**SMALL)
    with torch.device("meta"):
        expected = Transformer(cfg, max_seq_len=256).flops_per_token(256)
    assert flops_per_token({"model": dict(SMALL)}) == (expected, "")  # no data.seq_len: its default, 256
    defaults = dataclasses.asdict(ModelConfig())
    assert {k: defaults[k] for k in MODEL_DEFAULTS} == MODEL_DEFAULTS  # the copy of the defaults is today's


def test_a_config_it_cannot_count_says_why():
    assert flops_per_token({"model": {**SMALL, "ffn": "mamba"}}) == (
        None,
        "model.ffn='mamba': not counted without torch (known: swiglu, gelu, relu, moe)",
    )
    assert flops_per_token({"data": {}}) == (None, "config.json has no model section")
    assert flops_per_token({"model": {**SMALL, "d_model": 48.5}}) == (None, "d_model: not a whole number")


def test_run_flops_prefers_the_recorded_figure():
    config = {"model": dict(SMALL), "data": {"seq_len": 64}}
    per_token = flops_per_token(config)[0]
    assert run_flops(config, {"tokens": 1000}) == (per_token * 1000, "")
    assert run_flops(config, {"tokens": 1000, "flops": 7.0}) == (7.0, "")  # summary.json's own count wins
    assert run_flops(config, None) == (None, "summary.json records no tokens")
