import pytest
import torch

from ablate.config import ModelConfig, ScheduleConfig
from ablate.model import Transformer
from ablate.optim import build_optimizer, lr_factor, param_groups
from ablate.config import OptimConfig


def test_no_weight_decay_on_embeddings_norms():
    for tie in (True, False):
        model = Transformer(ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, tie_embeddings=tie), 8)
        decay, no_decay = param_groups(model, 0.1)
        decay_ids = {id(p) for p in decay["params"]}
        assert id(model.embed.weight) not in decay_ids
        assert all(id(m.weight) not in decay_ids for m in model.modules() if isinstance(m, torch.nn.RMSNorm))
        assert id(model.layers[0].attn.q_proj.weight) in decay_ids
        assert (id(model.lm_head.weight) in decay_ids) == (not tie)
        total = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
        assert total == model.num_params()
    with pytest.raises(NotImplementedError, match="only 'adamw'"):
        build_optimizer(model, OptimConfig(name="muon"))  # type: ignore[arg-type]


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
