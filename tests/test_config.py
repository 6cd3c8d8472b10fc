import dataclasses

import pytest

from ablate.config import ConfigError, ModelConfig, RunConfig, TrainConfig, validate
from ablate.setup.overrides import apply_overrides, parse_set_args
from ablate.setup.variants import grid, variant


def test_defaults_validate():
    assert validate(RunConfig()) is not None


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        ({"model.n_heads": 3}, "model.n_heads", "a divisor of 128"),
        ({"model.n_kv_heads": 3}, "model.n_kv_heads", "[1, 2, 4]"),
        ({"model.n_layers": "4"}, "model.n_layers", "int"),
        ({"train.global_batch": 12}, "train.global_batch", "multiple of train.micro_batch"),
        ({"schedule.name": "linear"}, "schedule.name", "'cosine', 'wsd', 'constant'"),
        ({"model.rope_fraction": 0.01}, "model.rope_fraction", "(0, 1]"),
        ({"train.seed": 2**70}, "train.seed", "[0, 4294967296)"),
        ({"train.seed": -1}, "train.seed", "[0, 4294967296)"),
        ({"name": "report.json"}, "name", "any other name"),
    ],
)
def test_bad_values_name_field_and_allowed(overrides, field, allowed):
    with pytest.raises(ConfigError) as err:
        apply_overrides(RunConfig(), overrides)
    assert field in str(err.value) and allowed in str(err.value)


def test_unknown_field_lists_allowed():
    with pytest.raises(ConfigError, match=r"model.n_layer: unknown field; allowed: .*'n_layers'"):
        apply_overrides(RunConfig(), {"model.n_layer": 2})
    with pytest.raises(ConfigError, match="section one of"):
        apply_overrides(RunConfig(), {"modle.n_layers": 2})


def test_text_overrides_are_typed():
    run = apply_overrides(
        RunConfig(),
        parse_set_args(
            [
                "train.max_steps=20",
                "model.qk_norm=true",
                "model.n_kv_heads=none",
                "optim.lr=1e-3",
                "data.source=a.jsonl",
            ]
        ),
        from_text=True,
    )
    assert run.train.max_steps == 20 and run.model.qk_norm is True and run.model.n_kv_heads is None
    assert run.optim.lr == 1e-3 and run.data.source == "a.jsonl"
    with pytest.raises(ConfigError, match="train.max_steps: cannot read 'ten'; allowed: int"):
        apply_overrides(RunConfig(), {"train.max_steps": "ten"}, from_text=True)
    with pytest.raises(ConfigError, match="expected section.field=value"):
        parse_set_args(["train.max_steps"])


def test_variant_and_grid():
    base = RunConfig()
    gqa = variant(base, "gqa", {"model.n_kv_heads": 2})
    assert gqa.name == "gqa" and gqa.model.kv_heads == 2 and base.model.n_kv_heads is None
    runs = grid(base, {"optim.lr": [1e-3, 3e-3], "train.global_batch": [16, 32]})
    assert [r.name for r in runs] == [
        "lr=0.001,global_batch=16",
        "lr=0.001,global_batch=32",
        "lr=0.003,global_batch=16",
        "lr=0.003,global_batch=32",
    ]
    assert runs[3].optim.lr == 3e-3 and runs[3].train.global_batch == 32


def test_identity_ignores_names_and_bookkeeping_but_not_numbers():
    base = RunConfig()
    assert base.identity() == variant(base, "other").identity()
    assert base.identity() == apply_overrides(base, {"train.log_every": 3}).identity()
    assert base.identity() != apply_overrides(base, {"optim.lr": 1e-4}).identity()
    assert base.identity() != apply_overrides(base, {"train.seed": 1}).identity()


def test_from_dict_round_trip_and_errors():
    run = variant(RunConfig(), "x", {"model.qk_norm": True})
    assert RunConfig.from_dict(run.to_dict()) == run
    bad = run.to_dict()
    bad["model"]["heads"] = 4
    with pytest.raises(ConfigError, match="model.heads: unknown field"):
        RunConfig.from_dict(bad)


def test_section_type_checked():
    with pytest.raises(ConfigError, match="model: expected ModelConfig"):
        validate(dataclasses.replace(RunConfig(), model=TrainConfig()))
    assert ModelConfig(ffn="swiglu", d_model=128).ffn_dim == 352  # 8/3 * 128 = 341 -> multiple of 32


def test_reserved_names_are_the_files_the_report_writes(tmp_path):
    """A variant folder named like a report file would collide with it in runs/<experiment>/."""
    from report_fixtures import build_toy_experiment

    from ablate.config import REPORT_FILES
    from ablate.report import write_report

    root = build_toy_experiment(tmp_path)
    before = {p.name for p in root.iterdir()}
    write_report(root)
    assert {p.name for p in root.iterdir()} - before == set(REPORT_FILES)
