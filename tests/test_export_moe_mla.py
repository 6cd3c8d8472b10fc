"""Export of latent attention (attention="mla") and mixtures of experts (ffn="moe") to transformers: each mapped
combination written by write_model, read back by AutoModelForCausalLM, with ablate's logits; each combination no
class represents refused by name; and `ablate export` on a trained MLA + MoE run. The dense GQA exports (Llama,
Qwen3) are tests/test_eval.py's and tests/test_cli_options.py's."""

from __future__ import annotations

import pytest
import torch

from ablate.config import ModelConfig
from ablate.eval.export import check_exportable, write_model
from ablate.model import MoE, Transformer
from conftest import TINY, run_cli

VOCAB, SEQ = 128, 32
BASE = dict(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, init_std=0.1, moe_experts=4, moe_hidden=24)
MLA, BIAS, AUX = dict(attention="mla"), dict(ffn="moe", moe_balance="bias"), dict(ffn="moe", moe_balance="aux_loss")

EXPORTED = {  # id: (knobs beyond BASE, the class transformers loads)
    "mla": (MLA, "DeepseekV3"),
    "mla_q_lora_untied": ({**MLA, "q_lora_rank": 16, "tie_embeddings": False}, "DeepseekV3"),
    "mla_bias_top2_shared": ({**MLA, **BIAS, "moe_top_k": 2, "moe_shared_experts": 1}, "DeepseekV3"),
    "mla_bias_top1_last_layer": ({**MLA, **BIAS, "moe_top_k": 1, "moe_every": 2}, "DeepseekV3"),
    "mla_aux_top1_two_shared": ({**MLA, **AUX, "moe_top_k": 1, "moe_shared_experts": 2}, "DeepseekV2"),
    "gqa_aux_top2": ({**AUX, "moe_top_k": 2, "n_kv_heads": 2}, "Mixtral"),
    "gqa_qk_norm_aux_top1_every2": ({**AUX, "moe_top_k": 1, "qk_norm": True, "moe_every": 2}, "Qwen3Moe"),
    "gqa_bias_top2_shared": ({**BIAS, "moe_top_k": 2, "moe_shared_experts": 1, "n_kv_heads": 2}, "Glm4Moe"),
    "gqa_qk_norm_bias_top1": ({**BIAS, "moe_top_k": 1, "qk_norm": True}, "Glm4Moe"),
}


def random_model(**knobs) -> Transformer:
    """init_weights from a seed, then norms away from 1 and routers' biases away from 0, so a norm or bias mapped to
    the wrong place shows in the logits."""
    model = Transformer(ModelConfig(**{**BASE, **knobs}), max_seq_len=SEQ)
    generator = torch.Generator().manual_seed(0)
    model.init_weights(generator)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
        for router in model.routers().values():
            router.bias.copy_(0.3 * torch.randn(router.bias.shape, generator=generator))
    return model.eval()


def hf_logits(model: Transformer, out_dir, tokens: torch.Tensor, cls: str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    assert write_model(model, SEQ, 0, out_dir) == ["config.json", "generation_config.json", "model.safetensors"]
    hf, info = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, output_loading_info=True)
    assert type(hf).__name__ == f"{cls}ForCausalLM"
    assert not any(info.values()), info  # every weight came from the file, and every one in the file was taken
    with torch.no_grad():
        return hf.eval()(input_ids=tokens).logits


@pytest.mark.parametrize("case", EXPORTED)
def test_exported_model_gives_the_same_logits(case, tmp_path):
    knobs, cls = EXPORTED[case]
    model = random_model(**knobs)
    assert check_exportable(model.cfg) == cls
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(tokens)
    torch.testing.assert_close(hf_logits(model, tmp_path, tokens, cls), ours, atol=1e-5, rtol=1e-5)
    if knobs.get("moe_balance") == "bias":  # the bias changed some choices: its path was exercised
        for router in model.routers().values():
            router.bias.zero_()
        with torch.no_grad():
            assert not torch.allclose(model(tokens), ours, atol=1e-3)


REFUSED = [  # (knobs beyond BASE, what the message says)
    (
        {**BIAS, "moe_capacity": 1.25},
        r"model.moe_capacity=1.25: .*in evaluation too.*export needs model.moe_capacity=0",
    ),
    ({**MLA, "pos": "nope", "qk_rope_dim": 0}, r"model.pos='nope': .*export needs model.pos='rope'"),
    ({**MLA, "rope_skip_every": 2}, r"model.rope_skip_every=2: .*export needs model.rope_skip_every=0"),
    ({**BIAS, "n_layers": 3, "moe_every": 2}, r"model.moe_every=2: Glm4Moe has experts in every layer from one on"),
    ({**MLA, **BIAS, "moe_every": 2, "n_layers": 4}, r"model.moe_every=2: DeepseekV3 has experts .*moe_every=1"),
    ({**BIAS, "moe_experts": 1, "moe_top_k": 1}, r"model.moe_experts=1: Glm4Moe's router .*moe_experts >= 2"),
    ({**MLA, **AUX, "moe_top_k": 2}, r"model.moe_top_k=2: DeepseekV2 .*never renormalises.*moe_top_k=1"),
    ({**AUX, "moe_shared_experts": 1}, r"model.moe_shared_experts=1: Mixtral .*has no shared experts"),
    ({**AUX, "qk_norm": True, "moe_shared_experts": 2}, r"model.moe_shared_experts=2: Qwen3Moe .*no shared experts"),
    ({**AUX, "moe_top_k": 1}, r"model.moe_top_k=1: Mixtral renormalises.*or model.qk_norm=True: Qwen3Moe"),
    ({**AUX, "moe_every": 2}, r"model.moe_every=2: Mixtral has experts in every layer; export needs model.moe_every"),
]


@pytest.mark.parametrize("knobs, says", REFUSED)
def test_what_no_class_represents_is_refused_by_name(knobs, says):
    with pytest.raises(NotImplementedError, match=f"^cannot export to transformers: {says}"):
        check_exportable(ModelConfig(**{**BASE, **knobs}))


@pytest.mark.slow
def test_cli_exports_a_trained_latent_attention_moe_run(tmp_path):
    """`ablate export` on a run folder, as a user runs it: MLA with compressed queries, DeepSeek-V3 balancing (the
    biases moved by training) and a shared expert, read back as DeepseekV3ForCausalLM with the run's logits."""
    from ablate.eval.load import load_model

    knobs = ["model.attention=mla", "model.q_lora_rank=16", "model.ffn=moe", "model.moe_experts=4"]
    knobs += ["model.moe_balance=bias", "model.moe_bias_rate=0.01", "model.moe_shared_experts=1"]
    sets = [arg for knob in knobs for arg in ("--set", knob)]
    run_cli("run", str(TINY), "--only", "mha", "--set", "train.max_steps=2", *sets, "--out", str(tmp_path / "runs"))
    run_dir = tmp_path / "runs" / "tiny" / "mha" / "seed0"
    exported = run_cli("export", str(run_dir), "--hf", str(tmp_path / "hf"))
    assert exported.stdout.splitlines() == [f"wrote a transformers model to {tmp_path / 'hf'}"]
    assert exported.stderr == "", exported.stderr
    ours = load_model(run_dir).model.eval()
    assert any(isinstance(layer.ffn, MoE) and layer.ffn.router.bias.abs().sum() > 0 for layer in ours.layers)
    tokens = torch.randint(0, ours.cfg.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(0))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    assert type(hf).__name__ == "DeepseekV3ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours(tokens), atol=1e-5, rtol=1e-5)
