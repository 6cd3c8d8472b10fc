"""One decoder-only transformer whose architecture knobs are ModelConfig fields.

Read top to bottom: norms, rotary positions, attention (MHA/GQA/MQA, optional QK-norm, intra-document mask),
feed-forward (SwiGLU/GeLU/ReLU), block, model, loss. The model knows nothing of parallelism (see parallel.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.config import ModelConfig
# The fused ops go through one dispatch (Triton on CUDA when cfg.kernels="triton", torch references otherwise);
# apply_rope is re-exported here with kernels="torch" as its default.
from ablate.kernels import apply_rope, linear_cross_entropy, per_token_cross_entropy, rms_norm, swiglu


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (same parameter, same checkpoints) computed through the kernels dispatch."""

    def __init__(self, dim: int, eps: float, kernels: str):
        super().__init__(dim, eps=eps)
        self.kernels = kernels

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps, kernels=self.kernels)


def make_norm(cfg: ModelConfig, dim: int) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(dim, cfg.norm_eps, cfg.kernels)
    return nn.LayerNorm(dim, eps=cfg.norm_eps)


def rope_tables(head_dim: int, rotary_dim: int, seq_len: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (seq_len, rotary_dim // 2) for the first `rotary_dim` dims of each head."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


HALF_DTYPES = (torch.float16, torch.bfloat16)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, use_rope: bool):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.use_rope, self.kernels = use_rope, cfg.kernels
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        # QK-norm (OLMo 2 / Gemma style): normalize each head's queries and keys to keep attention logits bounded.
        self.q_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim) if cfg.qk_norm else None
        self.dropout = cfg.dropout

    def forward(self, x, cos, sin, attn_mask=None):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:  # per head, before the transpose: contiguous rows for the norm kernel
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, S, head_dim)
        if self.use_rope:
            q, k = apply_rope(q, cos, sin, kernels=self.kernels), apply_rope(k, cos, sin, kernels=self.kernels)
        # GQA/MQA: each kv head serves a group of query heads. SDPA's enable_gqa skips copying K and V per group
        # (same values; measured ~7% faster forward + backward on CPU), but on CUDA only flash attention takes it,
        # and flash takes no mask and no fp32: there the copy keeps the masked and fp32 cases off the math backend.
        grouped = self.n_kv_heads != self.n_heads
        native_gqa = grouped and (q.device.type == "cpu" or (attn_mask is None and q.dtype in HALF_DTYPES))
        if grouped and not native_gqa:
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=native_gqa)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind, self.kernels = cfg.ffn, cfg.kernels
        hidden = cfg.ffn_dim
        self.up_proj = nn.Linear(cfg.d_model, hidden, bias=False)
        self.gate_proj = nn.Linear(cfg.d_model, hidden, bias=False) if cfg.ffn == "swiglu" else None
        self.down_proj = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x):
        if self.kind == "swiglu":
            h = swiglu(self.gate_proj(x), self.up_proj(x), kernels=self.kernels)
        elif self.kind == "gelu":
            h = F.gelu(self.up_proj(x), approximate="tanh")
        else:
            h = F.relu(self.up_proj(x))
        return self.down_proj(h)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, use_rope: bool):
        super().__init__()
        self.attn_norm = make_norm(cfg, cfg.d_model)
        self.attn = Attention(cfg, use_rope)
        self.ffn_norm = make_norm(cfg, cfg.d_model)
        self.ffn = FeedForward(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, cos, sin, attn_mask=None):
        x = x + self.dropout(self.attn(self.attn_norm(x), cos, sin, attn_mask))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_seq_len: int):
        super().__init__()
        self.cfg, self.max_seq_len = cfg, max_seq_len
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Layers k, 2k, ... (1-based) skip RoPE when rope_skip_every=k (Llama 4 style NoPE interleaving).
        self.layers = nn.ModuleList(
            Block(cfg, use_rope=cfg.pos == "rope" and not (cfg.rope_skip_every and (i + 1) % cfg.rope_skip_every == 0))
            for i in range(cfg.n_layers))
        self.norm = make_norm(cfg, cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        rotary_pairs = max(int(cfg.head_dim * cfg.rope_fraction) // 2, 1)
        # Not persistent: recomputed from the config, so they never enter checkpoints (and survive to_empty).
        self.register_buffer("rope_cos", torch.empty(max_seq_len, rotary_pairs), persistent=False)
        self.register_buffer("rope_sin", torch.empty(max_seq_len, rotary_pairs), persistent=False)
        self.reset_buffers()

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, init_std) for matrices; output projections scaled by 1/sqrt(2*n_layers) (GPT-2)."""
        std = self.cfg.init_std
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                if module is self.lm_head and self.cfg.tie_embeddings:
                    continue
                scale = 1 / math.sqrt(2 * self.cfg.n_layers) if name.endswith(("o_proj", "down_proj")) else 1.0
                nn.init.normal_(module.weight, mean=0.0, std=std * scale, generator=generator)
            elif isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        self.reset_buffers()

    def reset_buffers(self) -> None:
        rotary_dim = int(self.cfg.head_dim * self.cfg.rope_fraction) // 2 * 2
        cos, sin = rope_tables(self.cfg.head_dim, max(rotary_dim, 2), self.max_seq_len, self.cfg.rope_base)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def hidden_states(self, tokens: torch.Tensor, doc_ids: torch.Tensor | None = None, *,
                      positions: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`positions` (B, S) and a boolean `attn_mask` (B, 1, S, S), True = may attend, let the eval engine pack
        several continuations after one shared context; training uses neither."""
        if doc_ids is not None:  # causal and within one document: (B, 1, S, S) boolean, True = may attend
            seq = tokens.shape[1]
            causal = torch.ones(seq, seq, dtype=torch.bool, device=tokens.device).tril()
            attn_mask = ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]
        cos, sin = self.rope_cos, self.rope_sin
        if positions is not None:
            cos, sin = cos[positions][:, None], sin[positions][:, None]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, attn_mask)
        return self.norm(x)

    def forward(self, tokens: torch.Tensor, doc_ids: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                targets: torch.Tensor | None = None, ignore_index: int = -100,
                select: tuple[torch.Tensor, torch.Tensor] | None = None, per_token: bool = False):
        """Token ids (B, S) -> logits (B, S, vocab); with `select` (batch index, position index), the logits (T, vocab)
        at those positions only (eval scores a few); with `targets`, (loss, cross-entropy) as in `loss` instead, or
        with `per_token` too, the cross-entropy (B, S) of each position (validation; no z-loss, no gradient)."""
        hidden = self.hidden_states(tokens, doc_ids, positions=positions, attn_mask=attn_mask)
        if select is not None:
            hidden = hidden[select]
        if targets is None:
            return self.lm_head(hidden)
        if per_token:
            return per_token_cross_entropy(hidden, self.lm_head.weight, targets, ignore_index)
        # The output projection and the loss a chunk of tokens at a time: the full logits are never held.
        return linear_cross_entropy(hidden, self.lm_head.weight, targets, ignore_index, self.cfg.z_loss,
                                    kernels=self.cfg.kernels)

    def loss(self, tokens, targets, doc_ids=None, ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss to backpropagate: mean cross-entropy + z_loss * mean(logsumexp^2), cross-entropy alone for
        logging), over targets other than ignore_index."""
        # through __call__, so FSDP2's hooks gather the root parameters (the output projection among them)
        return self(tokens, doc_ids, targets=targets, ignore_index=ignore_index)

    def num_params(self, exclude_embedding: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())  # parameters() yields a tied weight once
        if exclude_embedding and not self.cfg.tie_embeddings:
            total -= self.embed.weight.numel()
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """6N for the matmuls (the output projection included, the embedding lookup not) plus attention scores and
        values: 12 * layers * d_model * seq_len (PaLM's count, which does not halve for the causal mask)."""
        n = self.num_params(exclude_embedding=True)
        return 6 * n + 12 * self.cfg.n_layers * self.cfg.n_heads * self.cfg.head_dim * seq_len
