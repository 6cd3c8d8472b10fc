"""The scoring engine: log P(continuation | context) for many requests, for any model that maps token ids to logits.

Requests are tokenized as lm-eval does (trailing spaces of the context move to the continuation; the continuation's
tokens are those of context+continuation after the context's), then grouped by context. A model that accepts
explicit positions and an attention mask (ablate's Transformer) scores a whole group in one row: the context once,
then every continuation after it, each attending only to the context and to itself, at the positions it would have
alone. Any other model gets one row per continuation (one-token continuations, such as MCF letters, still share
their context's row). Rows are sorted by length and batched, a batch closed early rather than pad much. Only the
positions that predict a continuation token go through the vocabulary projection and its log-softmax (in fp32
whatever the matmuls ran in). A context too long for the model is cut from the left, as lm-eval does, and the
request is counted as truncated.

Under FSDP every rank scores its share of the batches, runs the same number of forward passes (padding with a
dummy batch), and the per-request sums are added up over ranks.

A stack of K models of one shape (`ablate run --stack K`; LogitsModel.members, built by training.stack_eval) is
scored in one pass over the same rows (score_members): its forward returns every member's hidden states with a
leading dimension of K, and the rest runs on each member's slice as on one model's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ablate.eval.tasks import Request
from ablate.setup.auto import uses_bf16


SCORE_CHUNK = 128  # scored positions per vocabulary projection (measured: 64-256 alike, 32 and less slower)
MAX_PADDING = 0.05  # a batch's padding tokens, at most this share of its real ones (see _batches)
MIN_SHARED_CONTEXT = 8  # context tokens that make a packed row worth its tree mask (measured: 4.8 s -> 4.3 s)
# (the engine's time on experiments/reference.py's model, ARC-Easy + HellaSwag + PIQA x 200, conditional requests,
# 1 thread: ~47% matmuls, 15% attention, 10% log-softmax over the vocabulary, the rest the layers' elementwise ops)


@dataclass
class LogitsModel:
    """What the engine needs from a model. `forward(tokens (B, S), positions (B, S) | None, attn_mask (B, 1, S, S)
    | None) -> logits (B, S, V)`; a model with `shares_prefix=False` is only ever called with None for both."""

    forward: Callable[..., torch.Tensor]
    max_len: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    shares_prefix: bool = False
    autocast: contextlib.AbstractContextManager = field(default_factory=contextlib.nullcontext)
    head: Callable[[torch.Tensor], torch.Tensor] | None = None  # if set, forward returns hidden states and this
    # maps the few that are scored to logits (the vocabulary projection is most of a small model's cost)
    selects: bool = False  # forward(..., select=(batch index, position index)) returns logits at those only
    members: int | None = None  # a stack of this many models of one shape (score_members): forward and head take
    # and return a leading dimension of the members, every member on the same rows; None: one model


def for_transformer(model, max_len: int | None = None, device=None, autocast=None) -> LogitsModel:
    """An ablate Transformer (plain or FSDP-wrapped): continuations share their context's pass."""

    def forward(tokens, positions=None, attn_mask=None, select=None):
        # through __call__, for FSDP's hooks; the vocabulary projection only at the scored positions
        return model(tokens, positions=positions, attn_mask=attn_mask, select=select)

    def hidden(tokens, positions=None, attn_mask=None):
        return model.hidden_states(tokens, positions=positions, attn_mask=attn_mask)

    device = device or next(model.parameters()).device
    sharded = hasattr(model, "unshard")  # FSDP2 gathers the output projection only inside the root's forward
    return LogitsModel(
        forward if sharded else hidden,
        max_len or model.max_seq_len,
        torch.device(device),
        True,
        autocast or contextlib.nullcontext(),
        head=None if sharded else model.lm_head,
        selects=sharded,
    )


def eval_dtype(dtype: str | None, train_dtype: str, device) -> str:
    """The dtype to score in: `dtype` if given, else the run's train.dtype, its auto resolved by the trainer's
    rule (ablate.setup.auto: bf16 on a GPU, fp32 on CPU)."""
    if dtype:
        return dtype
    return "bf16" if uses_bf16(train_dtype, torch.device(device)) else "fp32"


def autocast_for(dtype: str, device) -> contextlib.AbstractContextManager | None:
    """bf16: the matmuls in bf16 under autocast (log-likelihoods are still summed in fp32); fp32: None."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bf16" else None


def for_loaded(loaded, device, dtype: str | None) -> tuple[LogitsModel, str]:
    """A loaded run or checkpoint's model (ablate.eval.load.load_model) to score in `dtype` (None: as the run trained,
    eval_dtype), and that dtype."""
    chosen = eval_dtype(dtype, loaded.run.train.dtype, device)
    autocast = autocast_for(chosen, device)
    return for_transformer(loaded.model, max_len=loaded.run.data.seq_len, device=device, autocast=autocast), chosen


def _to(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """x on `device`; to a GPU from pinned memory without blocking (the copy overlaps the host's next work)."""
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def for_logits_fn(fn: Callable[[torch.Tensor], torch.Tensor], max_len: int, device="cpu") -> LogitsModel:
    """Any function from token ids (B, S) to logits (B, S, V), e.g. a transformers model's `.logits`."""
    return LogitsModel(lambda tokens, positions=None, attn_mask=None: fn(tokens), max_len, torch.device(device))


@dataclass
class Scored:
    logprob: float  # sum over the continuation's tokens
    greedy: bool  # every continuation token was the argmax
    tokens: int  # continuation tokens scored
    truncated: bool  # the context was cut from the left to fit max_len


def encode(tokenizer, requests: Sequence[Request]) -> list[tuple[list[int], list[int]]]:
    """(context ids, continuation ids) per request, tokenized as lm-eval's HF backend does."""
    contexts, wholes = [], []
    for r in requests:
        context, continuation = r.context, r.continuation
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        contexts.append(context)
        wholes.append(context + continuation)
    unique = list(dict.fromkeys(contexts))
    context_ids = dict(zip(unique, (e.ids for e in tokenizer.encode_batch(unique, add_special_tokens=False))))
    whole_ids = [e.ids for e in tokenizer.encode_batch(wholes, add_special_tokens=False)]
    out = []
    for context, whole in zip(contexts, whole_ids):
        ctx = context_ids[context]
        if not ctx:
            raise ValueError("a request with an empty context; every task must give each choice a context")
        out.append((ctx, whole[len(ctx) :]))
    return out


def dedupe(encoded: Sequence[tuple[list[int], list[int]]]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """The distinct requests, and the index of each request among them. Identical requests (MCF's unconditional
    " A" after "Answer:" in every item, WinoGrande's shared sentence endings) are scored once."""
    index: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    first = [index.setdefault((tuple(ctx), tuple(cont)), len(index)) for ctx, cont in encoded]
    return [(list(ctx), list(cont)) for ctx, cont in index], first


@dataclass
class _Row:
    tokens: list[int]
    positions: list[int]
    segments: list[int]  # 0: the context; k: the k-th continuation packed after it
    targets: list[tuple[int, int, int]] = field(default_factory=list)  # (row position predicting, token, request)


def _fit(ctx: list[int], cont: list[int], max_len: int) -> tuple[tuple[int, ...], list[int], bool]:
    """Cut the context from the left so that context + continuation minus its last token fits max_len."""
    if len(ctx) + len(cont) - 1 <= max_len:
        return tuple(ctx), cont, False
    cont = cont[-max_len:]
    whole = (ctx + cont)[-(max_len + 1) :]
    return tuple(whole[: len(whole) - len(cont)]), cont, True


def build_rows(
    encoded: Sequence[tuple[list[int], list[int]]], max_len: int, shares_prefix: bool
) -> tuple[list[_Row], list[bool]]:
    """Group requests by context and lay each group out in rows; returns the rows and a truncated flag per request."""
    groups: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
    truncated = []
    for index, (ctx, cont) in enumerate(encoded):
        ctx, cont, cut = _fit(ctx, cont, max_len)
        truncated.append(cut)
        groups.setdefault(ctx, []).append((index, cont))
    rows = []
    row_cap = 2 * max_len  # a packed row's length (its positions stay below max_len)
    for ctx, members in groups.items():
        # Packing saves the context's tokens but needs a tree mask (a slower attention path than a causal row):
        # worth it for long contexts, not for the short unconditional ones ("Answer:").
        share = shares_prefix and len(ctx) >= MIN_SHARED_CONTEXT
        row = None
        for index, cont in members:
            extra = len(cont) - 1  # the last token is only ever a target
            if row is None or (
                extra and (not share and any(s for s in row.segments) or len(row.tokens) + extra > row_cap)
            ):
                row = _Row(list(ctx), list(range(len(ctx))), [0] * len(ctx))
                rows.append(row)
            segment = max(row.segments) + 1
            previous = len(ctx) - 1
            for j, token in enumerate(cont):
                row.targets.append((previous, token, index))
                if j < extra:
                    row.tokens.append(token)
                    row.positions.append(len(ctx) + j)
                    row.segments.append(segment)
                    previous = len(row.tokens) - 1
    return rows, truncated


def work(encoded: Sequence[tuple[list[int], list[int]]], max_len: int, shares_prefix: bool, batch_size: int) -> dict:
    """What `score` runs for these requests: rows, forward passes, tokens through the model (and with padding),
    positions projected onto the vocabulary, and the (query, key) pairs the attention masks allow."""
    rows, _, batches = _planned(dedupe(encoded)[0], max_len, shares_prefix, batch_size)
    pairs = 0
    for row in rows:  # causal over the context, then each continuation sees the context and itself
        context = row.segments.count(0)
        pairs += context * (context + 1) // 2
        for n in np.bincount(row.segments)[1:].tolist():
            pairs += n * context + n * (n + 1) // 2
    return {
        "rows": len(rows),
        "passes": len(batches),
        "tokens": sum(len(r.tokens) for r in rows),
        "padded_tokens": sum(len(b[0].tokens) * len(b) for b in batches),
        "scored": sum(len(r.targets) for r in rows),
        "attention_pairs": pairs,
    }


def _tree_mask(segments: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) boolean: causal, and a continuation sees the context (segment 0) and itself only."""
    seq = segments.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=segments.device).tril()
    key, query = segments[:, None, :], segments[:, :, None]
    allowed = causal & ((key == 0) | (key == query)) & (key >= 0)
    return (allowed | torch.eye(seq, dtype=torch.bool, device=segments.device))[:, None]  # padding sees itself


@torch.no_grad()
def _score_batch(lm: LogitsModel, batch: list[_Row], sums: torch.Tensor, misses: torch.Tensor) -> None:
    """Add each scored token's log-probability to its request's entry of `sums`, and 1 to `misses` where the token
    was not the argmax."""
    width = max(len(r.tokens) for r in batch)
    tokens = np.zeros((len(batch), width), dtype=np.int64)
    positions = np.zeros((len(batch), width), dtype=np.int64)
    segments = np.full((len(batch), width), -1, dtype=np.int64)
    for b, row in enumerate(batch):
        n = len(row.tokens)
        tokens[b, :n], positions[b, :n], segments[b, :n] = row.tokens, row.positions, row.segments
    # a row of one continuation after its context is causal: the tree mask (a slower attention path) only for two+
    packed = lm.shares_prefix and any(row.segments[-1] > 1 for row in batch)
    targets = [(b, *t) for b, row in enumerate(batch) for t in row.targets]
    b_idx, p_idx, wanted, request = _to(torch.tensor(targets, dtype=torch.long).reshape(-1, 4), lm.device).unbind(1)
    tokens = _to(torch.from_numpy(tokens), lm.device)
    if packed:
        mask = _tree_mask(_to(torch.from_numpy(segments), lm.device))
        args = (tokens, _to(torch.from_numpy(positions), lm.device), mask)
    else:
        args = (tokens, None, None)
    # a batch without targets still runs its forward: FSDP's gathers need every rank
    out = lm.forward(*args, select=(b_idx, p_idx)) if lm.selects else lm.forward(*args)
    if not targets:
        return
    picked = out if lm.selects else out[..., b_idx, p_idx, :]  # (T, d) or a stack's (K, T, d)
    # A few hundred scored positions at a time: their vocabulary-wide logits stay in cache. log_softmax is one fused
    # kernel on CPU (logsumexp is five: measured 30% of the engine's time), and its values are summed in fp32 or
    # wider whatever the matmuls ran in. A stack's members share the rows: every index below applies to each
    # member's slice (its own row of `sums` and `misses`), the same ops on the same values as its model alone.
    for start in range(0, len(wanted), SCORE_CHUNK):
        logits = picked[..., start : start + SCORE_CHUNK, :]
        if lm.head is not None:
            logits = lm.head(logits)
        logits = logits.float()
        chunk = slice(start, start + SCORE_CHUNK)
        target = wanted[chunk, None].expand(*logits.shape[:-1], 1)
        missed = logits.gather(-1, target)[..., 0] < logits.amax(-1)
        logprob = torch.log_softmax(logits, -1).gather(-1, target)[..., 0]
        sums.index_add_(-1, request[chunk], logprob.to(sums.dtype))
        misses.index_add_(-1, request[chunk], missed.to(misses.dtype))


def _planned(distinct, max_len: int, shares_prefix: bool, batch_size: int):
    """The rows of the distinct requests (longest first), each request's truncation flag, and their batches."""
    rows, truncated = build_rows(distinct, max_len, shares_prefix)
    rows.sort(key=lambda r: -len(r.tokens))
    return rows, truncated, _batches(rows, batch_size)


def _batches(rows: list[_Row], batch_size: int) -> list[list[_Row]]:
    """Rows sorted longest first, in batches of at most batch_size rows, each closed early rather than let its
    padding pass MAX_PADDING of its tokens: a few long rows get a batch of their own instead of widening 32 rows
    (measured on ARC-Easy, HellaSwag, PIQA: padding 13% -> 4% of the tokens, for twice the forward passes)."""
    batches, current, real = [], [], 0
    for row in rows:
        n = len(row.tokens)
        if current and (
            len(current) == batch_size or len(current[0].tokens) * (len(current) + 1) > (1 + MAX_PADDING) * (real + n)
        ):
            batches.append(current)
            current, real = [], 0
        current.append(row)
        real += n
    return batches + [current] if current else batches


def score(lm: LogitsModel, encoded: Sequence[tuple[list[int], list[int]]], batch_size: int = 32) -> list[Scored]:
    """Score every (context ids, continuation ids); under torch.distributed the rows are split over ranks."""
    if lm.members is not None:
        raise ValueError(f"score: a stack of {lm.members} models (LogitsModel.members); score_members scores it")
    return _score(lm, encoded, batch_size)[0]


def score_members(
    lm: LogitsModel, encoded: Sequence[tuple[list[int], list[int]]], batch_size: int = 32
) -> list[list[Scored]]:
    """A stack's members (LogitsModel.members) scored in one pass over the rows: per member, what `score` gives
    for its model alone (the same rows, batches and ops on each member's slice: on CPU in fp32 bit for bit where
    the stacked forward is, tests/test_stack_eval.py)."""
    if lm.members is None:
        raise ValueError("score_members: one model (LogitsModel.members is None); score scores it")
    return _score(lm, encoded, batch_size)


def _score(lm: LogitsModel, encoded: Sequence[tuple[list[int], list[int]]], batch_size: int) -> list[list[Scored]]:
    """Each member's scores (one model: a list of one)."""
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size}; allowed: >= 1")
    distinct, first = dedupe(encoded)
    rows, truncated, batches = _planned(distinct, lm.max_len, lm.shares_prefix, batch_size)
    scored_tokens = np.bincount([t[2] for row in rows for t in row.targets], minlength=len(distinct)).tolist()
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    rank = dist.get_rank() if world > 1 else 0
    mine = batches[rank::world]
    passes = -(-len(batches) // world)  # the same count on every rank, as FSDP needs
    # per member and distinct request: its summed log-probability (fp64), and how many of its tokens were not the
    # argmax; one model's are (requests,), a stack's (members, requests)
    shape = (len(distinct),) if lm.members is None else (lm.members, len(distinct))
    sums = torch.zeros(shape, dtype=torch.float64, device=lm.device)
    misses = torch.zeros(shape, dtype=torch.int64, device=lm.device)
    # one autocast region for every pass: autocast casts each weight to bf16 once per region, not once per call
    with lm.autocast:
        for k in range(passes):
            # a rank with nothing left still runs a forward so the others' parameter gathers complete
            _score_batch(lm, mine[k] if k < len(mine) else [_Row([0], [0], [0])], sums, misses)
    if world > 1:  # each request was scored on one rank: the others hold zeros for it
        dist.all_reduce(sums)
        dist.all_reduce(misses)
    per_member = zip(sums.reshape(-1, len(distinct)).tolist(), misses.reshape(-1, len(distinct)).tolist())
    return [
        [Scored(logprobs[i], missed[i] == 0, scored_tokens[i], truncated[i]) for i in first]
        for logprobs, missed in per_member
    ]
