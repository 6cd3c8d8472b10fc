"""model.parametrization: μP and CompleteP against the standard parametrization.

At the base sizes every multiplier is exactly 1, so "mup" and "completep" train bit for bit as "sp" (tied and untied
heads, GQA, MLA, experts, AdamW and Muon). Away from them: the hidden matrices' init and lr follow their fan-in, the
logits and attention scores their multipliers, the residual branches 1/depth; bad base sizes and an optimizer that
declares no width rule are refused before any compute. The coordinate check (scripts/check_transfer.py) finds the
logits' size flat across width under μP and growing under SP. The training paths (lone and resumed, stacked, two
gloo processes, compiled) are in the slow tests at the end.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys

import pytest
import torch
from conftest import REPO, TINY, run_cli
from test_moe import by_step, read_metrics, straight_and_resumed

from ablate import register_optimizer
from ablate.components import parametrization, registry
from ablate.config import ConfigError, ModelConfig, OptimConfig
from ablate.model import Transformer
from ablate.optim import build_optimizer

SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4)
ARCHITECTURES = {
    "tied": {},
    "untied": {"tie_embeddings": False},
    "gqa_qknorm": {"n_kv_heads": 2, "qk_norm": True},
    "mla": {"attention": "mla", "q_lora_rank": 16},
    "moe": {"ffn": "moe", "moe_experts": 4, "moe_top_k": 2},
}


def _trained(cfg: ModelConfig, optim: OptimConfig, steps: int = 3) -> tuple[Transformer, list[float]]:
    """The model after `steps` steps on fixed random tokens, and its losses (float64 of each step's fp32 loss)."""
    model = Transformer(cfg, 16)
    model.init_weights(torch.Generator().manual_seed(1))
    optimizer = build_optimizer(model, optim, model.base_shapes())
    tokens = torch.randint(0, cfg.vocab_size, (steps, 4, 17), generator=torch.Generator().manual_seed(2))
    losses = []
    for batch in tokens:
        loss, _ = model.loss(batch[:, :-1].contiguous(), batch[:, 1:].contiguous())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_at_the_base_sizes_mup_and_completep_are_sp_bit_for_bit(architecture, optimizer):
    sp = dataclasses.replace(SMALL, **ARCHITECTURES[architecture])
    optim = OptimConfig(name=optimizer)
    want_model, want = _trained(sp, optim)
    for scaled in (
        dataclasses.replace(sp, parametrization="mup", base_width=sp.d_model),
        dataclasses.replace(sp, parametrization="completep", base_width=sp.d_model, base_depth=sp.n_layers),
    ):
        got_model, got = _trained(scaled, optim)
        assert got == want, scaled.parametrization
        for (name, a), b in zip(want_model.state_dict().items(), got_model.state_dict().values()):
            assert torch.equal(a, b), (scaled.parametrization, name)


def test_away_from_the_base_the_hidden_init_and_lr_follow_the_fan_in():
    wide = dataclasses.replace(SMALL, d_model=128, parametrization="mup", base_width=32, tie_embeddings=False)
    sp = dataclasses.replace(wide, parametrization="sp")
    scaled, standard = Transformer(wide, 16), Transformer(sp, 16)
    for model in (scaled, standard):
        model.init_weights(torch.Generator().manual_seed(0))
    q, down = "layers.0.attn.q_proj.weight", "layers.0.ffn.down_proj.weight"
    base = scaled.base_shapes()
    assert base[q] == (32, 32) and base[down] == (32, 96)  # SwiGLU's hidden width: 8/3 d_model rounded up to 32
    ratio = {q: 128 / 32, down: 352 / 96}
    for name in (q, down):  # the same draws, scaled by 1/sqrt(fan-in ratio)
        got, want = scaled.get_parameter(name), standard.get_parameter(name)
        torch.testing.assert_close(got, want / math.sqrt(ratio[name]), rtol=1e-6, atol=0)
    for name in ("embed.weight", "lm_head.weight", "layers.0.attn_norm.weight"):  # as configured
        assert torch.equal(scaled.get_parameter(name), standard.get_parameter(name)), name

    groups = build_optimizer(scaled, OptimConfig(hidden_lr_scale=0.5), base).param_groups
    by_role = {(g["role"], round(g["lr_scale"], 9)) for g in groups}
    assert by_role == {
        ("embedding", 1.0),
        ("head", 1.0),
        ("vector", 1.0),
        ("hidden", round(0.5 / 4, 9)),  # fan-in d_model: 4x the base's; optim.hidden_lr_scale still applies
        ("hidden", round(0.5 * 96 / 352, 9)),  # down_proj's fan-in is the FFN's width
    }
    muon = build_optimizer(scaled, OptimConfig(name="muon"), base).param_groups
    square = next(g for g in muon if g["role"] == "hidden" and scaled.get_parameter(q) in g["params"])
    assert square["lr_scale"] == pytest.approx(0.5)  # spectral rule with Moonlight's update scale: 1/sqrt(4)


def test_the_forward_multipliers():
    cfg = dataclasses.replace(SMALL, d_model=128, parametrization="mup", base_width=32)
    model = Transformer(cfg, 16)
    assert model.logit_multiplier == 0.25
    assert model.layers[0].attn.scale == pytest.approx(math.sqrt(8) / 32)  # heads 8 wide at the base, 32 here
    assert model.layers[0].residual == 1.0
    mla = Transformer(dataclasses.replace(cfg, attention="mla"), 16)
    assert mla.layers[0].attn.scale == pytest.approx(math.sqrt(8 + 4) / (32 + 16))  # head + RoPE part
    deep = dataclasses.replace(cfg, n_layers=8, parametrization="completep", base_depth=2)
    block = Transformer(deep, 16).layers[0]
    assert block.residual == 0.25
    assert block.attn.out_init_std == pytest.approx(0.02 / math.sqrt(2 * 2))  # drawn for the base depth

    # the logits multiplier reaches every path: forward, the training loss, validation's per-token loss
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(model.loss(inputs, targets)[1], want)
    torch.testing.assert_close(model.per_token_loss(inputs, targets).mean(), want)
    # with the attention scale put back to SDPA's, the logits are the same weights' sp logits x 1/4, bit for bit
    standard = Transformer(dataclasses.replace(cfg, parametrization="sp"), 16)
    standard.load_state_dict(model.state_dict())
    for layer in model.layers:
        layer.attn.scale = None
    assert torch.equal(model(inputs), standard(inputs) * 0.25)


BAD = [
    ({"parametrization": "mup"}, r"model.base_width: 0 under model.parametrization='mup'; allowed: a positive"),
    ({"parametrization": "mup", "base_width": 30}, r"model.base_width: 30 is not a multiple of model.n_heads=4"),
    (
        {"parametrization": "completep", "base_width": 32},
        r"model.base_depth: 0 under model.parametrization='completep'; allowed: a positive n_layers",
    ),
]


@pytest.mark.parametrize("fields, says", BAD)
def test_bad_base_sizes_are_refused_before_compute(tmp_path, fields, says):
    from ablate.setup.checks import check_run
    from ablate.setup.experiment import load_experiment
    from ablate.setup.overrides import apply_overrides

    run = load_experiment(TINY, only=["mha"])[0]
    run = apply_overrides(run, {f"model.{k}": v for k, v in fields.items()})
    with pytest.raises(ConfigError, match=says):
        check_run(run, 1)
    with pytest.raises(ConfigError, match=says):  # and by the model, should it be built without the checks
        Transformer(run.model, 8)


def test_an_optimizer_that_declares_no_width_rule_is_refused_under_mup():
    from ablate.setup.checks import check_run
    from ablate.setup.experiment import load_experiment
    from ablate.setup.overrides import apply_overrides

    @register_optimizer("plain_sgd_for_mup_test")
    class PlainSGD(torch.optim.SGD):
        def __init__(self, groups, cfg):
            super().__init__(groups, lr=cfg.lr)

        state_elements = staticmethod(lambda shapes, world: 0)
        transient_elements = staticmethod(lambda shapes, world: 0)

    try:
        run = load_experiment(TINY, only=["mha"])[0]
        run = apply_overrides(run, {"optim.name": "plain_sgd_for_mup_test"})
        check_run(run, 1)  # fine under sp
        mup = apply_overrides(run, {"model.parametrization": "mup", "model.base_width": 16})
        with pytest.raises(
            ConfigError, match=r"optim.name: 'plain_sgd_for_mup_test' \(.*PlainSGD in .*\) declares no "
        ):
            check_run(mup, 1)
    finally:
        registry.unregister("optimizer", "plain_sgd_for_mup_test")


def test_sp_ignores_the_base_sizes_and_keeps_every_old_identity():
    """A grid may sweep the parametrization beside fixed base sizes: under sp they change no number."""
    cfg = dataclasses.replace(SMALL, base_width=16, base_depth=1)
    assert parametrization.width_multiplier(cfg) == parametrization.depth_multiplier(cfg) == 1.0
    _, with_base = _trained(cfg, OptimConfig())
    _, without = _trained(SMALL, OptimConfig())
    assert with_base == without
    assert "parametrization" not in SMALL.identity_fields() and "base_width" not in SMALL.identity_fields()
    assert "parametrization" in dataclasses.replace(SMALL, parametrization="mup", base_width=32).identity_fields()


def _check_transfer():
    spec = importlib.util.spec_from_file_location("check_transfer", REPO / "scripts" / "check_transfer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_transfer"] = module  # its dataclass resolves annotations through the module
    spec.loader.exec_module(module)
    return module


def test_the_coordinate_check_is_flat_under_mup_and_grows_under_sp():
    """Widths 16 to 128 (8x), 4 Adam steps at lr 0.01: the logits' RMS slope against width (log2-log2)."""
    check = _check_transfer()
    run_model = dataclasses.replace(SMALL, vocab_size=64, n_layers=2)
    from ablate.config import DataConfig, RunConfig

    run = RunConfig(model=run_model, data=DataConfig(seq_len=16), optim=OptimConfig(lr=0.01))
    batches = check.random_batches(64, 4, 16, 4)
    result = check.check(run, batches, [16, 32, 64, 128], ["sp", "mup"], lr=0.01)
    sp, mup = result.slope("sp", "logits"), result.slope("mup", "logits")
    print(f"logits RMS slope on width: sp {sp:+.2f}, mup {mup:+.2f}")
    assert sp > 0.5
    assert abs(mup) < 0.3
    assert result.slope("sp", "layer1") > 1.0 and abs(result.slope("mup", "layer1")) < 0.3
    assert result.rms["sp"]["logits"][0][0] == result.rms["mup"]["logits"][0][0]  # width 16 is the base: the same


# -- every training path ------------------------------------------------------------------------------------------

MUP = ["--set", "model.parametrization=mup", "--set", "model.base_width=16", "--set", "optim.lr=0.01"]


@pytest.mark.slow
def test_a_mup_run_resumes_bit_exact_and_records_its_parametrization(tmp_path):
    a, b = straight_and_resumed(tmp_path, MUP)
    for key in ("loss", "val/loss", "grad_norm"):
        assert by_step(a, key) == by_step(b, key), key
    config = json.loads((tmp_path / "straight" / "tiny" / "mha" / "seed0" / "config.json").read_text())["config"]
    assert config["model"]["parametrization"] == "mup" and config["model"]["base_width"] == 16
    sp = tmp_path / "sp"
    run_cli("run", str(TINY), "--only", "mha", "--set", "train.max_steps=8", "--set", "optim.lr=0.01", "--out", str(sp))
    assert by_step(read_metrics(sp / "tiny" / "mha" / "seed0"), "loss") != by_step(a, "loss")  # the scaling acts


@pytest.mark.slow
def test_two_gloo_processes_match_one_under_mup(tmp_path):
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=6", *MUP]
    run_cli(*args, "--out", str(tmp_path / "one"))
    run_cli(*args, "--out", str(tmp_path / "two"), torchrun_procs=2)
    one, two = (by_step(read_metrics(tmp_path / o / "tiny" / "mha" / "seed0"), "loss") for o in ("one", "two"))
    assert sorted(one) == sorted(two) == list(range(1, 7))
    worst = max(abs(one[s] - two[s]) / one[s] for s in one)
    print(f"mup: largest relative loss difference, 2 gloo ranks vs 1 process: {worst:.2e}")
    assert worst < 1e-5


@pytest.mark.slow
def test_a_mup_stack_equals_its_lone_runs(tmp_path):
    """(The compiled path: test_single_device's one-graph test runs completep among its knobs.)"""
    from test_stack_equality import _assert_members_equal_lone_runs, _lone_and_stacked

    fields = {"model.parametrization": "mup", "model.base_width": 16, "optim.lr": 0.01}
    lone, members = _lone_and_stacked(tmp_path, fields)
    _assert_members_equal_lone_runs(lone, members, exact=False)


def test_the_example_sweeps_both_parametrizations_at_four_widths():
    from ablate.setup.experiment import load_experiment

    runs = load_experiment(REPO / "experiments" / "mup_transfer.py")
    cells = {(r.model.parametrization, r.model.d_model, r.optim.lr) for r in runs}
    assert len(cells) == 2 * 4 * 7 and len(runs) == 2 * len(cells)  # two seeds each
    assert {r.model.base_width for r in runs} == {32}
    lrs = sorted({r.optim.lr for r in runs})
    assert all(b / a == pytest.approx(2) for a, b in zip(lrs, lrs[1:]))


def test_a_score_mod_takes_the_parametrizations_attention_scale():
    """The written-out scores of modified_attention (a score_mod's path off CUDA) use μP's scale as SDPA does."""
    from ablate.model import modified_attention

    q, k, v = torch.randn(3, 2, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    got = modified_attention(q, k, v, lambda score, b, h, q_idx, kv_idx: score, scale=0.05)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.05)
    torch.testing.assert_close(got, want)
    default = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(got, default)
