"""Export is an allow-list: every ModelConfig field is mapped, must be at its default, or training-only (a new field
in none fails here), a non-default must-be-default field is refused by name, and a user's component is refused by
name (exit 2 from `ablate export`, nothing written) unless it declares its transformers mapping (hf_mapping), which
export then checks against the shipped component's logits before writing anything."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from torch import nn

from ablate.components import registry
from ablate.config import ModelConfig, RunConfig
from ablate.eval.export import MAPPED, MUST_BE_DEFAULT, TRAINING_ONLY, check_exportable, write_model
from ablate.model import FeedForward, Transformer
from conftest import cli_in_process

VOCAB, SEQ = 128, 16
BASE = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, init_std=0.1)
REFUSED = "^cannot export to transformers: "


def test_every_field_is_classified_exactly_once():
    fields = [f.name for f in dataclasses.fields(ModelConfig)]
    tables = {"MAPPED": MAPPED, "MUST_BE_DEFAULT": MUST_BE_DEFAULT, "TRAINING_ONLY": TRAINING_ONLY}
    unclassified = [name for name in fields if not any(name in table for table in tables.values())]
    assert not unclassified, (
        f"classify each in eval/export.py (MAPPED, MUST_BE_DEFAULT or TRAINING_ONLY): {unclassified}"
    )
    twice = {name: [t for t, table in tables.items() if name in table] for name in fields}
    assert {name: where for name, where in twice.items() if len(where) > 1} == {}
    stale = sorted(set().union(*tables.values()) - set(fields))
    assert not stale, f"classified in eval/export.py but no ModelConfig field: {stale}"


MUST_BE_DEFAULT_CASES = [  # (knobs beyond BASE, what the message says)
    ({"score_mod": "softcap", "options": {"softcap": 30.0}}, r"model.score_mod='softcap': .*soft cap.*score_mod=''$"),
    ({"score_mod": "alibi", "pos": "nope"}, r"model.pos='nope': .*always apply RoPE; export needs model.pos='rope'$"),
    ({"score_mod": "sliding_window"}, r"model.score_mod='sliding_window': .*export needs model.score_mod=''$"),
    ({"options": {"softcap": 30.0}}, r"model.options=\{'softcap': 30.0\}: component options .*model.options=\{\}$"),
    ({"rope_fraction": 0.5}, r"model.rope_fraction=0.5: partial RoPE .*model.rope_fraction=1.0$"),
    ({"rope_skip_every": 2}, r"model.rope_skip_every=2: .*model.rope_skip_every=0$"),
    ({"ffn": "moe", "moe_capacity": 1.25}, r"model.moe_capacity=1.25: .*export needs model.moe_capacity=0$"),
    ({"ffn": "gelu"}, r"model.ffn='gelu': .*gated SiLU FFNs only; export needs model.ffn='swiglu' or 'moe'$"),
    ({"norm": "layernorm"}, r"model.norm='layernorm': .*use RMSNorm; export needs model.norm='rmsnorm'$"),
    (
        {"parametrization": "mup", "base_width": 32},
        r"model.parametrization='mup': its forward's multipliers .* not folded .*parametrization='sp'$",
    ),
]


@pytest.mark.parametrize("knobs, says", MUST_BE_DEFAULT_CASES)
def test_a_field_no_class_represents_is_refused_by_name(knobs, says):
    with pytest.raises(NotImplementedError, match=REFUSED + says):
        check_exportable(ModelConfig(**{**BASE, **knobs}))


def test_each_must_be_default_field_is_checked():
    """Every MUST_BE_DEFAULT field with another value than its default is refused, naming it."""
    other = {"pos": "nope", "rope_skip_every": 2, "rope_fraction": 0.5, "moe_capacity": 2.0}
    other |= {"score_mod": "softcap", "options": {"softcap": 30.0}}
    other |= {"parametrization": "mup", "base_width": 32, "base_depth": 2}  # (check_exportable reads the fields)
    assert set(other) == set(MUST_BE_DEFAULT)
    for name, value in other.items():
        with pytest.raises(NotImplementedError, match=f"{REFUSED}model.{name}="):
            check_exportable(ModelConfig(**{**BASE, "ffn": "moe", name: value}))


def test_an_unclassified_field_is_refused_unless_at_its_default(monkeypatch):
    """A field no table names (as a new one would be) exports only at its default."""
    monkeypatch.delitem(MAPPED, "rope_base")
    assert check_exportable(ModelConfig(**BASE)) == "Llama"
    with pytest.raises(NotImplementedError, match=f"{REFUSED}model.rope_base=500.0: a field export does not know"):
        check_exportable(ModelConfig(**BASE, rope_base=500.0))


def test_what_exported_before_exports_the_same():
    """Training-only fields change nothing; the mapped ones still choose the class."""
    training = dict(init_std=0.5, z_loss=1e-4, dropout=0.1, kernels="torch", moe_aux_loss=0.1, moe_z_loss=1e-3)
    assert check_exportable(ModelConfig(**{**BASE, **training, "ffn": "moe", "moe_bias_rate": 0.1})) == "Mixtral"
    assert check_exportable(ModelConfig(**BASE, qk_norm=True, rope_base=500.0)) == "Qwen3"


# ---------------------------------------------------------------------------------------------------------------
# user components


class SquaredReLU(nn.Module):
    """A user FFN (So et al. 2021's relu(x W1)^2 W2) that no transformers class computes."""

    def __init__(self, config, layer_index):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)).square())


class OwnSwiGLU(FeedForward):
    """A user FFN that is SwiGLU (the shipped one's parameters and math) and says so."""

    hf_mapping = "swiglu"

    def __init__(self, config, layer_index):
        super().__init__(dataclasses.replace(config, ffn="swiglu", ffn_hidden=config.ffn_dim), layer_index)


class SquaredReLUClaimingSwiGLU(SquaredReLU):
    hf_mapping = "swiglu"


class ScaledSwiGLUClaimingSwiGLU(OwnSwiGLU):
    """SwiGLU's weights, twice its output: a false claim the weights alone do not show."""

    def forward(self, x):
        return 2 * super().forward(x)


class SquaredReLUClaimingGeLU(SquaredReLU):
    hf_mapping = "gelu"


@pytest.fixture
def register():
    """register(name, cls): a user FFN for this test, unregistered after it."""
    names = []

    def add(name, cls):
        names.append(name)
        return registry.register("ffn", name, cls)

    yield add
    for name in names:
        registry.unregister("ffn", name)


def skeleton_run(root, model: ModelConfig, **fields):
    """A run folder with the config.json `model` gives and an (empty) checkpoint: what export reads before it
    refuses, with no training."""
    run_dir = root / "run"
    (run_dir / "checkpoints" / "step_1").mkdir(parents=True)
    run = RunConfig(model=model, **fields)
    (run_dir / "config.json").write_text(json.dumps({"config": run.to_dict()}))
    return run_dir


def test_user_component_is_refused_by_name(register):
    entry = register("relu2_for_export_test", SquaredReLU)
    assert not entry.builtin
    says = (
        rf"model.ffn='relu2_for_export_test' is a user component \(SquaredReLU in {re.escape(entry.file)}\) "
        r"that declares no transformers mapping; export needs a shipped ffn it writes \('swiglu' or 'moe'\), "
        r"or on the class `hf_mapping = NAME`"
    )
    with pytest.raises(NotImplementedError, match=REFUSED + says):
        check_exportable(ModelConfig(**BASE, ffn="relu2_for_export_test"))


def test_cli_refuses_a_user_component_by_name_writing_nothing(register, tmp_path):
    entry = register("relu2_for_export_test", SquaredReLU)
    run_dir = skeleton_run(tmp_path, ModelConfig(**BASE, ffn="relu2_for_export_test"))
    result = cli_in_process("export", run_dir, "--hf", tmp_path / "hf", check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "ablate: error: cannot export to transformers: model.ffn='relu2_for_export_test' is a user component "
        f"(SquaredReLU in {entry.file}) that declares no transformers mapping; export needs a shipped ffn it writes "
        "('swiglu' or 'moe'), or on the class `hf_mapping = NAME`, the shipped one it computes exactly"
    ]
    assert result.stdout == ""
    assert not (tmp_path / "hf").exists()


def test_cli_loads_the_recorded_experiment_file_and_refuses_its_component(tmp_path):
    """As a user runs it: the component is registered by the experiment file the run records, which export runs."""
    name = "relu2_for_export_file_test"
    experiment = tmp_path / "own.py"
    experiment.write_text(
        "import ablate\nfrom torch import nn\n\n\n"
        f"@ablate.register_component('ffn', {name!r})\n"
        "class FileReLU2(nn.Module):\n"
        "    def __init__(self, config, layer_index):\n"
        "        super().__init__()\n"
        "        self.up = nn.Linear(config.d_model, config.d_model, bias=False)\n\n"
        "    def forward(self, x):\n"
        "        return self.up(x).relu().square()\n"
    )
    model = ModelConfig(**BASE, ffn=name)
    run_dir = skeleton_run(tmp_path, model, user_code={f"ffn:{name}": "0" * 12}, experiment_file=str(experiment))
    try:
        result = cli_in_process("export", run_dir, "--hf", tmp_path / "hf", check=False)
    finally:
        registry.unregister("ffn", name)
    assert result.returncode == 2, result.stderr
    assert f"model.ffn='{name}' is a user component (FileReLU2 in {experiment}) that declares no" in result.stderr
    assert not (tmp_path / "hf").exists()
    experiment.unlink()  # gone: nothing registers it
    result = cli_in_process("export", run_dir, "--hf", tmp_path / "hf", check=False)
    assert result.returncode == 2, result.stderr
    assert f"model.ffn='{name}' is registered by no code in this process" in result.stderr
    assert not (tmp_path / "hf").exists()


def random_model(**knobs) -> Transformer:
    model = Transformer(ModelConfig(**{**BASE, **knobs}), max_seq_len=SEQ)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def test_a_declared_mapping_exports_as_the_shipped_component(register, tmp_path):
    from transformers import AutoModelForCausalLM

    register("swiglu_for_export_test", OwnSwiGLU)
    model = random_model(ffn="swiglu_for_export_test")
    assert model.cfg.ffn_dim == 4 * model.cfg.d_model  # not SwiGLU's default width: pinned as the run's
    assert check_exportable(model.cfg) == "Llama"
    assert write_model(model, SEQ, 0, tmp_path / "hf") == ["config.json", "generation_config.json", "model.safetensors"]
    hf, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32, output_loading_info=True)
    assert type(hf).__name__ == "LlamaForCausalLM" and not any(info.values()), info
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf.eval()(input_ids=tokens).logits, model(tokens), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "cls, says",
    [
        (SquaredReLUClaimingSwiGLU, r"with hf_mapping: not the shipped component's weights: Missing key"),
        (ScaledSwiGLUClaimingSwiGLU, r"with hf_mapping: computes something else than the shipped component"),
    ],
)
def test_a_false_declaration_is_refused_writing_nothing(register, tmp_path, cls, says):
    entry = register("claims_swiglu_for_export_test", cls)
    model = random_model(ffn="claims_swiglu_for_export_test")
    assert check_exportable(model.cfg) == "Llama"  # the config alone cannot tell
    who = rf"model.ffn='claims_swiglu_for_export_test' \({cls.__name__} in {re.escape(entry.file)}\) "
    with pytest.raises(NotImplementedError, match=REFUSED + who + says):
        write_model(model, SEQ, 0, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_mapping_to_a_component_export_does_not_write_is_refused(register):
    register("claims_gelu_for_export_test", SquaredReLUClaimingGeLU)
    with pytest.raises(NotImplementedError, match=r"with hf_mapping='gelu'; allowed: 'swiglu' or 'moe'$"):
        check_exportable(ModelConfig(**BASE, ffn="claims_gelu_for_export_test"))
