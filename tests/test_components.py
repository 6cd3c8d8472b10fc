"""The one registry (ablate.components.registry): the shipped choices in it, a user's component, optimizer and task
registered from an experiment file, checked before any compute, in the run's identity, and the score_mods' numerics
against SDPA and FlexAttention."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ablate
from ablate.components import registry
from ablate.config import ConfigError, ModelConfig, RunConfig
from ablate.model import Transformer, modified_attention
from ablate.setup.checks import check_registered_names
from ablate.setup.experiment import ExperimentError, load_checked, load_registrations
from ablate.setup.overrides import apply_overrides

TINY = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4)


def test_the_shipped_choices_are_registry_entries():
    from ablate.eval import suite

    shipped = {kind: {n for n, e in registry.entries(kind).items() if e.builtin} for kind in registry.KINDS[:4]}
    assert shipped == {
        "optimizer": {"adamw", "muon"},
        "ffn": {"swiglu", "gelu", "relu", "moe"},
        "norm": {"rmsnorm", "layernorm"},
        "score_mod": {"softcap", "alibi", "sliding_window"},
    }
    suite.all_tasks()
    assert sum(e.builtin for e in registry.entries("task").values()) == 23


@pytest.fixture
def throwaway():
    """Names registered by a test, removed after it."""
    names: list[tuple[str, str]] = []
    yield names
    for kind, name in names:
        registry.unregister(kind, name)


def test_the_same_class_again_does_nothing_and_another_is_refused_naming_both_files(throwaway):
    class Half(nn.Module):
        def __init__(self, config, layer_index):
            super().__init__()

        def forward(self, x):
            return x / 2

    throwaway.append(("ffn", "half"))
    assert ablate.register_component("ffn", "half")(Half) is Half
    assert ablate.register_component("ffn", "half")(Half) is Half  # a file executed twice
    other = type("Other", (Half,), {})
    with pytest.raises(registry.RegistryError, match=r"model.ffn 'half' is registered twice: .*Half in .*Other in"):
        ablate.register_component("ffn", "half")(other)
    with pytest.raises(registry.RegistryError, match="kind 'attention'; allowed: 'ffn', 'norm', 'score_mod'"):
        ablate.register_component("attention", "x")


def _experiment(tmp_path, body: str, name: str = "mine.py"):
    path = tmp_path / name
    path.write_text(
        "import torch\nfrom torch import nn\nimport ablate\n"
        "from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant\n"
        + textwrap.dedent(body)
        + "\nruns = [variant(RunConfig(model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4), "
        "data=DataConfig(max_documents=50, seq_len=16), train=TrainConfig(max_steps=2, global_batch=2, "
        "micro_batch=2)), 'v', OVERRIDES)]\n"
    )
    return path


FFN = """
@ablate.register_component("ffn", "{name}")
class Mine(nn.Module):
    def __init__(self, config, layer_index):
        super().__init__()
        self.up = nn.Linear(config.d_model, {width}, bias=False)

    def forward(self, x):
        return torch.relu(self.up(x)).square()
OVERRIDES = {{"model.ffn": "{name}"}}
"""


def test_a_user_ffn_is_checked_trains_and_enters_the_identity(tmp_path, throwaway):
    throwaway.append(("ffn", "relu2_test"))
    (checked,) = load_checked(_experiment(tmp_path, FFN.format(name="relu2_test", width=32)))
    run = checked.config
    assert set(run.user_code) == {"ffn:relu2_test"} and run.experiment_file == str(tmp_path / "mine.py")
    plain = dataclasses.replace(run, user_code={})
    assert run.identity() != plain.identity()  # the digest is part of it
    model = Transformer(run.model, 16)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 64, (2, 16))
    loss, _ = model.loss(tokens, tokens)
    loss.backward()
    assert type(model.layers[0].ffn).__name__ == "Mine" and model.layers[0].ffn.up.weight.grad is not None


def test_an_edited_component_gets_another_digest_and_a_rerun_of_the_file_re_registers(tmp_path, throwaway):
    throwaway.append(("ffn", "edited_test"))
    path = _experiment(tmp_path, FFN.format(name="edited_test", width=32))
    before = load_checked(path)[0].config.user_code
    path.write_text(path.read_text().replace("torch.relu(self.up(x)).square()", "torch.relu(self.up(x))"))
    after = load_checked(path)[0].config.user_code  # executed again (its bytes changed): no "registered twice"
    assert before.keys() == after.keys() and before != after


def test_a_component_that_changes_the_shape_is_refused_before_any_compute(tmp_path, throwaway):
    throwaway.append(("ffn", "wide_test"))
    with pytest.raises(ExperimentError) as refused:
        load_checked(_experiment(tmp_path, FFN.format(name="wide_test", width=48)))
    message = str(refused.value)
    assert "mine.py" in message and "model.ffn: 'wide_test' (Mine in" in message
    assert "maps shape (2, 8, 32) to (2, 8, 48); allowed: the same shape" in message


def test_an_unknown_component_names_the_field_and_how_to_add_one():
    with pytest.raises(ConfigError, match=r"model.norm: 'batchnorm' unknown; allowed: rmsnorm, layernorm .*register"):
        check_registered_names(RunConfig(model=dataclasses.replace(TINY, norm="batchnorm")))


def test_options_are_typed_checked_against_the_components_in_use_and_settable_with_set():
    run = apply_overrides(
        RunConfig(model=dataclasses.replace(TINY, score_mod="softcap")), {"model.options.softcap": "30"}, from_text=True
    )
    assert run.model.options == {"softcap": 30}
    check_registered_names(run)
    assert run.identity() != apply_overrides(run, {"model.options.softcap": "20"}, from_text=True).identity()
    with pytest.raises(ConfigError, match=r"model.options.window: no component .*allowed: softcap"):
        check_registered_names(dataclasses.replace(run, model=dataclasses.replace(run.model, options={"window": 3})))
    with pytest.raises(ConfigError, match=r"model.options.softcap: got 'big' .*allowed: float"):
        check_registered_names(
            dataclasses.replace(run, model=dataclasses.replace(run.model, options={"softcap": "big"}))
        )


def test_allowed_field_lists_hold_no_classvars():
    with pytest.raises(ConfigError) as refused:
        apply_overrides(RunConfig(), {"model.identity_omits": "x"}, from_text=True)
    assert "unknown field" in str(refused.value) and "identity" not in str(refused.value).split("allowed:")[1]


def test_shipped_runs_keep_their_identity():
    """A run of shipped components has no user code: its identity is what it was before the registry."""
    run = check_registered_names(RunConfig())
    assert run.user_code == {} and run.identity() == RunConfig().identity()


# -- score_mods ------------------------------------------------------------------------------------------------------


def _qkv(kv_heads=2):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, h, 16, 8, generator=gen) for h in (4, kv_heads, kv_heads)]


def test_the_written_out_path_equals_sdpa_under_the_identity_score_mod():
    q, k, v = _qkv()
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(modified_attention(q, k, v, lambda s, b, h, qi, ki: s), reference)


@pytest.mark.parametrize("name", ["softcap", "alibi", "sliding_window"])
def test_each_shipped_score_mod_equals_flex_attention(name):
    from torch.nn.attention.flex_attention import flex_attention

    from ablate.model import causal_block_mask

    q, k, v = _qkv()
    options = {"softcap": {"softcap": 2.0}, "sliding_window": {"window": 4}}.get(name, {})
    cfg = dataclasses.replace(TINY, score_mod=name, options=options)
    score_mod = registry.lookup("score_mod", name).obj(cfg)
    causal = causal_block_mask(16, "cpu")  # the CUDA path's mask, made here on CPU
    expected = flex_attention(q, k, v, score_mod=score_mod, block_mask=causal, enable_gqa=True)
    got = modified_attention(q, k, v, score_mod)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=2e-6)
    assert not torch.allclose(got, modified_attention(q, k, v, lambda s, b, h, qi, ki: s))  # it modifies


def test_a_wide_window_and_a_huge_cap_are_plain_causal_attention():
    q, k, v = _qkv()
    plain = modified_attention(q, k, v, lambda s, b, h, qi, ki: s)
    for name, options in (("sliding_window", {"window": 16}), ("softcap", {"softcap": 1e6})):
        cfg = dataclasses.replace(TINY, score_mod=name, options=options)
        torch.testing.assert_close(modified_attention(q, k, v, registry.lookup("score_mod", name).obj(cfg)), plain)


def test_a_score_mod_never_sees_the_future():
    """Changing the last token changes no earlier position's output (the causal mask holds under every mod)."""
    cfg = dataclasses.replace(TINY, score_mod="alibi", pos="nope")
    model = Transformer(cfg, 16)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 64, (1, 16))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 64
    torch.testing.assert_close(model(tokens)[0, :-1], model(changed)[0, :-1])


# -- a task from a local file ----------------------------------------------------------------------------------------


def _rows(tmp_path, rows, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_local_file_task_is_registered_and_builds_cloze_items(tmp_path, throwaway):
    from ablate.eval import suite

    throwaway.append(("task", "local_test"))
    path = _rows(tmp_path, [{"q": "2+2?", "c": ["3", "4"], "a": 1}, {"q": "Sky?", "c": ["blue", "red"], "a": "blue"}])
    task = ablate.register_task("local_test", str(path), context="q", choices="c", answer="a")
    assert "local_test" in suite.all_tasks() and suite.parse_tasks("local_test") == ["local_test"]
    items = sorted(task.items(limit=0), key=lambda item: item.id)
    assert [i.gold for i in items] == [1, 0] and items[0].continuations == [" 3", " 4"]
    assert items[0].contexts == ["Question: 2+2?\nAnswer:"]
    assert set(suite.user_task_code("local_test")) == {"local_test"}


@pytest.mark.parametrize(
    "row, message",
    [
        ({"q": "x", "c": ["a", "b"]}, r"t.jsonl:2: missing field 'a'"),
        ({"q": "x", "c": ["a", "b"], "a": 2}, r"t.jsonl:2: field 'a': index 2 is out of range for 2 choices"),
        ({"q": "x", "c": ["a", "b"], "a": "z"}, r"t.jsonl:2: field 'a': 'z' is none of the choices"),
        ({"q": "x", "c": "ab", "a": 0}, r"t.jsonl:2: field 'c' is 'ab'; allowed: a list of two or more strings"),
    ],
)
def test_a_bad_task_file_is_refused_naming_the_row_and_field(tmp_path, row, message):
    path = _rows(tmp_path, [{"q": "fine", "c": ["a", "b"], "a": 0}, row])
    with pytest.raises(ConfigError, match=message):
        ablate.register_task("bad_test", str(path), context="q", choices="c", answer="a")
    assert "bad_test" not in registry.entries("task")


def test_the_experiment_file_registers_for_other_commands(tmp_path, throwaway):
    """`ablate eval` loads the recorded file (load_registrations) before it parses --tasks."""
    throwaway.append(("task", "from_file_test"))
    _rows(tmp_path, [{"q": "x", "c": ["a", "b"], "a": 0}])
    path = tmp_path / "exp.py"
    path.write_text(
        "import ablate\nablate.register_task('from_file_test', 't.jsonl', context='q', choices='c', answer='a')\n"
    )
    load_registrations(path)
    assert registry.lookup("task", "from_file_test").file == str(path.resolve())


def test_every_config_field_is_documented():
    """docs/experiments.md's field table names every field of every section, and the paragraph below it the
    RunConfig's own: a new knob nobody documented fails here."""
    import re

    from ablate.config import SECTIONS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "experiments.md").read_text()
    table = doc[doc.index("## The config, field by field") : doc.index("### The lecture's choices")]  # MoE/MLA's too
    rows = {line.split("|")[1].strip(" `"): line for line in table.splitlines() if line.startswith("| `")}
    missing = []
    for section, cls in SECTIONS.items():
        row = rows[cls.__name__] + (table if cls is ModelConfig else "")  # the moe_* fields in their subsection
        missing += [f"{section}.{f.name}" for f in dataclasses.fields(cls) if not re.search(rf"\b{f.name}\b", row)]
    own = [f.name for f in dataclasses.fields(RunConfig) if f.name not in SECTIONS]
    missing += [f"RunConfig.{name}" for name in own if not re.search(rf"\b{name}\b", table)]
    assert not missing, f"document these fields in docs/experiments.md's table: {missing}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["softcap", "alibi", "sliding_window"])
def test_on_cuda_a_score_mod_runs_through_flex_attention_and_equals_the_written_out_scores(name):
    """The CUDA path (FlexAttention, compiled as a training run compiles it) against the CPU path, in fp32."""
    q, k, v = _qkv()
    options = {"softcap": {"softcap": 2.0}, "sliding_window": {"window": 4}}.get(name, {})
    score_mod = registry.lookup("score_mod", name).obj(dataclasses.replace(TINY, score_mod=name, options=options))
    expected = modified_attention(q, k, v, score_mod)
    got = torch.compile(modified_attention)(q.cuda(), k.cuda(), v.cuda(), score_mod)
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
