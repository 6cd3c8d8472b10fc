"""One decoder-only transformer whose architecture knobs are ModelConfig fields.

Read top to bottom: norms, rotary positions, attention (MHA/GQA/MQA, optional QK-norm, intra-document mask),
feed-forward (SwiGLU/GeLU/ReLU), block, model. Each module initialises its own weights (`init_weights`). The model's
entry points are `forward` (logits), `loss` (training), `per_token_loss` (validation) and `stability_stats`
(diagnostics); it knows nothing of parallelism (see parallel.py, which registers the last three with FSDP2).
Beside attention, latent attention (attention="mla"); beside the feed-forward, a mixture of experts (ffn="moe": the
layer, its router and experts in components/moe.py). model.parametrization's multipliers (components/
parametrization.py) enter at four places: the hidden matrices' init, the attention scale, each residual branch and
the logits (on the final norm's output).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.components import registry
from ablate.config import ModelConfig

# The fused ops go through one dispatch (Triton on CUDA when cfg.kernels="triton", torch references otherwise);
# apply_rope is re-exported here with kernels="torch" as its default.
from ablate.kernels import apply_rope, linear_cross_entropy, per_token_cross_entropy, rms_norm, swiglu
from ablate.components.moe import MoE, Router
from ablate.components import parametrization
from ablate.components.parametrization import residual_init_std
from ablate.components import score_mods  # noqa: F401  (the shipped score_mods register themselves)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (same parameter, same checkpoints) computed through the kernels dispatch."""

    def __init__(self, dim: int, eps: float, kernels: str):
        super().__init__(dim, eps=eps)
        self.kernels = kernels

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps, kernels=self.kernels)


def rmsnorm(cfg: ModelConfig, dim: int) -> nn.Module:
    return RMSNorm(dim, cfg.norm_eps, cfg.kernels)


def layernorm(cfg: ModelConfig, dim: int) -> nn.Module:
    return nn.LayerNorm(dim, eps=cfg.norm_eps)


registry.register("norm", "rmsnorm", rmsnorm)
registry.register("norm", "layernorm", layernorm)


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    """model.norm's module over `dim` features: a registered class (or factory) `cls(config, dim)`, whose
    `reset_parameters()` sets its init (the identity map for the shipped ones)."""
    return registry.lookup("norm", cfg.norm).obj(cfg, dim)


def rope_tables(head_dim: int, rotary_dim: int, seq_len: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (seq_len, rotary_dim // 2) for the first `rotary_dim` dims of each head."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


HALF_DTYPES = (torch.float16, torch.bfloat16)
STATS_CHUNK_ELEMENTS = 2**24  # stability_stats' score and logit chunks on CPU: 64 MB of fp32 at most
GPU_STATS_CHUNK_ELEMENTS = 2**27  # on a GPU, 512 MB: a few launches per layer, not hundreds


def stats_chunk_elements(device: torch.device) -> int:
    return STATS_CHUNK_ELEMENTS if device.type == "cpu" else GPU_STATS_CHUNK_ELEMENTS


def stability_fields(values: list[float], positions: int) -> dict[str, float]:
    """Transformer.stability_values read to the host, by name (`positions`: the tokens they were measured on)."""
    *maxima, norm_sum = values
    stats = {"max_attention_logit": max(maxima), "output_logit_norm": norm_sum / positions}
    return stats | {f"attention_logit_max/layer{i}": value for i, value in enumerate(maxima)}


def attention_logit_max(
    q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None = None, scale: float | None = None
) -> torch.Tensor:
    """The largest pre-softmax logit q.k / sqrt(head_dim) (or q.k x `scale`, the parametrization's) over the (query,
    key) pairs that may attend (causal, or True in the boolean `attn_mask` (B, 1, S, S)), over every head. q is
    (B, H, S, head_dim), k (B, H_kv, S, head_dim). A chunk of queries at a time: the (B, H, S, S) scores never whole."""
    batch, heads, seq, head_dim = q.shape
    keys = k.repeat_interleave(heads // k.shape[1], dim=1).float().transpose(-1, -2)  # each query head's kv head
    rows = max(1, stats_chunk_elements(q.device) // (batch * heads * seq))
    key_pos = torch.arange(seq, device=q.device)
    best = torch.tensor(float("-inf"), device=q.device)
    for start in range(0, seq, rows):
        scores = q[:, :, start : start + rows].float() @ keys
        scores = scores / math.sqrt(head_dim) if scale is None else scores * scale
        if attn_mask is None:
            allowed = key_pos[None, :] <= key_pos[start : start + rows, None]
        else:
            allowed = attn_mask[:, :, start : start + rows]
        best = torch.maximum(best, scores.masked_fill(~allowed, float("-inf")).amax())
    return best


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, use_rope: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.use_rope, self.kernels = use_rope, cfg.kernels
        self.init_std, self.out_init_std = cfg.init_std, residual_init_std(cfg)
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        # QK-norm (OLMo 2 / Gemma style): normalize each head's queries and keys to keep attention logits bounded.
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.dropout = cfg.dropout
        # model.score_mod: a FlexAttention-style score_mod(score, b, h, q_idx, kv_idx) applied before the softmax
        self.score_mod = registry.lookup("score_mod", cfg.score_mod).obj(cfg) if cfg.score_mod else None
        # q.k's scale: None (1/sqrt(head_dim)) but under mup/completep away from the base width
        self.scale = parametrization.attention_scale(cfg, cfg.head_dim, parametrization.base_config(cfg).head_dim)

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) for q, k, v; o_proj writes into the residual stream: the smaller residual std.
        Drawn in the order q, k, v, o: the order every earlier run's weights were drawn in."""
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=self.init_std, generator=generator)
        nn.init.normal_(self.o_proj.weight, mean=0.0, std=self.out_init_std, generator=generator)
        for norm in (self.q_norm, self.k_norm):
            if norm is not None:
                norm.reset_parameters()  # scale 1 (and bias 0): the identity map

    def forward(self, x, cos, sin, attn_mask=None):
        return self.attend(*self.project(x, cos, sin), attn_mask)

    def project(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, S, head_dim), keys and values (B, H_kv, S, head_dim), QK-norm and RoPE applied."""
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # per head, before the transpose: contiguous rows for the norm kernel
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, S, head_dim)
        if self.use_rope:
            q, k = apply_rope(q, cos, sin, kernels=self.kernels), apply_rope(k, cos, sin, kernels=self.kernels)
        return q, k, v

    def attend(self, q, k, v, attn_mask=None) -> torch.Tensor:
        """Scaled dot-product attention of `project`'s output, then the output projection: (B, S, d_model)."""
        batch, _, seq, _ = q.shape
        # GQA/MQA: each kv head serves a group of query heads. SDPA's enable_gqa skips copying K and V per group
        # (same values; measured ~7% faster forward + backward on CPU), but on CUDA only flash attention takes it,
        # and flash takes no mask and no fp32: there the copy keeps the masked and fp32 cases off the math backend.
        grouped = self.n_kv_heads != self.n_heads
        native_gqa = grouped and (q.device.type == "cpu" or (attn_mask is None and q.dtype in HALF_DTYPES))
        if self.score_mod is not None:
            dropout = self.dropout if self.training else 0.0
            out = modified_attention(q, k, v, self.score_mod, attn_mask, dropout, self.scale)
            return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))
        if grouped and not native_gqa:
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            is_causal=attn_mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=native_gqa,
            scale=self.scale,
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


@functools.cache
def causal_block_mask(seq: int, device: str):
    """FlexAttention's causal BlockMask for `seq` positions, made once per length and device (not every forward)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, seq, seq, device)


def modified_attention(q, k, v, score_mod, attn_mask=None, dropout: float = 0.0, scale=None) -> torch.Tensor:
    """Causal (or `attn_mask`) attention whose scores q.k/sqrt(head_dim) (or q.k x `scale`) pass through
    `score_mod(score, b, h, q_idx, kv_idx)` before the softmax. On CUDA without a mask, FlexAttention (one fused
    kernel under torch.compile, no (S, S) scores held); elsewhere the scores written out, the index arguments
    broadcast as (B,1,1,1), (1,H,1,1), (1,1,S,1), (1,1,1,S), so the same function serves both. q (B, H, S, d),
    k and v (B, H_kv, S, d)."""
    batch, heads, seq, head_dim = q.shape
    if q.is_cuda and attn_mask is None and dropout == 0.0:
        from torch.nn.attention.flex_attention import flex_attention

        causal = causal_block_mask(seq, str(q.device))
        grouped = k.shape[1] != heads
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=causal, scale=scale, enable_gqa=grouped)
    repeat = heads // k.shape[1]
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    scores = (q @ k.transpose(-1, -2)).float()
    scores = scores / math.sqrt(head_dim) if scale is None else scores * scale
    index = [torch.arange(n, device=q.device) for n in (batch, heads, seq, seq)]
    shaped = [i.view([-1 if d == axis else 1 for d in range(4)]) for axis, i in enumerate(index)]
    scores = score_mod(scores, *shaped)
    allowed = attn_mask if attn_mask is not None else shaped[2] >= shaped[3]
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1).to(v.dtype)
    return F.dropout(probs, dropout) @ v if dropout else probs @ v


def mla_dims(cfg: ModelConfig) -> tuple[int, int]:
    """MLA's (kv_lora_rank, qk_rope_dim) with their defaults: 4 * head_dim, and head_dim // 2 made even (0 with
    pos="nope")."""
    rope = max(cfg.head_dim // 4 * 2, 2) if cfg.pos == "rope" else 0
    return cfg.kv_lora_rank or 4 * cfg.head_dim, rope if cfg.qk_rope_dim is None else cfg.qk_rope_dim


def rotary_dim(cfg: ModelConfig) -> int:
    """The dims of a query/key head that RoPE rotates (MLA: its RoPE part): the width of the RoPE tables."""
    return mla_dims(cfg)[1] if cfg.attention == "mla" else int(cfg.head_dim * cfg.rope_fraction) // 2 * 2


class LatentAttention(nn.Module):
    """DeepSeek-V2's multi-head latent attention (attention="mla"). Keys and values come from one latent per token,
    c = norm(W_dkv x), kv_lora_rank wide: each head's key and value are up-projections of it, so a KV cache keeps c
    alone. RoPE would not commute with that up-projection, so positions ride on a separate qk_rope_dim-wide key part
    W_kr x shared by every head, beside the no-RoPE part ("decoupled RoPE"), and on a matching part of each query.
    Queries: W_q x, or W_uq norm(W_dq x) with q_lora_rank. Per head: query and key head_dim + qk_rope_dim wide, value
    head_dim. A KV cache holds kv_lora_rank + qk_rope_dim numbers per token and layer."""

    def __init__(self, cfg: ModelConfig, use_rope: bool):
        super().__init__()
        self.n_heads, self.head_dim, (self.kv_rank, self.rope_dim) = cfg.n_heads, cfg.head_dim, mla_dims(cfg)
        self.use_rope, self.kernels, self.dropout = use_rope, cfg.kernels, cfg.dropout
        self.init_std, self.out_init_std = cfg.init_std, residual_init_std(cfg)
        rank = cfg.q_lora_rank
        self.q_down = nn.Linear(cfg.d_model, rank, bias=False) if rank else None
        self.q_norm = make_norm(cfg, rank) if rank else None
        self.q_proj = nn.Linear(rank or cfg.d_model, cfg.n_heads * (cfg.head_dim + self.rope_dim), bias=False)
        self.kv_down = nn.Linear(cfg.d_model, self.kv_rank + self.rope_dim, bias=False)  # the latent, the RoPE key
        self.kv_norm = make_norm(cfg, self.kv_rank)
        self.kv_up = nn.Linear(self.kv_rank, cfg.n_heads * 2 * cfg.head_dim, bias=False)  # keys and values
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        base = parametrization.base_config(cfg)
        self.scale = parametrization.attention_scale(
            cfg, cfg.head_dim + self.rope_dim, base.head_dim + mla_dims(base)[1]
        )

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std), o_proj the smaller residual std; drawn q_down, q_proj, kv_down, kv_up, o_proj."""
        for proj in (self.q_down, self.q_proj, self.kv_down, self.kv_up):
            if proj is not None:
                nn.init.normal_(proj.weight, mean=0.0, std=self.init_std, generator=generator)
        nn.init.normal_(self.o_proj.weight, mean=0.0, std=self.out_init_std, generator=generator)
        for norm in (self.q_norm, self.kv_norm):
            if norm is not None:
                norm.reset_parameters()

    def forward(self, x, cos, sin, attn_mask=None):
        return self.attend(*self.project(x, cos, sin), attn_mask)

    def project(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries and keys (B, H, S, head_dim + qk_rope_dim), values (B, H, S, head_dim), RoPE applied."""
        batch, seq, _ = x.shape
        q = self.q_proj(x if self.q_down is None else self.q_norm(self.q_down(x)))
        q_nope, q_rope = q.view(batch, seq, self.n_heads, -1).transpose(1, 2).split([self.head_dim, self.rope_dim], -1)
        latent, k_rope = self.kv_down(x).split([self.kv_rank, self.rope_dim], dim=-1)
        kv = self.kv_up(self.kv_norm(latent)).view(batch, seq, self.n_heads, -1).transpose(1, 2)
        k_nope, v = kv.split(self.head_dim, dim=-1)
        k_rope = k_rope[:, None]  # (B, 1, S, qk_rope_dim): one for every head
        if self.use_rope:
            q_rope, k_rope = (
                apply_rope(q_rope, cos, sin, kernels=self.kernels),
                apply_rope(k_rope, cos, sin, kernels=self.kernels),
            )
        k = torch.cat([k_nope, k_rope.expand(-1, self.n_heads, -1, -1)], dim=-1)
        return torch.cat([q_nope, q_rope], dim=-1), k, v

    def attend(self, q, k, v, attn_mask=None) -> torch.Tensor:
        """Scaled dot-product attention (scale 1/sqrt(head_dim + qk_rope_dim), or the parametrization's), then the
        output projection."""
        batch, _, seq, _ = q.shape
        dropout = self.dropout if self.training else 0.0
        # SDPA's fused kernels take values only as wide as the queries (else the math backend, with its (S, S)
        # scores): zero columns added to the values give zero columns of output, dropped after
        v = F.pad(v, (0, self.rope_dim))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None, dropout_p=dropout, scale=self.scale
        )
        return self.o_proj(out[..., : self.head_dim].transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU, GeLU or ReLU by model.ffn (the shipped dense FFNs); an FFN component is `cls(config, layer_index)`."""

    def __init__(self, cfg: ModelConfig, layer_index: int = 0):
        super().__init__()
        self.kind, self.kernels = cfg.ffn, cfg.kernels
        self.init_std, self.out_init_std = cfg.init_std, residual_init_std(cfg)
        hidden = cfg.ffn_dim
        self.up_proj = nn.Linear(cfg.d_model, hidden, bias=False)
        self.gate_proj = nn.Linear(cfg.d_model, hidden, bias=False) if cfg.ffn == "swiglu" else None
        self.down_proj = nn.Linear(hidden, cfg.d_model, bias=False)

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) for up (and gate); down_proj writes into the residual stream: the smaller residual std.
        Drawn in the order up, gate, down: the order every earlier run's weights were drawn in."""
        for proj in (self.up_proj, self.gate_proj):
            if proj is not None:
                nn.init.normal_(proj.weight, mean=0.0, std=self.init_std, generator=generator)
        nn.init.normal_(self.down_proj.weight, mean=0.0, std=self.out_init_std, generator=generator)

    def forward(self, x):
        if self.kind == "swiglu":
            h = swiglu(self.gate_proj(x), self.up_proj(x), kernels=self.kernels)
        elif self.kind == "gelu":
            h = F.gelu(self.up_proj(x), approximate="tanh")
        else:
            h = F.relu(self.up_proj(x))
        return self.down_proj(h)


def moe_layer(cfg: ModelConfig, layer_index: int) -> nn.Module:
    """ffn="moe": experts in layers k, 2k, ... (moe_every=k), dense SwiGLU layers between them."""
    if layer_has_experts(cfg, layer_index):
        return MoE(cfg)
    return FeedForward(dataclasses.replace(cfg, ffn="swiglu"), layer_index)


for _name in ("swiglu", "gelu", "relu"):
    registry.register("ffn", _name, FeedForward)
registry.register("ffn", "moe", moe_layer)
# read by setup.checks.cuda_graphs_refusal: a component says so where its forward cannot be captured
moe_layer.cuda_graphs = False
moe_layer.cuda_graphs_why = (
    "its routing's shapes follow the data (without torch._grouped_mm the experts' row counts are read on the host)"
)


def init_component(module: nn.Module, std: float, generator: torch.Generator | None) -> None:
    """A component's init: its own `init_weights(generator)` or `reset_parameters()`; else Normal(0, std) for
    each weight of two or more dims and zeros for the rest (biases), in parameter order."""
    if hasattr(module, "init_weights"):
        module.init_weights(generator)
    elif hasattr(module, "reset_parameters"):
        module.reset_parameters()
    else:
        for param in module.parameters():
            if param.dim() >= 2:
                nn.init.normal_(param, 0.0, std, generator=generator)
            else:
                nn.init.zeros_(param)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, use_rope: bool, layer_index: int = 0):
        super().__init__()
        self.attn_norm = make_norm(cfg, cfg.d_model)
        self.attn = LatentAttention(cfg, use_rope) if cfg.attention == "mla" else Attention(cfg, use_rope)
        self.ffn_norm = make_norm(cfg, cfg.d_model)
        self.ffn = registry.lookup("ffn", cfg.ffn).obj(cfg, layer_index)  # model.ffn's component
        self.init_std = cfg.init_std
        self.dropout = nn.Dropout(cfg.dropout)
        self.residual = parametrization.residual_multiplier(cfg)  # each branch's multiplier: 1/L under completep

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        self.attn_norm.reset_parameters()  # norms start as the identity map and draw no random numbers
        self.attn.init_weights(generator)
        self.ffn_norm.reset_parameters()
        init_component(self.ffn, self.init_std, generator)

    def forward(self, x, cos, sin, attn_mask=None, *, logit_max: bool = False):
        """The block's output; with `logit_max`, also the largest pre-softmax attention logit of this layer."""
        q, k, v = self.attn.project(self.attn_norm(x), cos, sin)
        x = x + self.branch(self.attn.attend(q, k, v, attn_mask))
        x = x + self.branch(self.ffn(self.ffn_norm(x)))
        return (x, attention_logit_max(q, k, attn_mask, self.attn.scale)) if logit_max else x

    def branch(self, out: torch.Tensor) -> torch.Tensor:
        """A residual branch's output as it joins the stream: dropout, then the parametrization's multiplier."""
        out = self.dropout(out)
        return out if self.residual == 1.0 else out * self.residual

    def forward_with_logit_max(self, x, cos, sin, attn_mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward(..., logit_max=True)` for Transformer.stability_stats, under a name of its own so FSDP2 can
        gather the block's parameters for it (parallel.py registers it) and a compiled block runs it uncompiled."""
        return self.forward(x, cos, sin, attn_mask, logit_max=True)


def layer_uses_rope(cfg: ModelConfig, i: int) -> bool:
    """Layer i (0-based) applies RoPE unless pos="nope" or it is one of layers k, 2k, ... (1-based) for
    rope_skip_every=k (Llama 4 style NoPE interleaving)."""
    return cfg.pos == "rope" and not (cfg.rope_skip_every and (i + 1) % cfg.rope_skip_every == 0)


def layer_has_experts(cfg: ModelConfig, i: int) -> bool:
    """Layer i (0-based) is a mixture of experts: with ffn="moe", layers k, 2k, ... (1-based) for moe_every=k."""
    return cfg.ffn == "moe" and (i + 1) % cfg.moe_every == 0


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len: int):
        super().__init__()
        parametrization.check_parametrization(cfg)  # base sizes that define the scaling, before any layer
        self.cfg, self.max_seq_len = cfg, max_seq_len
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, layer_uses_rope(cfg, i), i) for i in range(cfg.n_layers))
        self.norm = make_norm(cfg, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        rotary_pairs = max(rotary_dim(cfg) // 2, 1)
        # Not persistent: recomputed from the config, so they never enter checkpoints (and survive to_empty).
        self.register_buffer("rope_cos", torch.empty(max_seq_len, rotary_pairs), persistent=False)
        self.register_buffer("rope_sin", torch.empty(max_seq_len, rotary_pairs), persistent=False)
        # How many chunks the training loss splits its rows into (ablate.kernels.loss_chunks, chosen once per run
        # from the device and its free memory); None: the CPU rule, a chunk of rows sized for the caches.
        self.loss_chunks: int | None = None
        self.logit_multiplier = parametrization.logit_multiplier(cfg)  # 1/m under mup/completep
        self.reset_buffers()

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) for the embedding and an untied output projection; each block initialises its own
        (output projections smaller, see residual_init_std). The draws go embedding, blocks in order, head: the
        order of every earlier run, so a seed still gives the same weights."""
        nn.init.normal_(self.embed.weight, mean=0.0, std=self.cfg.init_std, generator=generator)
        for layer in self.layers:
            layer.init_weights(generator)
        self.norm.reset_parameters()
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=self.cfg.init_std, generator=generator)
        for name, shape in (self.base_shapes() or {}).items():  # mup/completep: hidden matrices by their fan-in
            param = self.get_parameter(name)
            if name not in ("embed.weight", "lm_head.weight") and param.ndim >= 2 and shape != param.shape:
                with torch.no_grad():
                    param.mul_(parametrization.hidden_init_multiplier(tuple(param.shape), tuple(shape)))
        self.reset_buffers()

    def base_shapes(self) -> dict[str, torch.Size] | None:
        """{parameter name: its shape in the model at model.base_width}, the fan-ins that init and lr scale
        against under mup/completep (built on the meta device, no storage); None under sp."""
        if not parametrization.scales_width(self.cfg):
            return None
        with torch.device("meta"):
            base = Transformer(parametrization.base_config(self.cfg), self.max_seq_len)
        return {name: param.shape for name, param in base.named_parameters()}

    def reset_buffers(self) -> None:
        cos, sin = rope_tables(self.cfg.head_dim, max(rotary_dim(self.cfg), 2), self.max_seq_len, self.cfg.rope_base)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def layer_inputs(
        self,
        tokens: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ):
        """(embedded tokens, cos, sin, attention mask): what every block takes. `positions` (B, S) and a boolean
        `attn_mask` (B, 1, S, S), True = may attend, let the eval engine pack several continuations after one shared
        context; training uses neither."""
        if doc_ids is not None:  # causal and within one document: (B, 1, S, S) boolean, True = may attend
            seq = tokens.shape[1]
            causal = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).tril()
            attn_mask = ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]
        cos, sin = self.rope_cos, self.rope_sin
        if positions is not None:
            cos, sin = cos[positions][:, None], sin[positions][:, None]
        return self.embed(tokens), cos, sin, attn_mask

    def hidden_states(
        self,
        tokens: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The final norm's output (B, S, d_model): what the output projection takes. Arguments as `layer_inputs`."""
        x, cos, sin, attn_mask = self.layer_inputs(tokens, doc_ids, positions=positions, attn_mask=attn_mask)
        for layer in self.layers:
            x = layer(x, cos, sin, attn_mask)
        # the logits' multiplier (mup/completep) on what the head takes: the same product, and every path (loss,
        # validation, eval, stability stats) gets it
        return self.norm(x) if self.logit_multiplier == 1.0 else self.norm(x) * self.logit_multiplier

    # The entry points. Under FSDP2 only `forward` gathers the root's parameters (embedding, final norm, output
    # projection) by itself: parallel.parallelize registers the others, and they call hidden_states, not self(...).

    def forward(
        self,
        tokens: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        select: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Token ids (B, S) -> logits (B, S, vocab); with `select` (batch index, position index), the logits
        (T, vocab) at those positions only (eval scores a few). `positions`, `attn_mask` as in `layer_inputs`."""
        hidden = self.hidden_states(tokens, doc_ids, positions=positions, attn_mask=attn_mask)
        if select is not None:
            hidden = hidden[select]
        return self.lm_head(hidden)

    def loss(self, tokens, targets, doc_ids=None, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate: mean cross-entropy + z_loss * mean(logsumexp^2), cross-entropy alone for
        logging), over targets other than ignore_index."""
        hidden = self.hidden_states(tokens, doc_ids)
        # The output projection and the loss a chunk of tokens at a time: the full logits are never held.
        loss, ce = linear_cross_entropy(
            hidden,
            self.lm_head.weight,
            targets,
            ignore_index,
            self.cfg.z_loss,
            kernels=self.cfg.kernels,
            chunks=self.loss_chunks,
        )
        for router_loss in [layer.ffn.extra_loss for layer in self.layers if isinstance(layer.ffn, MoE)]:
            loss = loss + router_loss  # the MoE layers' balancing and router z-losses, as this forward left them
        return loss, ce

    @torch.no_grad()
    def per_token_loss(self, tokens, targets, doc_ids=None, ignore_index: int = -100) -> torch.Tensor:
        """The cross-entropy (B, S) of each position, 0 where ignored (validation; no z-loss, no gradient), a chunk
        of logits at a time."""
        return per_token_cross_entropy(self.hidden_states(tokens, doc_ids), self.lm_head.weight, targets, ignore_index)

    @torch.no_grad()
    def stability_stats(self, tokens, doc_ids=None) -> dict[str, float]:
        """What decides between QK-norm and z-loss, measured on one batch: `max_attention_logit`, the largest
        pre-softmax q.k/sqrt(head_dim) over every layer, head and allowed (query, key) pair (and per layer,
        `attention_logit_max/layer{i}`), and `output_logit_norm`, the mean over positions of the L2 norm of the
        output logits. Computed in eval mode (no dropout, so no random draws: training stays reproducible)."""
        return stability_fields(self.stability_values(tokens, doc_ids).tolist(), tokens.numel())  # one device read

    def stability_values(self, tokens, doc_ids=None) -> torch.Tensor:
        """stability_stats' figures on the device: each layer's attention logit max, then the output logits' norms
        summed over positions (a stack computes them for its members in one vmapped pass, training.stack_eval)."""
        was_training = self.training
        self.eval()
        try:
            x, cos, sin, attn_mask = self.layer_inputs(tokens, doc_ids)
            layer_maxima = []
            for layer in self.layers:
                x, logit_max = layer.forward_with_logit_max(x, cos, sin, attn_mask)
                layer_maxima.append(logit_max)
            hidden = self.norm(x).flatten(0, -2)
            rows = max(1, stats_chunk_elements(hidden.device) // self.cfg.vocab_size)  # a chunk of logits at a time
            norm_sum = sum(
                self.lm_head(hidden[start : start + rows]).float().norm(dim=-1).sum()
                for start in range(0, hidden.shape[0], rows)
            )
        finally:
            self.train(was_training)
        return torch.stack([*layer_maxima, norm_sum])

    def routers(self) -> dict[int, Router]:
        """The MoE layers' routers by layer index."""
        return {i: layer.ffn.router for i, layer in enumerate(self.layers) if isinstance(layer.ffn, MoE)}

    def num_params(self, exclude_embedding: bool = False, active: bool = False) -> int:
        """Parameters (a tied weight once); `active`: those one token uses, top_k of the routed experts counted."""
        total = sum(p.numel() for p in self.parameters())  # parameters() yields a tied weight once
        if exclude_embedding and not self.cfg.tie_embeddings:
            total -= self.embed.weight.numel()
        if active and self.cfg.ffn == "moe":
            routed = sum(
                p.numel() for layer in self.layers if isinstance(layer.ffn, MoE) for p in layer.ffn.experts.parameters()
            )
            total -= routed // self.cfg.moe_experts * (self.cfg.moe_experts - self.cfg.moe_top_k)
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """6N for the matmuls (the output projection included, the embedding lookup not) plus attention scores and
        values: 12 * layers * d_model * seq_len (PaLM's count, which does not halve for the causal mask). With experts,
        the active parameters; with MLA, queries and keys are qk_rope_dim wider."""
        n = self.num_params(exclude_embedding=True, active=True)
        attention = 12 * self.cfg.n_layers * self.cfg.n_heads * self.cfg.head_dim * seq_len
        if self.cfg.attention == "mla":
            attention += 6 * self.cfg.n_layers * self.cfg.n_heads * mla_dims(self.cfg)[1] * seq_len
        return 6 * n + attention

    def kv_cache_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        """What a KV cache keeps per token over every layer (bf16 by default): keys and values of each kv head
        (MHA/GQA/MQA: 2 x n_kv_heads x head_dim), or MLA's latent and RoPE key (kv_lora_rank + qk_rope_dim)."""
        m = self.cfg
        per_layer = sum(mla_dims(m)) if m.attention == "mla" else 2 * m.kv_heads * m.head_dim
        return per_layer * m.n_layers * bytes_per_value
