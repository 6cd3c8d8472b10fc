"""Export a checkpoint as a transformers model (safetensors + config + tokenizer) with the same logits.

ablate's Transformer is a Llama (pre-norm RMSNorm, SwiGLU, half-split RoPE, GQA, no biases) when QK-norm is off, and
a Qwen3 (the same plus per-head RMSNorm on queries and keys before RoPE) when it is on. Knobs no transformers class
represents are refused by name rather than exported into a model that computes something else.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ablate.config import ModelConfig

# Each entry: (does this config use a knob transformers cannot represent?, why). Checked in order.
_UNSUPPORTED = [
    (lambda m: m.pos != "rope", "model.pos='nope': the Llama/Qwen3 classes always apply RoPE; export needs "
                                "model.pos='rope'"),
    (lambda m: m.rope_skip_every != 0, "model.rope_skip_every={0.rope_skip_every}: layers without RoPE have no "
                                       "matching transformers class; export needs model.rope_skip_every=0"),
    (lambda m: m.rope_fraction != 1.0, "model.rope_fraction={0.rope_fraction}: partial RoPE is not in the "
                                       "Llama/Qwen3 classes; export needs model.rope_fraction=1.0"),
    (lambda m: m.norm != "rmsnorm", "model.norm={0.norm!r}: the Llama/Qwen3 classes use RMSNorm; export needs "
                                    "model.norm='rmsnorm'"),
    (lambda m: m.ffn != "swiglu", "model.ffn={0.ffn!r}: the Llama/Qwen3 classes have a gated SiLU FFN only; export "
                                  "needs model.ffn='swiglu'"),
]


def check_exportable(m: ModelConfig) -> None:
    for uses, why in _UNSUPPORTED:
        if uses(m):
            raise NotImplementedError(f"cannot export to transformers: {why.format(m)}")


def hf_config(m: ModelConfig, max_len: int, eos_id: int | None):
    check_exportable(m)
    common = dict(vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.ffn_dim,
                  num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads, num_key_value_heads=m.kv_heads,
                  head_dim=m.head_dim, hidden_act="silu", max_position_embeddings=max_len, rms_norm_eps=m.norm_eps,
                  rope_theta=m.rope_base, tie_word_embeddings=m.tie_embeddings, attention_bias=False,
                  bos_token_id=eos_id, eos_token_id=eos_id, torch_dtype="float32")
    if m.qk_norm:
        from transformers import Qwen3Config

        return Qwen3Config(**common, use_sliding_window=False)
    from transformers import LlamaConfig

    return LlamaConfig(**common, mlp_bias=False)


def hf_state_dict(state: dict[str, torch.Tensor], m: ModelConfig) -> dict[str, torch.Tensor]:
    """ablate parameter names -> transformers names."""
    out = {"model.embed_tokens.weight": state["embed.weight"], "model.norm.weight": state["norm.weight"],
           "lm_head.weight": state["embed.weight"] if m.tie_embeddings else state["lm_head.weight"]}
    for i in range(m.n_layers):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = state[src + "attn_norm.weight"]
        out[dst + "post_attention_layernorm.weight"] = state[src + "ffn_norm.weight"]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[dst + f"self_attn.{proj}.weight"] = state[src + f"attn.{proj}.weight"]
        if m.qk_norm:
            out[dst + "self_attn.q_norm.weight"] = state[src + "attn.q_norm.weight"]
            out[dst + "self_attn.k_norm.weight"] = state[src + "attn.k_norm.weight"]
        for proj in ("gate_proj", "up_proj", "down_proj"):
            out[dst + f"mlp.{proj}.weight"] = state[src + f"ffn.{proj}.weight"]
    return out


def _eos_token(tokenizer) -> str | None:
    from ablate.data import EOS_CANDIDATES

    return next((t for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None)


def export_hf(path: str | Path, out_dir: str | Path) -> Path:
    """Write the model at `path` (a run folder or checkpoints/step_N) to `out_dir` as a transformers model."""
    from ablate.load import load_model, read_run_config

    check_exportable(read_run_config(path).model)  # refuse before loading weights or importing transformers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    loaded = load_model(path)
    m = loaded.model.cfg
    tokenizer = loaded.tokenizer()
    eos = _eos_token(tokenizer)
    config = hf_config(m, loaded.run.data.seq_len, tokenizer.token_to_id(eos) if eos else None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(hf_state_dict(loaded.model.state_dict(), m), strict=True)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=eos, bos_token=eos, pad_token=eos,
                                     model_max_length=loaded.run.data.seq_len)
    hf_tok.save_pretrained(out_dir)
    return out_dir
