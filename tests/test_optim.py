import dataclasses
import json
import math

import pytest
import torch

from ablate.components import registry
from torch import nn

from ablate import optim
from ablate.config import ConfigError, ModelConfig, OptimConfig, RunConfig, ScheduleConfig
from ablate.model import Transformer
from ablate.optim import ROLES, RoleError, assign_roles, build_optimizer, lr_factor, param_groups, set_lr
from ablate.optim.muon import newton_schulz, update_scale
from ablate.setup.checks import check_registered_names
from ablate.setup.experiment import ExperimentError, load_experiment
from ablate.training import checkpoint
from ablate.training.callbacks import whole
from ablate.training.parallel import init_distributed, parallelize
from conftest import TINY, run_cli

TINY_MODEL = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2)


def tiny_model(seed: int = 0, **changes) -> Transformer:
    model = Transformer(ModelConfig(**{**TINY_MODEL, **changes}), 8)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


def tokens(seed: int, batch: int = 4, seq: int = 8) -> torch.Tensor:
    return torch.randint(0, TINY_MODEL["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(seed))


def train_steps(model, optimizer, batches) -> list[float]:
    losses = []
    for batch in batches:
        loss, _ = model.loss(batch[:, :-1], batch[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


# -- the role table ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("norm, qk_norm", [("rmsnorm", False), ("layernorm", True)])
def test_every_parameter_has_exactly_one_role(tie, norm, qk_norm):
    model = tiny_model(tie_embeddings=tie, norm=norm, qk_norm=qk_norm)
    roles = assign_roles(model)
    assert list(roles) == [name for name, _ in model.named_parameters()]  # each once, a tied weight too
    assert roles["embed.weight"] == "embedding" and roles["layers.1.ffn.gate_proj.weight"] == "hidden"
    assert ("lm_head.weight" in roles) == (not tie) and roles.get("lm_head.weight", "head") == "head"
    assert sum(r == "hidden" for r in roles.values()) == 2 * 7  # q, k, v, o, up, gate, down per layer
    norms = 2 * 2 + 1 + (2 * 2 if qk_norm else 0)
    assert sum(r == "vector" for r in roles.values()) == norms * (2 if norm == "layernorm" else 1)  # + biases
    groups = param_groups(model, OptimConfig(weight_decay=0.1))
    assert [g["role"] for g in groups] == ["embedding", "hidden", "vector"] + ([] if tie else ["head"])
    assert {g["role"]: g["weight_decay"] for g in groups} == {
        "embedding": 0.0,
        "hidden": 0.1,
        "vector": 0.0,
        **({} if tie else {"head": 0.1}),
    }
    assert sum(p.numel() for g in groups for p in g["params"]) == model.num_params()


def test_a_parameter_without_a_role_is_refused_by_name():
    model = tiny_model()
    model.layers[0].attn.register_parameter("mixing", nn.Parameter(torch.zeros(2, 3, 4)))  # 3-D: no rule takes it
    with pytest.raises(RoleError, match=r"layers\.0\.attn\.mixing \(shape \(2, 3, 4\), in Attention\) has no role"):
        assign_roles(model)
    with pytest.raises(RoleError, match="mixing"):
        build_optimizer(model, OptimConfig())
    model = tiny_model()
    model.norm.register_parameter("table", nn.Parameter(torch.zeros(4, 4)))  # 2-D, but not in an nn.Linear
    with pytest.raises(RoleError, match=r"norm\.table .* has no role"):
        assign_roles(model)


def test_role_table_names_its_config_fields():
    assert [r.name for r in ROLES] == ["embedding", "hidden", "expert", "vector", "head"]
    assert all(hasattr(OptimConfig(), r.lr_scale) for r in ROLES)
    assert {r.name for r in ROLES if r.weight_decay} == {"hidden", "expert", "head"}


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_lr_multipliers_reach_the_groups_through_set_lr(name):
    cfg = OptimConfig(name=name, embedding_lr_scale=2.0, hidden_lr_scale=0.5, vector_lr_scale=3.0, head_lr_scale=0.0)
    optimizer = build_optimizer(tiny_model(tie_embeddings=False), cfg)
    set_lr(optimizer, 0.01)
    assert {g["role"]: g["lr"] for g in optimizer.param_groups} == pytest.approx(
        {"embedding": 0.02, "hidden": 0.005, "vector": 0.03, "head": 0.0}
    )


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_a_zero_multiplier_freezes_its_role(name):
    model = tiny_model(tie_embeddings=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = build_optimizer(model, OptimConfig(name=name, weight_decay=0.1, head_lr_scale=0.0))
    set_lr(optimizer, 0.01)
    train_steps(model, optimizer, [tokens(0, seq=9)])
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert "lm_head.weight" not in moved and {"embed.weight", "layers.0.attn.q_proj.weight", "norm.weight"} <= moved


# -- the registry ----------------------------------------------------------------------------------------------------


def test_unknown_optimizer_name_is_refused_where_runs_load(tmp_path):
    message = "optim.name: 'lion' unknown; allowed: adamw, muon"
    with pytest.raises(ConfigError, match=message):
        build_optimizer(tiny_model(), OptimConfig(name="lion"))
    with pytest.raises(ConfigError, match=message):
        check_registered_names(RunConfig(optim=OptimConfig(name="lion")))
    with pytest.raises(ExperimentError, match=f"variant 'mha': {message}"):
        load_experiment(TINY, only=["mha"], overrides={"optim.name": "lion"})


def test_a_registered_optimizer_is_built_by_name():
    @optim.register("sgd_for_test")
    class SGD(torch.optim.SGD):
        def __init__(self, groups, cfg):
            super().__init__(groups, lr=cfg.lr)

        state_elements = transient_elements = staticmethod(lambda shapes, world: 0)

    try:
        optimizer = build_optimizer(tiny_model(), OptimConfig(name="sgd_for_test"))
        assert isinstance(optimizer, SGD) and [g["role"] for g in optimizer.param_groups][0] == "embedding"
        assert optim.register("sgd_for_test")(SGD) is SGD  # the same class again (a file executed twice): nothing

        class Other(SGD):
            pass

        with pytest.raises(registry.RegistryError, match=r"registered twice: .*SGD in .*test_optim.py.*Other in"):
            optim.register("sgd_for_test")(Other)
    finally:
        registry.unregister("optimizer", "sgd_for_test")


def test_an_optimizer_without_its_memory_declarations_is_refused_where_runs_are_checked():
    @optim.register("silent_for_test")
    class Silent(torch.optim.SGD):
        def __init__(self, groups, cfg):
            super().__init__(groups, lr=cfg.lr)

    try:
        with pytest.raises(ConfigError, match="'silent_for_test' .*declares no state_elements and no transient"):
            check_registered_names(RunConfig(optim=OptimConfig(name="silent_for_test")))
    finally:
        registry.unregister("optimizer", "silent_for_test")


# -- Muon -----------------------------------------------------------------------------------------------------------


def matrix_with_spectrum(rows: int, cols: int, singular_values: torch.Tensor, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(rows, len(singular_values), generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, len(singular_values), generator=g, dtype=torch.float64))
    return (u * singular_values) @ v.T


@pytest.mark.parametrize("rows, cols", [(24, 40), (40, 24)])
def test_newton_schulz_puts_singular_values_in_a_band(rows, cols):
    """Singular values spread over two decades come out in [0.68, 1.2], where 5 steps of the quintic put any
    value above ~0.003 of the largest (ablate.optim.muon explains the coefficients), keeping the directions."""
    spread = torch.logspace(0, -2, min(rows, cols), dtype=torch.float64)
    matrix = matrix_with_spectrum(rows, cols, spread).float()
    out = newton_schulz(matrix, steps=5)
    assert out.shape == matrix.shape and out.dtype == torch.float32
    values = torch.linalg.svdvals(out)
    assert values.min() > 0.6 and values.max() < 1.25, values
    u, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    polar = u @ vh  # the exact orthogonalisation, which the iteration approximates
    cosine = (out * polar).sum() / (out.norm() * polar.norm())
    assert cosine > 0.95
    assert torch.allclose(newton_schulz(matrix.T, steps=5), out.T, atol=1e-6)  # tall and wide alike
    assert torch.linalg.svdvals(matrix).min() < 0.02  # the input was far from orthogonal


def test_muon_updates_hidden_matrices_at_adamw_scale_and_the_rest_as_adamw():
    """Fed the same gradients: embedding, vectors and head take the same steps as under torch's AdamW (bias
    correction over several steps included); a hidden matrix's first update has RMS about 0.2 x lr (the
    Newton-Schulz band around 1, times Moonlight's scale), whatever its shape."""
    muon_model, adamw_model = tiny_model(tie_embeddings=False), tiny_model(tie_embeddings=False)
    cfg = OptimConfig(lr=0.01, weight_decay=0.1)
    muon = build_optimizer(muon_model, dataclasses.replace(cfg, name="muon"))
    adamw = build_optimizer(adamw_model, cfg)
    first = {n: p.detach().clone() for n, p in muon_model.named_parameters()}
    roles = assign_roles(muon_model)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for p_muon, p_adamw in zip(muon_model.parameters(), adamw_model.parameters()):
            p_muon.grad = torch.randn(p_muon.shape, generator=g)
            p_adamw.grad = p_muon.grad.clone()
        muon.step()
        adamw.step()
        if step == 0:
            for name, param in muon_model.named_parameters():
                if roles[name] == "hidden":  # weight decay moves it ~2e-5 x lr: noise here
                    rms = (param - first[name]).pow(2).mean().sqrt() / cfg.lr
                    assert 0.14 < rms < 0.22, (name, rms)
    for (name, p_muon), p_adamw in zip(muon_model.named_parameters(), adamw_model.parameters()):
        if roles[name] == "hidden":
            assert not torch.allclose(p_muon, p_adamw, atol=1e-3), name
        else:  # only float rounding differs: the fused kernel against elementwise ops
            torch.testing.assert_close(p_muon, p_adamw, rtol=1e-6, atol=1e-7, msg=name)


def test_update_scale_is_moonlights_rule():
    assert update_scale(16, 64) == update_scale(64, 16) == pytest.approx(0.2 * 8)


def test_muon_reduces_the_loss_of_a_tiny_model():
    model = tiny_model()
    optimizer = build_optimizer(model, OptimConfig(name="muon", lr=0.02))
    batch = tokens(0, batch=8, seq=9)
    losses = train_steps(model, optimizer, [batch] * 30)
    assert losses[-1] < losses[0] / 2, losses  # memorising one batch: measured 3.92 -> 0.40
    assert all(math.isfinite(x) for x in losses)


# -- checkpoints (DCP, through the trainer's own save and load) ------------------------------------------------------


def model_and_muon(d, seed: int, cfg: OptimConfig):
    model = tiny_model(seed, tie_embeddings=False, qk_norm=True)
    parallelize(model, d, param_dtype=None, compile_model=False)
    return model, build_optimizer(model, cfg)


def test_muon_state_survives_a_dcp_checkpoint(tmp_path):
    """Save after two steps, load into a fresh model and optimizer (built with another weight decay), and the next
    step gives the same weights. The group settings stay the loading config's: a branch's changes win."""
    d = init_distributed("cpu")
    cfg = OptimConfig(name="muon", lr=0.01, weight_decay=0.1, head_lr_scale=0.5)
    model, optimizer = model_and_muon(d, 0, cfg)
    train_steps(model, optimizer, [tokens(1, seq=9), tokens(2, seq=9)])
    saved = checkpoint.save_checkpoint(tmp_path, 2, model, optimizer, {"tokens": 0, "sampler": {}}, d, keep=1)

    other, other_optimizer = model_and_muon(d, 1, dataclasses.replace(cfg, weight_decay=0.0))
    checkpoint.load_checkpoint(saved, other, other_optimizer, d)
    assert [(g["role"], g["lr_scale"], g["weight_decay"]) for g in other_optimizer.param_groups] == [
        ("embedding", 1.0, 0.0),
        ("hidden", 1.0, 0.0),
        ("vector", 1.0, 0.0),
        ("head", 0.5, 0.0),
    ]
    for p, q in zip(optimizer.param_groups[1]["params"], other_optimizer.param_groups[1]["params"]):
        assert torch.equal(
            whole(optimizer.state[p]["momentum_buffer"]),
            whole(other_optimizer.state[q]["momentum_buffer"]),
        )
    head = optimizer.param_groups[3]["params"][0]
    assert optimizer.state[head]["step"].item() == 2
    assert other_optimizer.state[other_optimizer.param_groups[3]["params"][0]]["step"].item() == 2

    for group in optimizer.param_groups:  # the same settings on both, to compare the next step
        group["weight_decay"] = 0.0
    train_steps(model, optimizer, [tokens(3, seq=9)])
    train_steps(other, other_optimizer, [tokens(3, seq=9)])
    for (name, p), q in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(whole(p), whole(q)), name


# -- one process and two equal ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_muon_two_gloo_processes_match_one(tmp_path):
    """Equal global batch (8): one process accumulates 2 micro-batches of 4, two processes take 4 each and each
    orthogonalises the whole gathered matrices. ffn_hidden=33 shards the up/gate matrices unevenly (17 + 16 rows).
    The gradients differ only in summation order, and Newton-Schulz keeps such differences at float32 rounding:
    measured 3.9e-8 relative at most over 10 steps. 1e-5 leaves a wide margin for other machines and thread
    counts, and still fails when each rank orthogonalises its own rows alone (measured: 7.4e-4)."""
    args = [
        "run",
        str(TINY),
        "--only",
        "mqa",
        "--set",
        "train.max_steps=10",
        "--set",
        "train.ckpt_every=5",
        "--set",
        "optim.name=muon",
        "--set",
        "model.ffn_hidden=33",
    ]
    run_cli(*args, "--out", str(tmp_path / "one"))
    run_cli(*args, "--out", str(tmp_path / "two"), torchrun_procs=2)
    one, two = (
        [json.loads(line) for line in (tmp_path / o / "tiny" / "mqa" / "seed0" / "metrics.jsonl").open()]
        for o in ("one", "two")
    )
    loss_one, loss_two = ({r["step"]: r["loss"] for r in rows if "loss" in r} for rows in (one, two))
    assert sorted(loss_two) == list(range(1, 11)) and sorted(loss_one) == sorted(loss_two)
    worst = max(abs(loss_one[s] - loss_two[s]) / loss_one[s] for s in loss_one)
    print(f"muon: largest relative loss difference, 2 gloo ranks vs 1 process, over 10 steps: {worst:.2e}")
    assert worst < 1e-5
    assert loss_one[10] < loss_one[1]  # it trains (slowly at this lr in 10 steps: ~6.24 -> ~6.19)
    val_one, val_two = ({r["step"]: r["val/loss"] for r in rows if "val/loss" in r} for rows in (one, two))
    assert sorted(val_one) == sorted(val_two) and max(abs(val_one[s] - val_two[s]) for s in val_one) < 1e-4


# -- schedules --------------------------------------------------------------------------------------------------------


def test_cosine_warmup_and_floor():
    cfg = ScheduleConfig(name="cosine", warmup=0.1, min_lr_ratio=0.1)
    values = [lr_factor(s, 100, cfg) for s in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(1.0) and values[55] == pytest.approx(0.55, abs=0.01)
    assert values[-1] == pytest.approx(0.1, abs=0.001)
    assert all(a >= b for a, b in zip(values[10:], values[11:]))


@pytest.mark.parametrize("shape, midpoint", [("linear", 0.55), ("cosine", 0.55), ("sqrt", 1 - 0.9 * 0.5**0.5)])
def test_wsd_stable_then_decay(shape, midpoint):
    cfg = ScheduleConfig(name="wsd", warmup=0.05, decay=0.2, decay_shape=shape, min_lr_ratio=0.1)
    assert lr_factor(2, 100, cfg) == pytest.approx(0.6)
    assert all(lr_factor(s, 100, cfg) == 1.0 for s in range(5, 80))
    assert lr_factor(90, 100, cfg) == pytest.approx(midpoint, abs=1e-6)
    assert lr_factor(100, 100, cfg) == pytest.approx(0.1)


def test_schedule_is_pure_function_of_progress():
    cfg = ScheduleConfig(name="wsd")
    # same share of the run, same factor: a run branched at any step recomputes its lr from (step, total)
    assert lr_factor(850, 1000, cfg) == pytest.approx(lr_factor(85, 100, cfg))


@pytest.mark.parametrize("total", [7, 100, 125, 250, 1000])
@pytest.mark.parametrize("name", ["cosine", "wsd", "constant"])
def test_lr_never_exceeds_peak_and_reaches_it(total, name):
    for warmup in (0.0, 0.02, 0.05, 0.1):
        cfg = ScheduleConfig(name=name, warmup=warmup)
        values = [lr_factor(s, total, cfg) for s in range(total)]
        assert max(values) == pytest.approx(1.0) and all(v <= 1.0 + 1e-12 for v in values)
