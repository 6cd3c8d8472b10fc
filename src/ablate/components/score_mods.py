"""The shipped attention score modifications (model.score_mod), each a class `cls(config)` whose call is
FlexAttention's score_mod: `(score, b, h, q_idx, kv_idx) -> score`, applied to q.k/sqrt(head_dim) before the
softmax (ablate.model.modified_attention). Written with broadcasting torch ops, so one function runs on the written-out
scores (CPU, stacks, a mask) and inside flex_attention (CUDA). A class's options are its `Options` dataclass, set
through model.options ({"softcap": 30.0}). A user's own registers the same way: @ablate.register_component("score_mod",
name).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.components import registry
from ablate.config import ModelConfig


class SoftCap:
    """Gemma 2's attention logit soft cap: cap * tanh(score / cap) keeps every logit inside (-cap, cap)."""

    @dataclass
    class Options:
        softcap: float = 50.0

    def __init__(self, cfg: ModelConfig):
        self.cap = registry.options_for(cfg, SoftCap).softcap
        if not self.cap > 0:
            raise registry.RegistryError(f"model.options.softcap: {self.cap!r}; allowed: a float > 0")

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.cap * torch.tanh(score / self.cap)


class ALiBi:
    """Press et al.'s linear biases: head h (of H) adds -m_h * (q_idx - kv_idx), m_h = 2^(-8 (h + 1) / H). Use with
    model.pos="nope" (it carries the positions itself)."""

    def __init__(self, cfg: ModelConfig):
        self.n_heads = cfg.n_heads

    def __call__(self, score, b, h, q_idx, kv_idx):
        slope = torch.exp2(-8.0 * (h + 1) / self.n_heads)
        return score - slope * (q_idx - kv_idx)


class SlidingWindow:
    """Local attention: a query sees only the `window` most recent keys (itself included)."""

    @dataclass
    class Options:
        window: int = 128

    def __init__(self, cfg: ModelConfig):
        self.window = registry.options_for(cfg, SlidingWindow).window
        if not self.window >= 1:
            raise registry.RegistryError(f"model.options.window: {self.window!r}; allowed: an int >= 1")

    def __call__(self, score, b, h, q_idx, kv_idx):
        return torch.where(q_idx - kv_idx < self.window, score, float("-inf"))


registry.register("score_mod", "softcap", SoftCap)
registry.register("score_mod", "alibi", ALiBi)
registry.register("score_mod", "sliding_window", SlidingWindow)
