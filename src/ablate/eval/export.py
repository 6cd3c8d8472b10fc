"""Export a checkpoint as a transformers model (safetensors + config + tokenizer) with the same logits.

Every ablate model it exports is pre-norm RMSNorm, SwiGLU, half-split RoPE on every layer, no biases; the class
follows the attention and the FFN (tests/test_export_moe_mla.py checks each against ablate's logits):

    attention  ffn                 class       also needs
    gqa        swiglu              Llama       qk_norm=False
    gqa        swiglu              Qwen3       qk_norm=True (per-head RMSNorm on queries and keys before RoPE)
    gqa        moe, aux_loss       Mixtral     qk_norm=False, moe_top_k > 1, moe_every=1, no shared experts
    gqa        moe, aux_loss       Qwen3Moe    qk_norm=True, no shared experts
    gqa        moe, bias           Glm4Moe     the MoE layers the last ones (moe_every=1, or = n_layers)
    mla        swiglu, moe bias    DeepseekV3  the same
    mla        moe, aux_loss       DeepseekV2  moe_top_k=1, the same

and moe_capacity=0 for every MoE (transformers never drops a token). Whatever no class represents is refused by
name rather than exported into a model that computes something else.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ablate import rundir
from ablate.config import ModelConfig
from ablate.model import layer_has_experts, mla_dims

# Each entry: (does this config use a knob transformers cannot represent?, why). Checked in order, before the class.
_UNSUPPORTED = [
    (
        lambda m: m.pos != "rope",
        "model.pos='nope': the transformers classes always apply RoPE; export needs model.pos='rope'",
    ),
    (
        lambda m: m.rope_skip_every != 0,
        "model.rope_skip_every={0.rope_skip_every}: layers without RoPE have no "
        "matching transformers class; export needs model.rope_skip_every=0",
    ),
    (
        lambda m: m.rope_fraction != 1.0,
        "model.rope_fraction={0.rope_fraction}: partial RoPE is not in the "
        "classes export writes; export needs model.rope_fraction=1.0",
    ),
    (
        lambda m: m.norm != "rmsnorm",
        "model.norm={0.norm!r}: the transformers classes use RMSNorm; export needs model.norm='rmsnorm'",
    ),
    (
        lambda m: m.ffn not in ("swiglu", "moe"),
        "model.ffn={0.ffn!r}: the transformers classes have gated SiLU FFNs only; export needs model.ffn='swiglu' "
        "or 'moe'",
    ),
    (
        lambda m: m.ffn == "moe" and m.moe_capacity > 0,
        "model.moe_capacity={0.moe_capacity}: ablate drops the choices over an expert's capacity, in evaluation "
        "too, and transformers' MoE classes never drop one; export needs model.moe_capacity=0",
    ),
]


def _moe_layers(m: ModelConfig) -> list[int]:
    """The (0-based) layers with experts: k-1, 2k-1, ... for moe_every=k (as Transformer builds them)."""
    return [i for i in range(m.n_layers) if layer_has_experts(m, i)]


def _first_moe_layer(m: ModelConfig) -> int | None:
    """DeepSeek-style classes put experts in every layer from first_k_dense_replace on: that index when ablate's
    MoE layers are such a final run (all layers, none, or the last alone), else None."""
    first = m.n_layers - len(_moe_layers(m))
    return first if _moe_layers(m) == list(range(first, m.n_layers)) else None


# What each MoE class cannot represent: (classes, does m fit?, field, why not, what export needs). In order.
_MOE_LIMITS = [
    (
        ("DeepseekV3", "Glm4Moe", "DeepseekV2"),
        lambda m: _first_moe_layer(m) is not None,
        "moe_every",
        "{cls} has experts in every layer from one on (first_k_dense_replace), not in layers k, 2k, ...",
        "model.moe_every=1 (or model.n_layers)",
    ),
    (
        ("DeepseekV3", "Glm4Moe"),
        lambda m: m.moe_experts >= 2,
        "moe_experts",
        "{cls}'s router takes the top two of a group of experts",
        "model.moe_experts >= 2",
    ),
    (
        ("DeepseekV2",),
        lambda m: m.moe_top_k == 1,
        "moe_top_k",
        "DeepseekV2 (the class of attention='mla' with moe_balance='aux_loss') never renormalises the top k gates",
        "model.moe_top_k=1 (or model.moe_balance='bias')",
    ),
    (
        ("Mixtral", "Qwen3Moe"),
        lambda m: m.moe_shared_experts == 0,
        "moe_shared_experts",
        "{cls} (the class of attention='gqa' with moe_balance='aux_loss') has no shared experts",
        "model.moe_shared_experts=0 (or model.moe_balance='bias')",
    ),
    (
        ("Mixtral",),
        lambda m: m.moe_top_k > 1,
        "moe_top_k",
        "Mixtral renormalises the top k gates, so a top-1 gate would be 1, not the expert's probability",
        "model.moe_top_k >= 2 (or model.qk_norm=True: Qwen3Moe)",
    ),
    (
        ("Mixtral",),
        lambda m: m.moe_every == 1,
        "moe_every",
        "Mixtral has experts in every layer",
        "model.moe_every=1 (or model.qk_norm=True: Qwen3Moe)",
    ),
]


def check_exportable(m: ModelConfig) -> str:
    """The transformers class (its name without "ForCausalLM") that computes what `m` computes, or
    NotImplementedError naming the field, its value and what export needs. Reads the config alone."""
    for uses, why in _UNSUPPORTED:
        if uses(m):
            raise NotImplementedError(f"cannot export to transformers: {why.format(m)}")
    if m.ffn != "moe":
        return "DeepseekV3" if m.attention == "mla" else ("Qwen3" if m.qk_norm else "Llama")
    # bias: sigmoid affinities, experts chosen by affinity + bias (DeepSeek-V3's router); aux_loss: softmax
    cls = {
        ("mla", "bias"): "DeepseekV3",
        ("gqa", "bias"): "Glm4Moe",
        ("mla", "aux_loss"): "DeepseekV2",
        ("gqa", "aux_loss"): "Qwen3Moe" if m.qk_norm else "Mixtral",
    }[m.attention, m.moe_balance]
    for classes, fits, field, why, needs in _MOE_LIMITS:
        if cls in classes and not fits(m):
            raise NotImplementedError(
                f"cannot export to transformers: model.{field}={getattr(m, field)}: {why.format(cls=cls)}; "
                f"export needs {needs}"
            )
    return cls


def hf_config(m: ModelConfig, max_len: int, eos_id: int | None):
    """The transformers config of `m`'s class (check_exportable), architectures set."""
    import transformers

    cls = check_exportable(m)
    fields = dict(
        vocab_size=m.vocab_size,
        hidden_size=m.d_model,
        intermediate_size=m.ffn_dim,  # the dense layers' (Mixtral: every expert's, below)
        num_hidden_layers=m.n_layers,
        num_attention_heads=m.n_heads,
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
    if m.attention == "mla":
        kv_rank, rope = mla_dims(m)
        fields.update(
            num_key_value_heads=m.n_heads,
            kv_lora_rank=kv_rank,
            q_lora_rank=m.q_lora_rank or None,
            qk_rope_head_dim=rope,
            qk_nope_head_dim=m.head_dim,
            v_head_dim=m.head_dim,
        )
    else:
        fields.update(num_key_value_heads=m.kv_heads, head_dim=m.head_dim)
    hidden, top_k = m.moe_hidden or m.ffn_dim, m.moe_top_k
    routed = dict(moe_intermediate_size=hidden, num_experts_per_tok=top_k, norm_topk_prob=top_k > 1)
    if cls == "Llama":
        fields.update(mlp_bias=False)
    elif cls == "Qwen3":
        fields.update(use_sliding_window=False)
    elif cls == "Mixtral":  # every layer's FFN is its experts
        fields.update(intermediate_size=hidden, num_local_experts=m.moe_experts, num_experts_per_tok=top_k)
    elif cls == "Qwen3Moe":
        fields.update(routed, num_experts=m.moe_experts, decoder_sparse_step=m.moe_every, mlp_only_layers=[])
    else:  # DeepSeek-style: experts from layer first_k_dense_replace on, gates not scaled
        fields.update(first_k_dense_replace=_first_moe_layer(m))
        if m.ffn == "moe":
            fields.update(routed, n_routed_experts=m.moe_experts, n_shared_experts=m.moe_shared_experts)
            fields.update(routed_scaling_factor=1.0)
        if cls == "DeepseekV2":
            fields.update(topk_method="greedy")
        else:  # one group of experts (group-limited routing off); no multi-token prediction layers
            fields.update(n_group=1, topk_group=1, num_mtp_layers=0)
        if cls == "Glm4Moe":
            fields.update(use_qk_norm=m.qk_norm, partial_rotary_factor=1.0)
        if cls == "DeepseekV3":  # DeepSeek's own RoPE layout, the one other runtimes assume: weights permuted to it
            fields.update(rope_interleave=True)
    config = getattr(transformers, f"{cls}Config")(**fields)
    config.architectures = [f"{cls}ForCausalLM"]
    return config


def _interleave_rope(w: torch.Tensor, nope: int, rope: int) -> torch.Tensor:
    """Rows of w in blocks of nope + rope (one per head), each block's last `rope` rows reordered from ablate's
    half-split RoPE pairs (i, i + rope/2) to DeepSeek's adjacent pairs (2i, 2i + 1): the same rotation."""
    blocks = w.reshape(-1, nope + rope, w.shape[-1])
    order = torch.arange(rope).view(2, rope // 2).T.flatten()
    return torch.cat([blocks[:, :nope], blocks[:, nope:][:, order]], dim=1).flatten(0, 1)


def _latent_attention(state: dict[str, torch.Tensor], src: str, m: ModelConfig) -> dict[str, torch.Tensor]:
    kv_rank, rope = mla_dims(m)
    # DeepSeek's latent norms take eps 1e-6 whatever the config; an input scaled by c gives x / sqrt(mean(x^2) +
    # eps / c^2), so the projections into them, scaled by c = sqrt(1e-6 / norm_eps), give ablate's norm exactly
    c = math.sqrt(1e-6 / m.norm_eps)
    q = _interleave_rope(state[src + "q_proj.weight"], m.head_dim, rope)
    kv_down = _interleave_rope(state[src + "kv_down.weight"], kv_rank, rope)
    out = {
        "kv_a_proj_with_mqa.weight": torch.cat([kv_down[:kv_rank] * c, kv_down[kv_rank:]]),
        "kv_a_layernorm.weight": state[src + "kv_norm.weight"],
        "kv_b_proj.weight": state[src + "kv_up.weight"],  # per head: keys (no RoPE part), values, as DeepSeek's
        "o_proj.weight": state[src + "o_proj.weight"],
    }
    if not m.q_lora_rank:
        return out | {"q_proj.weight": q}
    return out | {
        "q_a_proj.weight": state[src + "q_down.weight"] * c,
        "q_a_layernorm.weight": state[src + "q_norm.weight"],
        "q_b_proj.weight": q,
    }


def _experts(state: dict[str, torch.Tensor], src: str, m: ModelConfig, cls: str) -> dict[str, torch.Tensor]:
    """An MoE layer as the class's checkpoints name it: one matrix per expert (transformers stacks them on load)."""
    weights = {p: state[f"{src}experts.{p}"] for p in ("gate_proj", "up_proj", "down_proj")}
    if cls == "Mixtral":  # Mixtral's own names: w1 gate, w3 up, w2 down
        out = {"block_sparse_moe.gate.weight": state[src + "router.gate.weight"]}
        for e in range(m.moe_experts):
            for name, proj in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                out[f"block_sparse_moe.experts.{e}.{name}.weight"] = weights[proj][e]
        return out
    out = {"mlp.gate.weight": state[src + "router.gate.weight"]}
    out |= {f"mlp.experts.{e}.{p}.weight": w[e] for p, w in weights.items() for e in range(m.moe_experts)}
    if cls in ("DeepseekV3", "Glm4Moe"):  # chooses experts only, as ablate's
        out["mlp.gate.e_score_correction_bias"] = state[src + "router.bias"]
    if cls == "Qwen3Moe":
        return out
    # ablate's shared experts, summed, are one SwiGLU with their hidden units side by side: DeepSeek's shared_experts
    # (0 units without any). Every gate's hidden units (rows), every down projection's columns, in expert order.
    if m.moe_shared_experts:
        shared = {p: state[f"{src}shared.{p}"] for p in ("gate_proj", "up_proj", "down_proj")}
        gate, up = shared["gate_proj"].flatten(0, 1), shared["up_proj"].flatten(0, 1)
        down = shared["down_proj"].permute(1, 0, 2).flatten(1)
    else:
        gate = up = torch.zeros(0, m.d_model)
        down = torch.zeros(m.d_model, 0)
    return out | {
        "mlp.shared_experts.gate_proj.weight": gate,
        "mlp.shared_experts.up_proj.weight": up,
        "mlp.shared_experts.down_proj.weight": down,
    }


def hf_state_dict(state: dict[str, torch.Tensor], m: ModelConfig) -> dict[str, torch.Tensor]:
    """ablate parameter names -> the names (and layouts) of the class's checkpoints."""
    cls = check_exportable(m)
    out = {
        "model.embed_tokens.weight": state["embed.weight"],
        "model.norm.weight": state["norm.weight"],
        "lm_head.weight": state["embed.weight"] if m.tie_embeddings else state["lm_head.weight"],
    }
    for i in range(m.n_layers):
        src, dst = f"layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = state[src + "attn_norm.weight"]
        out[dst + "post_attention_layernorm.weight"] = state[src + "ffn_norm.weight"]
        if m.attention == "mla":
            out |= {dst + "self_attn." + k: v for k, v in _latent_attention(state, src + "attn.", m).items()}
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[dst + f"self_attn.{proj}.weight"] = state[src + f"attn.{proj}.weight"]
            if m.qk_norm:
                out[dst + "self_attn.q_norm.weight"] = state[src + "attn.q_norm.weight"]
                out[dst + "self_attn.k_norm.weight"] = state[src + "attn.k_norm.weight"]
        if i in _moe_layers(m):
            out |= {dst + k: v for k, v in _experts(state, src + "ffn.", m, cls).items()}
        else:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                out[dst + f"mlp.{proj}.weight"] = state[src + f"ffn.{proj}.weight"]
    return out


def _eos_token(tokenizer) -> str | None:
    from ablate.data.tokenizer import EOS_CANDIDATES

    return next((t for t in EOS_CANDIDATES if tokenizer.token_to_id(t) is not None), None)


def check_export_dir(out_dir: str | Path, force: bool = False) -> list[str]:
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
    """config.json, generation_config.json and model.safetensors of `model` (an ablate Transformer) as its class
    (check_exportable) reads them; returns the names written. Written directly (not through a transformers model
    class), so no model is built twice and transformers' quantizer probes, which import torchao, never run."""
    from safetensors.torch import save
    from transformers import GenerationConfig
    from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_NAME

    m = model.cfg
    config = hf_config(m, max_len, eos_id)
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
    from ablate.eval.load import load_model, read_run_config

    check_exportable(read_run_config(path).model)  # refuse before loading weights or importing transformers
    present = check_export_dir(out_dir, force)
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
