"""Per-item metrics from one pass of log-likelihoods, and their means with standard errors.

Accuracies differ only in how a choice's log-likelihood is normalized before the argmax: none (raw), per token,
per character (lm-eval's acc_norm), or PMI (minus the log-likelihood of the same continuation after a bare
"Answer:"). The unconditional pass alone gives choices-only accuracy: how far answer priors go without the question.
The continuous metrics (gold log-probability, bits per byte, probability mass, margins) move before accuracy does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ACCURACIES = ("acc_raw", "acc_per_token", "acc_per_char", "acc_pmi", "acc_choices_only")
CONTINUOUS = ("gold_logprob", "gold_bpb", "gold_prob", "margin", "margin_pmi")
METRICS = ACCURACIES + CONTINUOUS


@dataclass
class ItemScores:
    """Everything the engine measured for one item, one entry per choice."""
    logprobs: list[float]  # log P(continuation | context)
    unconditional: list[float]  # log P(continuation | "Answer:")
    tokens: list[int]
    chars: list[int]
    bytes: list[int]
    gold: int


def predictions(s: ItemScores) -> dict[str, int]:
    """The chosen index under each normalization (ties go to the first choice, as in lm-eval)."""
    ll, uncond = np.asarray(s.logprobs), np.asarray(s.unconditional)
    return {"raw": int(np.argmax(ll)),
            "per_token": int(np.argmax(ll / np.maximum(s.tokens, 1))),
            "per_char": int(np.argmax(ll / np.maximum(s.chars, 1))),
            "pmi": int(np.argmax(ll - uncond)),
            "choices_only": int(np.argmax(uncond))}


def item_metrics(s: ItemScores) -> dict[str, float]:
    ll, uncond = np.asarray(s.logprobs, dtype=np.float64), np.asarray(s.unconditional, dtype=np.float64)
    pred = predictions(s)
    g = s.gold
    wrong = [i for i in range(len(ll)) if i != g]
    probs = np.exp(ll - ll.max())
    pmi = ll - uncond
    row = {f"acc_{name}": float(pred[name] == g) for name in ("raw", "per_token", "per_char", "pmi", "choices_only")}
    row.update(gold_logprob=float(ll[g]),
               gold_bpb=float(-ll[g] / (math.log(2) * max(s.bytes[g], 1))),
               gold_prob=float(probs[g] / probs.sum()),
               margin=float(ll[g] - ll[wrong].mean()) if wrong else 0.0,
               margin_pmi=float(pmi[g] - pmi[wrong].mean()) if wrong else 0.0)
    return row


def aggregate(rows: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """(mean of each metric, its standard error std/sqrt(n) with the sample std, as lm-eval reports)."""
    means, stderrs = {}, {}
    for name in METRICS:
        values = np.asarray([r[name] for r in rows], dtype=np.float64)
        means[name] = float(values.mean()) if len(values) else math.nan
        stderrs[name] = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return means, stderrs
