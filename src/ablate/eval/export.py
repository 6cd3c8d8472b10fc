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

and moe_capacity=0 for every MoE (transformers never drops a token).

Export is an allow-list: every ModelConfig field is in exactly one of MAPPED (the transformers config, the class
chosen or the weights' layout carry it), MUST_BE_DEFAULT (no class export writes represents another value: a
non-default one is refused by name, with why) and TRAINING_ONLY (nothing an eval-mode forward computes reads it);
tests/test_export_fields.py fails on a field in none of them, and a field export does not know is refused whenever
it is not at its default. Whatever no class represents is refused by name rather than exported into a model that
computes something else.

The fields that name a component (model.ffn, model.norm, model.score_mod) are looked up in ablate.components.registry.
A shipped one is exported as the table says (gelu, relu, layernorm and every score_mod are refused). A user's is
refused, naming it, its class and its file, unless it declares its transformers mapping: a class attribute

    hf_mapping = "swiglu"   # (ffn: "swiglu" or "moe"; norm: "rmsnorm"; score_mod: none)

naming the shipped component of its kind that computes exactly what it computes, with the same parameter names and
shapes (model.ffn_hidden is pinned to the run's ffn_dim). Export then writes it as that component, after checking
the claim: the shipped model, built with the same weights (strict: every name and shape), must give the same logits
on random tokens, or nothing is written. That check builds the model a second time, only for such components.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from ablate import rundir
from ablate.components import registry
from ablate.config import ConfigError, ModelConfig
from ablate.model import Transformer, layer_has_experts, mla_dims

# How each field reaches the transformers model: the config key, or what carries it.
MAPPED = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads (mla: n_heads, each head's keys and values from the latent)",
    "ffn": "the class (swiglu: hidden_act='silu' gated MLP; moe: its experts); a component (_COMPONENTS)",
    "ffn_hidden": "intermediate_size (through ffn_dim)",
    "norm": "the classes' RMSNorm; a component (_COMPONENTS)",
    "norm_eps": "rms_norm_eps (mla: the latent norms' fixed eps, through scaled projections)",
    "rope_base": "rope_theta",
    "qk_norm": "the class (Qwen3, Qwen3Moe) or use_qk_norm (Glm4Moe)",
    "tie_embeddings": "tie_word_embeddings",
    "moe_experts": "num_local_experts (Mixtral), num_experts (Qwen3Moe), n_routed_experts (DeepSeek-style)",
    "moe_top_k": "num_experts_per_tok (and norm_topk_prob: top_k > 1)",
    "moe_shared_experts": "n_shared_experts (DeepSeek-style; refused by the classes without them)",
    "moe_hidden": "moe_intermediate_size (Mixtral: intermediate_size)",
    "moe_every": "decoder_sparse_step (Qwen3Moe), first_k_dense_replace (DeepSeek-style)",
    "moe_balance": "the class: softmax router (aux_loss), sigmoid affinities + e_score_correction_bias (bias)",
    "attention": "the class: gqa Llama-style, mla DeepSeek-style",
    "kv_lora_rank": "kv_lora_rank",
    "q_lora_rank": "q_lora_rank (0: None)",
    "qk_rope_dim": "qk_rope_head_dim",
}
# What no class export writes represents: (why, what export needs; None: the default).
MUST_BE_DEFAULT = {
    "pos": ("the transformers classes always apply RoPE", None),
    "rope_skip_every": ("layers without RoPE have no matching transformers class", None),
    "rope_fraction": ("partial RoPE is not in the classes export writes", None),
    "moe_capacity": (
        "ablate drops the choices over an expert's capacity, in evaluation too, and transformers' MoE classes "
        "never drop one",
        "model.moe_capacity=0",
    ),
    "score_mod": (
        "the classes export writes (Llama, Qwen3, Mixtral, Qwen3Moe, Glm4Moe, DeepseekV2/V3) modify no attention "
        "score: none has a logit soft cap (Gemma 2's attn_logit_softcapping is in a class whose blocks are not "
        "ablate's), ALiBi or a sliding window",
        None,
    ),
    "options": ("component options change what the components compute, and export maps none", None),
    # not yet: the multipliers could be folded into the weights (head, q projection or q-norm, output projections)
    "parametrization": (
        "its forward's multipliers (logits x base_width/d_model, attention scores x sqrt(base head width)/head "
        "width, residual branches x base_depth/n_layers) are not folded into exported weights yet",
        None,
    ),
    "base_width": ("read only with model.parametrization 'mup' or 'completep', which export refuses", None),
    "base_depth": ("read only with model.parametrization='completep', which export refuses", None),
}
# Nothing an eval-mode forward computes reads them.
TRAINING_ONLY = {
    "init_std": "the initialisation",
    "z_loss": "a loss term",
    "dropout": "off in evaluation (transformers' attention_dropout is 0)",
    "kernels": "the same math, Triton or torch",
    "moe_aux_loss": "a loss term",
    "moe_bias_rate": "the step of the routers' biases in training (the biases themselves are weights)",
    "moe_z_loss": "a loss term",
}
# The fields that name a component: (the shipped names export writes, why not another, what export needs). A
# user's component may declare one of those names as its hf_mapping; score_mod has none (MUST_BE_DEFAULT: "").
_COMPONENTS = {
    "ffn": (("swiglu", "moe"), "the transformers classes have gated SiLU FFNs only", "model.ffn='swiglu' or 'moe'"),
    "norm": (("rmsnorm",), "the transformers classes use RMSNorm", "model.norm='rmsnorm'"),
    "score_mod": ((), None, None),
}
_DEFAULTS = ModelConfig()
_REFUSED = "cannot export to transformers"


def _registered(kind: str, name: str) -> registry.Entry:
    try:
        return registry.lookup(kind, name)
    except ConfigError:
        raise NotImplementedError(
            f"{_REFUSED}: model.{kind}={name!r} is registered by no code in this process: a user component whose "
            f"experiment file is not loaded (ablate export runs the one the run records, when it is still there)"
        ) from None


def _user_components(m: ModelConfig) -> list[registry.Entry]:
    """The registry entries of the user's (not shipped) components `m` names."""
    entries = [_registered(kind, getattr(m, kind)) for kind in _COMPONENTS if getattr(m, kind)]
    return [entry for entry in entries if not entry.builtin]


def _declared_target(entry: registry.Entry) -> str:
    """The shipped component a user's declares it computes (its hf_mapping), or the refusal naming it."""
    targets = _COMPONENTS[entry.kind][0]
    allowed = " or ".join(repr(t) for t in targets) or f"none: no {entry.kind} exports"
    target = getattr(entry.obj, "hf_mapping", None)
    who = f"model.{entry.kind}={entry.name!r} is a user component ({entry.qualname} in {entry.file})"
    if target is None:
        raise NotImplementedError(
            f"{_REFUSED}: {who} that declares no transformers mapping; export needs a shipped {entry.kind} it "
            f"writes ({allowed}), or on the class `hf_mapping = NAME`, the shipped one it computes exactly"
        )
    if target not in targets:
        raise NotImplementedError(f"{_REFUSED}: {who} with hf_mapping={target!r}; allowed: {allowed}")
    return target


def _field_problem(name: str, value) -> str | None:
    """Why export refuses `value` for field `name` and what it needs instead; None: exported as it is."""
    if name in _COMPONENTS and name in MAPPED:
        names, why, needs = _COMPONENTS[name]
        return None if value in names else f"{why}; export needs {needs}"
    if name in MAPPED or name in TRAINING_ONLY:
        return None
    why, needs = MUST_BE_DEFAULT.get(name, ("a field export does not know (eval/export.py classifies each)", None))
    default = getattr(_DEFAULTS, name)
    return None if value == default else f"{why}; export needs {needs or f'model.{name}={default!r}'}"


def exportable_config(m: ModelConfig) -> ModelConfig:
    """`m` with each user component replaced by the shipped one it declares (hf_mapping), every field checked
    against the allow-list; NotImplementedError naming the first field refused, its value and what export needs."""
    changes = {entry.kind: _declared_target(entry) for entry in _user_components(m)}
    if "ffn" in changes:  # ffn_dim's default follows the name
        changes["ffn_hidden"] = m.ffn_dim
    m = dataclasses.replace(m, **changes) if changes else m
    for f in dataclasses.fields(m):
        problem = _field_problem(f.name, getattr(m, f.name))
        if problem:
            raise NotImplementedError(f"{_REFUSED}: model.{f.name}={getattr(m, f.name)!r}: {problem}")
    return m


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
    NotImplementedError naming the field, its value and what export needs. Reads the config (and the registry)."""
    return _exportable(m)[0]


def _exportable(m: ModelConfig) -> tuple[str, ModelConfig]:
    """(the class, `m` as exported: exportable_config)."""
    m = exportable_config(m)
    if m.ffn != "moe":
        return "DeepseekV3" if m.attention == "mla" else ("Qwen3" if m.qk_norm else "Llama"), m
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
                f"{_REFUSED}: model.{field}={getattr(m, field)}: {why.format(cls=cls)}; export needs {needs}"
            )
    return cls, m


def hf_config(m: ModelConfig, max_len: int, eos_id: int | None):
    """The transformers config of `m`'s class (check_exportable), architectures set."""
    import transformers

    cls, m = _exportable(m)
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
    cls, m = _exportable(m)
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


def check_declared_mappings(model: Transformer) -> None:
    """For a model with user components that declare hf_mapping: the model with the shipped components they name,
    given the same weights (every name and shape), gives the same logits on random tokens; NotImplementedError
    naming the components otherwise. Nothing to do without such components."""
    declared = _user_components(model.cfg)
    if not declared:
        return
    who = ", ".join(f"model.{e.kind}={e.name!r} ({e.qualname} in {e.file}) with hf_mapping" for e in declared)
    device = model.embed.weight.device
    shipped = Transformer(exportable_config(model.cfg), max_seq_len=model.max_seq_len).to(device)
    try:
        shipped.load_state_dict(model.state_dict(), strict=True)
    except RuntimeError as exc:  # its first line says where, the next what
        what = (str(exc).splitlines()[1:] or [str(exc)])[0].strip()
        raise NotImplementedError(f"{_REFUSED}: {who}: not the shipped component's weights: {what}") from None
    seq = min(16, model.max_seq_len)
    tokens = torch.randint(0, model.cfg.vocab_size, (2, seq), generator=torch.Generator().manual_seed(0)).to(device)
    training = model.training
    with torch.no_grad():
        ours, theirs = model.eval()(tokens), shipped.eval()(tokens)
    model.train(training)
    if not torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5):
        raise NotImplementedError(
            f"{_REFUSED}: {who}: computes something else than the shipped component (logits differ by up to "
            f"{(ours - theirs).abs().max().item():.3g} on random tokens)"
        )


def write_model(model, max_len: int, eos_id: int | None, out_dir: Path) -> list[str]:
    """config.json, generation_config.json and model.safetensors of `model` (an ablate Transformer) as its class
    (check_exportable) reads them; returns the names written. Written directly (not through a transformers model
    class), so no model is built twice and transformers' quantizer probes, which import torchao, never run.
    Everything is checked (check_declared_mappings too) before `out_dir` is made."""
    from safetensors.torch import save
    from transformers import GenerationConfig
    from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME, SAFE_WEIGHTS_NAME

    m, out_dir = model.cfg, Path(out_dir)
    config = hf_config(m, max_len, eos_id)
    check_declared_mappings(model)
    tensors = hf_state_dict(model.state_dict(), m)
    if m.tie_embeddings:  # transformers ties lm_head to the embedding on load; the file holds it once
        del tensors["lm_head.weight"]
    out_dir.mkdir(parents=True, exist_ok=True)
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
