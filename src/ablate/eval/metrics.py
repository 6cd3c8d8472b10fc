"""Per-item metrics from one pass of log-likelihoods, and their means with standard errors.

A task is of one of two kinds, and its kind fixes its metrics (METRICS_BY_KIND):
- "choice": pick one of several continuations. Accuracies differ only in how a choice's log-likelihood is
  normalized before the argmax: none (raw), per token, per character (lm-eval's acc_norm), or PMI (minus the
  log-likelihood of the same continuation after a bare "Answer:"). The unconditional pass alone gives choices-only
  accuracy: how far answer priors go without the question. The continuous metrics (gold log-probability, bits per
  byte, probability mass, log-likelihood and PMI margins, DataDecide's correct/total/normalized probabilities and
  margin) move before accuracy does.
- "continuation": one gold continuation to score (LAMBADA's final word). Accuracy is whether greedy decoding
  would produce it (every token the argmax: chance 0); the rest measure how likely it is. Metrics across choices
  (margins, shares of probability, choices-only) do not exist for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# "Characters" (acc_per_char and every per-character probability below) are len(continuation) of the scored
# request as the task builds it: a cloze answer " Paris" counts its leading space (6). lm-eval's acc_norm divides by
# len() of doc_to_choice's strings: the same count under ablate's lm-eval configs (their choices carry the space,
# target_delimiter ""), one less per choice under lm-eval's own configs (ARC, HellaSwag: the delimiter " " is not
# counted); for a task whose choices differ in their context (WinoGrande) it divides by the contexts' lengths.
ACCURACIES = ("acc_raw", "acc_per_token", "acc_per_char", "acc_pmi", "acc_choices_only")
# correct_prob, margin, total_prob, norm_correct_prob: DataDecide's CORRECT_PROB, MARGIN, TOTAL_PROB and
# NORM_CORRECT_PROB, each per character (their *_per_char): built from exp(log-likelihood / characters), the
# continuation's geometric-mean probability per character, so answers of different lengths are on one scale.
# margin_loglik and margin_pmi are ablate's: the gold choice's log-likelihood (or PMI) minus the wrong choices' mean.
CONTINUOUS = (
    "gold_logprob",
    "gold_bpb",
    "gold_prob",
    "margin_loglik",
    "margin_pmi",
    "correct_prob",
    "margin",
    "total_prob",
    "norm_correct_prob",
)
METRICS = ACCURACIES + CONTINUOUS  # a choice task's
CONTINUATION_METRICS = ("acc_greedy", "gold_logprob", "gold_bpb", "correct_prob")
METRICS_BY_KIND = {"choice": METRICS, "continuation": CONTINUATION_METRICS}
KINDS = tuple(METRICS_BY_KIND)
ALL_METRICS = tuple(dict.fromkeys(METRICS + CONTINUATION_METRICS))
# the metrics that need log P(answer | "Answer:"): a choice task runs that unconditional pass only for these
UNCONDITIONAL_METRICS = ("acc_pmi", "acc_choices_only", "margin_pmi")
# the same whichever choice is gold: the report shows them as diagnostics and never decides a task with one
ANSWER_BLIND = ("total_prob",)


def needs_unconditional(names: tuple[str, ...]) -> bool:
    return any(name in UNCONDITIONAL_METRICS for name in names)


@dataclass
class ItemScores:
    """Everything the engine measured for one item, one entry per choice (one in all for a continuation task)."""

    logprobs: list[float]  # log P(continuation | context)
    unconditional: list[float]  # log P(continuation | "Answer:"); empty for a continuation task, or when no
    # metric asked for needs it (UNCONDITIONAL_METRICS are then not computed)
    tokens: list[int]
    chars: list[int]
    bytes: list[int]
    gold: int
    greedy: list[bool] = field(default_factory=list)  # every token of the continuation was the argmax


def predictions(s: ItemScores) -> dict[str, int]:
    """The chosen index under each normalization (ties go to the first choice, as in lm-eval); "pmi" and
    "choices_only" only when the unconditional pass ran."""
    ll, uncond = np.asarray(s.logprobs), np.asarray(s.unconditional)
    chosen = {
        "raw": int(np.argmax(ll)),
        "per_token": int(np.argmax(ll / np.maximum(s.tokens, 1))),
        "per_char": int(np.argmax(ll / np.maximum(s.chars, 1))),
    }
    if len(uncond):
        chosen.update(pmi=int(np.argmax(ll - uncond)), choices_only=int(np.argmax(uncond)))
    return chosen


def _gold_metrics(s: ItemScores) -> dict[str, float]:
    """What the gold continuation alone gives: its log-probability, bits per byte, and per-character probability."""
    ll, g = float(s.logprobs[s.gold]), s.gold
    return {
        "gold_logprob": ll,
        "gold_bpb": -ll / (math.log(2) * max(s.bytes[g], 1)),
        "correct_prob": math.exp(ll / max(s.chars[g], 1)),
    }


def datadecide_margin(per_char: np.ndarray, gold: int) -> float:
    """DataDecide's MARGIN (per character): p(gold) - max p(wrong), each p = exp(log-likelihood per character);
    0 for an item with no wrong choice."""
    wrong = np.delete(per_char, gold)
    return float(math.exp(per_char[gold]) - np.exp(wrong).max()) if len(wrong) else 0.0


def item_metrics(s: ItemScores, kind: str = "choice", names: tuple[str, ...] | None = None) -> dict[str, float]:
    """The item's metrics `names` (default: every metric of its kind, in that order). A choice item scored without
    the unconditional pass has no UNCONDITIONAL_METRICS: asking for one is an error."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind!r}; allowed: {', '.join(KINDS)}")
    names = METRICS_BY_KIND[kind] if names is None else names
    if kind == "continuation":
        row = {"acc_greedy": float(s.greedy[s.gold]), **_gold_metrics(s)}
        return {name: row[name] for name in names}
    if needs_unconditional(names) and len(s.unconditional) != len(s.logprobs):
        raise ValueError(f"{', '.join(UNCONDITIONAL_METRICS)} need the unconditional log-likelihoods of every choice")
    ll = np.asarray(s.logprobs, dtype=np.float64)
    pred = predictions(s)
    g = s.gold
    wrong = [i for i in range(len(ll)) if i != g]
    probs = np.exp(ll - ll.max())
    per_char = ll / np.maximum(s.chars, 1)
    log_total = float(np.logaddexp.reduce(per_char))  # log of the summed per-character probabilities
    row = {f"acc_{name}": float(chosen == g) for name, chosen in pred.items()}
    row.update(
        _gold_metrics(s),
        gold_prob=float(probs[g] / probs.sum()),
        margin_loglik=float(ll[g] - ll[wrong].mean()) if wrong else 0.0,
        margin=datadecide_margin(per_char, g),
        total_prob=math.exp(log_total),
        norm_correct_prob=math.exp(per_char[g] - log_total),
    )
    if len(s.unconditional):
        # PMI gap: the gold choice's log P(answer | question) - log P(answer | "Answer:") minus the wrong choices' mean
        pmi = ll - np.asarray(s.unconditional, dtype=np.float64)
        row["margin_pmi"] = float(pmi[g] - pmi[wrong].mean()) if wrong else 0.0
    return {name: row[name] for name in names}


def aggregate(
    rows: list[dict[str, float]], names: tuple[str, ...] = METRICS
) -> tuple[dict[str, float], dict[str, float]]:
    """(mean of each metric, its standard error std/sqrt(n) with the sample std, as lm-eval reports)."""
    means, stderrs = {}, {}
    for name in names:
        values = np.asarray([r[name] for r in rows], dtype=np.float64)
        means[name] = float(values.mean()) if len(values) else math.nan
        stderrs[name] = float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    return means, stderrs
