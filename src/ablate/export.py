"""Export a checkpoint as a transformers model (safetensors + config + tokenizer) with the same logits.

ablate's Transformer is a Llama (pre-norm RMSNorm, SwiGLU, half-split RoPE, GQA, no biases) when QK-norm is off, and
a Qwen3 (the same plus per-head RMSNorm on queries and keys before RoPE) when it is on. Knobs no transformers class
represents are refused by name rather than exported into a model that computes something else.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablate import rundir
from ablate.config import ModelConfig

# Each entry: (does this config use a knob transformers cannot represent?, why). Checked in order.
_UNSUPPORTED = [
    # transformers' DeepseekV3 classes hold both; mapping ablate's weights onto them is not written yet
    (
        lambda m: m.ffn == "moe",
        "model.ffn='moe': mixture-of-experts models have no transformers mapping yet; export needs a dense "
        "model.ffn ('swiglu')",
    ),
    (
        lambda m: m.attention == "mla",
        "model.attention='mla': latent attention has no transformers mapping yet; export needs model.attention='gqa'",
    ),
    (
        lambda m: m.pos != "rope",
        "model.pos='nope': the Llama/Qwen3 classes always apply RoPE; export needs model.pos='rope'",
    ),
    (
        lambda m: m.rope_skip_every != 0,
        "model.rope_skip_every={0.rope_skip_every}: layers without RoPE have no "
        "matching transformers class; export needs model.rope_skip_every=0",
    ),
    (
        lambda m: m.rope_fraction != 1.0,
        "model.rope_fraction={0.rope_fraction}: partial RoPE is not in the "
        "Llama/Qwen3 classes; export needs model.rope_fraction=1.0",
    ),
    (
        lambda m: m.norm != "rmsnorm",
        "model.norm={0.norm!r}: the Llama/Qwen3 classes use RMSNorm; export needs model.norm='rmsnorm'",
    ),
    (
        lambda m: m.ffn != "swiglu",
        "model.ffn={0.ffn!r}: the Llama/Qwen3 classes have a gated SiLU FFN only; export needs model.ffn='swiglu'",
    ),
]


def check_exportable(m: ModelConfig) -> None:
    for uses, why in _UNSUPPORTED:
        if uses(m):
            raise NotImplementedError(f"cannot export to transformers: {why.format(m)}")


def hf_config(m: ModelConfig, max_len: int, eos_id: int | None):
    check_exportable(m)
    common = dict(
        vocab_size=m.vocab_size,
        hidden_size=m.d_model,
        intermediate_size=m.ffn_dim,
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
        num_key_value_heads=m.kv_heads,
        head_dim=m.head_dim,
        hidden_act="silu",
        max_position_embeddings=max_len,
        rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_base,
        tie_word_embeddings=m.tie_embeddings,
        attention_bias=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        torch_dtype="float32",
    )
    if m.qk_norm:
        from transformers import Qwen3Config

        return Qwen3Config(**common, use_sliding_window=False)
    from transformers import LlamaConfig

    return LlamaConfig(**common, mlp_bias=False)


def hf_state_dict(state: dict[str, torch.Tensor], m: ModelConfig) -> dict[str, torch.Tensor]:
    """ablate parameter names -> transformers names."""
    out = {
        "model.embed_tokens.weight": state["embed.weight"],
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["embed.weight"] if m.tie_embeddings else state["lm_head.weight"],
    }
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
    from ablate.tokenizer import EOS_CANDIDATES

    return next((t for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None)


def check_out_dir(out_dir: str | Path, force: bool = False) -> list[str]:
    """The entries already in `out_dir` (sorted). A file, a path under a file, or a non-empty folder without
    `force` is refused in one line naming what is there."""
    out = Path(out_dir).expanduser()
    blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        where = "is a file" if blocking == out else f"{blocking} is a file"
        raise ValueError(f"--hf {out_dir}: {where}; allowed: a folder, new or empty")
    present = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if present and not force:
        shown = ", ".join(present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise ValueError(
            f"--hf {out_dir}: not empty ({len(present)} entr{'y' if len(present) == 1 else 'ies'}: "
            f"{shown}); allowed: a new or empty folder, or --force to write over it"
        )
    return present


def write_model(model, max_len: int, eos_id: int | None, out_dir: Path) -> list[str]:
    """config.json, generation_config.json and model.safetensors of `model` (an ablate Transformer) as the
    Llama/Qwen3 class reads them; returns the names written. Written directly (not through a transformers model
    class), so no model is built twice and transformers' quantizer probes, which import torchao, never run."""
    from safetensors.torch import save
    from transformers import GenerationConfig
    from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_NAME

    m = model.cfg
    config = hf_config(m, max_len, eos_id)
    config.architectures = ["Qwen3ForCausalLM" if m.qk_norm else "LlamaForCausalLM"]
    tensors = hf_state_dict(model.state_dict(), m)
    if m.tie_embeddings:  # transformers ties lm_head to the embedding on load; the file holds it once
        del tensors["lm_head.weight"]
    config.save_pretrained(out_dir)
    GenerationConfig.from_model_config(config).save_pretrained(out_dir)
    # bytes written by Python, not save_file: its file is mode 0600 whatever the umask, unreadable to the team
    (out_dir / SAFE_WEIGHTS_NAME).write_bytes(
        save(
            {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in tensors.items()}, metadata={"format": "pt"}
        )
    )
    return [CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_NAME]


def export_hf(path: str | Path, out_dir: str | Path, force: bool = False) -> tuple[list[str], list[str]]:
    """Write the model at `path` (a run folder or checkpoints/step_N) to `out_dir` as a transformers model.
    Returns (the files already in `out_dir` that it replaced, the other entries it left there)."""
    from ablate.load import load_model, read_run_config

    check_exportable(read_run_config(path).model)  # refuse before loading weights or importing transformers
    present = check_out_dir(out_dir, force)
    loaded = load_model(path)
    out, run_dir = Path(out_dir).expanduser().resolve(), loaded.run_dir.resolve()
    if out == run_dir or out.is_relative_to(run_dir / rundir.CHECKPOINTS):  # --force would write over the run
        raise ValueError(f"--hf {out_dir}: the run folder or its {rundir.CHECKPOINTS}/; allowed: a folder outside them")
    from transformers import PreTrainedTokenizerFast

    tokenizer = loaded.tokenizer()
    eos = _eos_token(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    written = write_model(loaded.model, loaded.run.data.seq_len, tokenizer.token_to_id(eos) if eos else None, out)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos,
        bos_token=eos,
        pad_token=eos,
        model_max_length=loaded.run.data.seq_len,
    )
    written += [Path(f).name for f in hf_tok.save_pretrained(out)]
    return [name for name in present if name in written], [name for name in present if name not in written]
