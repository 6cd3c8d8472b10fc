"""A run's training FLOPs per token from its config.json alone, with no torch: for run folders written before
summary.json recorded `flops_per_token`, the same count `Transformer.flops_per_token` makes (src/ablate/model.py).

The count: 6 N for the matmuls, N the non-embedding active parameters (the output projection included, the embedding
lookup not: a tied weight counts once, as the output projection; norms and QK-norms counted, as num_params counts
them; with experts, top_k of the routed experts), plus attention's scores and values, 12 x layers x heads x head_dim
x seq_len (PaLM's count, not halved for the causal mask); with latent attention, queries and keys are qk_rope_dim
wider: 6 x layers x heads x qk_rope_dim x seq_len more.

ModelConfig's defaults are repeated here (the report imports no ablate.config): a field a config.json lacks (an older
run) takes today's default, as RunConfig.from_dict gives it. tests/test_report_flops.py holds the two counts equal.
"""

from __future__ import annotations

# ModelConfig's defaults of the fields the count reads (src/ablate/config/__init__.py)
MODEL_DEFAULTS = {
    "vocab_size": 8192,
    "d_model": 128,
    "n_layers": 4,
    "n_heads": 4,
    "n_kv_heads": None,
    "ffn": "swiglu",
    "ffn_hidden": None,
    "norm": "rmsnorm",
    "pos": "rope",
    "qk_norm": False,
    "moe_experts": 8,
    "moe_top_k": 2,
    "moe_shared_experts": 0,
    "moe_hidden": None,
    "moe_every": 1,
    "attention": "gqa",
    "kv_lora_rank": None,
    "q_lora_rank": 0,
    "qk_rope_dim": None,
}
SEQ_LEN_DEFAULT = 256  # DataConfig.seq_len
KNOWN = {"ffn": ("swiglu", "gelu", "relu", "moe"), "norm": ("rmsnorm", "layernorm"), "attention": ("gqa", "mla")}


def flops_per_token(config: dict) -> tuple[float | None, str]:
    """(FLOPs per training token, "") from config.json's "config" section, or (None, why) where the config cannot be
    counted here (a value this count does not know, a field of the wrong type)."""
    model = config.get("model")
    if not isinstance(model, dict):
        return None, "config.json has no model section"
    m = {**MODEL_DEFAULTS, **model}
    for field, allowed in KNOWN.items():
        if m[field] not in allowed:
            return None, f"model.{field}={m[field]!r}: not counted without torch (known: {', '.join(allowed)})"
    seq_len = config.get("data", {}).get("seq_len", SEQ_LEN_DEFAULT)
    ints = ("vocab_size", "d_model", "n_layers", "n_heads", "moe_experts", "moe_top_k", "moe_shared_experts")
    bad = [f for f in ints if not _is_int(m[f])] + ([] if _is_int(seq_len) else ["data.seq_len"])
    if bad:
        return None, f"{', '.join(bad)}: not a whole number"
    params = _active_non_embedding_params(m)
    heads, head_dim, layers = m["n_heads"], m["d_model"] // m["n_heads"], m["n_layers"]
    attention = 12 * layers * heads * head_dim * seq_len
    if m["attention"] == "mla":
        attention += 6 * layers * heads * _mla_dims(m)[1] * seq_len
    return float(6 * params + attention), ""


def run_flops(config: dict, summary: dict | None) -> tuple[float | None, str]:
    """(the FLOPs a finished run trained on, "") or (None, why): summary.json's `flops` where the run recorded it,
    else flops_per_token(config) x its tokens."""
    summary = summary or {}
    if _is_number(summary.get("flops")):
        return float(summary["flops"]), ""
    if not _is_number(summary.get("tokens")):
        return None, "summary.json records no tokens"
    per_token, why = flops_per_token(config)
    return (None, why) if per_token is None else (per_token * summary["tokens"], "")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _norm(m: dict, dim: int) -> int:
    """RMSNorm: a scale per dim; LayerNorm: a scale and a bias."""
    return dim if m["norm"] == "rmsnorm" else 2 * dim


def _ffn_dim(m: dict, kind: str) -> int:
    """ModelConfig.ffn_dim for a feed-forward of `kind` (a MoE model's dense layers are SwiGLU of the same width)."""
    if m["ffn_hidden"]:
        return m["ffn_hidden"]
    if kind in ("swiglu", "moe"):
        return -(-(8 * m["d_model"] // 3) // 32) * 32
    return 4 * m["d_model"]


def _mla_dims(m: dict) -> tuple[int, int]:
    """model.mla_dims: (kv_lora_rank, qk_rope_dim) with their defaults."""
    head_dim = m["d_model"] // m["n_heads"]
    rope = max(head_dim // 4 * 2, 2) if m["pos"] == "rope" else 0
    return m["kv_lora_rank"] or 4 * head_dim, rope if m["qk_rope_dim"] is None else m["qk_rope_dim"]


def _attention_params(m: dict) -> int:
    d, heads = m["d_model"], m["n_heads"]
    head_dim = d // heads
    if m["attention"] == "mla":
        kv_rank, rope = _mla_dims(m)
        q_rank = m["q_lora_rank"]
        queries = (d * q_rank + _norm(m, q_rank) if q_rank else 0) + (q_rank or d) * heads * (head_dim + rope)
        keys_values = d * (kv_rank + rope) + _norm(m, kv_rank) + kv_rank * heads * 2 * head_dim
        return queries + keys_values + heads * head_dim * d
    kv_heads = m["n_kv_heads"] or heads
    qk_norm = 2 * _norm(m, head_dim) if m["qk_norm"] else 0
    return 2 * d * heads * head_dim + 2 * d * kv_heads * head_dim + qk_norm


def _active_non_embedding_params(m: dict) -> int:
    """Transformer.num_params(exclude_embedding=True, active=True) counted from the fields."""
    d = m["d_model"]
    total = m["vocab_size"] * d + _norm(m, d)  # the output projection (a tied one too) and the final norm
    for i in range(m["n_layers"]):
        total += 2 * _norm(m, d) + _attention_params(m)
        if m["ffn"] == "moe" and (i + 1) % m["moe_every"] == 0:
            expert = 3 * d * (m["moe_hidden"] or _ffn_dim(m, "moe"))  # SwiGLU: up, gate, down
            total += d * m["moe_experts"] + (m["moe_top_k"] + m["moe_shared_experts"]) * expert  # router, experts
        else:
            kind = "swiglu" if m["ffn"] == "moe" else m["ffn"]
            total += (3 if kind == "swiglu" else 2) * d * _ffn_dim(m, kind)
    return total
