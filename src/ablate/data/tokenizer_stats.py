"""How a tokenizer cuts a text: fertility, continued-word rate, bytes per token and vocabulary use, for every run's
summary.json (its own tokenizer on its validation documents, with the validation loss in bits per byte) and for
`ablate tokenizer` (ablate.cli.tokenizer: per corpus, per language of the embedded corpus).

A word is a run of letters, digits and underscores (regex \\w+) or one punctuation or symbol character on its own;
whitespace separates words and belongs to none. A word's tokens are the tokens whose text overlaps it (a byte-level
token holding part of an "é" counts for its word; one that is only a space counts for no word). The same definition
is used everywhere, so figures of different tokenizers, corpora and runs compare.

No torch: the run figures read the prepared data's arrays, handed in by ablate.training.callbacks.validation.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

WORD = re.compile(r"\w+|[^\w\s]")
WORD_DEFINITION = (
    "a word is a run of letters, digits and underscores, or one punctuation or symbol character; whitespace "
    "separates words"
)
ENCODE_CHUNK = 1000  # documents per encode_batch call
RUN_FIGURES_MAX_TOKENS = 2_000_000  # a run's figures read at most this many validation tokens (its first documents)


# ---------------------------------------------------------------------------------------------------------------
# the figures


@dataclass
class TextCounts:
    """What the figures are made of, summed over documents."""

    vocab_size: int
    documents: int = 0
    bytes: int = 0  # UTF-8 bytes of the text
    tokens: int = 0  # every token of the text (no eos or other special token added)
    words: int = 0
    word_tokens: int = 0  # tokens counted per word they overlap
    continued_words: int = 0  # words of more than one token
    seen: np.ndarray = field(default=None, repr=False)  # bool per id: the ids the text used

    def __post_init__(self):
        if self.seen is None:
            self.seen = np.zeros(self.vocab_size, dtype=bool)


def _word_token_counts(text: str, offsets: list) -> np.ndarray:
    """Tokens overlapping each word of `text` (character offsets, as tokenizers gives them)."""
    spans = np.array([m.span() for m in WORD.finditer(text)], dtype=np.int64).reshape(-1, 2)
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    offs = offs[offs[:, 1] > offs[:, 0]]  # a token of no text (none in practice) overlaps nothing
    starts, ends = np.sort(offs[:, 0]), np.sort(offs[:, 1])
    # tokens overlapping [a, b): those starting before b, less those ending at or before a (a subset of them)
    return np.searchsorted(starts, spans[:, 1], "left") - np.searchsorted(ends, spans[:, 0], "right")


def count_text(tok, texts: Iterable[str]) -> TextCounts:
    """Encode each text (special-token text stays text, as ablate.data.prepare encodes) and count."""
    tok.encode_special_tokens = True
    counts = TextCounts(tok.get_vocab_size(with_added_tokens=True))
    texts = iter(texts)
    while chunk := list(itertools.islice(texts, ENCODE_CHUNK)):
        for text, enc in zip(chunk, tok.encode_batch(chunk, add_special_tokens=False)):
            per_word = _word_token_counts(text, enc.offsets)
            counts.documents += 1
            counts.bytes += len(text.encode("utf-8"))
            counts.tokens += len(enc.ids)
            counts.words += len(per_word)
            counts.word_tokens += int(per_word.sum())
            counts.continued_words += int((per_word > 1).sum())
            counts.seen[enc.ids] = True
    return counts


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def figures(tok, counts: TextCounts) -> dict:
    """fertility (tokens per word), continued_word_rate (share of words of more than one token), bytes_per_token
    (UTF-8 bytes over tokens), vocab_use (share of the vocabulary's ids, special tokens left out, the text used),
    and the counts they come from."""
    special = [i for i, t in tok.get_added_tokens_decoder().items() if t.special and i < counts.vocab_size]
    ordinary = np.ones(counts.vocab_size, dtype=bool)
    ordinary[special] = False
    return {
        "fertility": _ratio(counts.word_tokens, counts.words),
        "continued_word_rate": _ratio(counts.continued_words, counts.words),
        "bytes_per_token": _ratio(counts.bytes, counts.tokens),
        "vocab_use": _ratio(int((counts.seen & ordinary).sum()), int(ordinary.sum())),
        "vocab_size": counts.vocab_size,
        "documents": counts.documents,
        "bytes": counts.bytes,
        "words": counts.words,
        "tokens": counts.tokens,
    }


# ---------------------------------------------------------------------------------------------------------------
# a run's figures: its tokenizer on its validation documents, and the validation loss in bits per byte


def _documents(tokens: np.ndarray, doc_starts: np.ndarray, max_tokens: int) -> Iterator[list[int]]:
    """Each document's ids without its closing eos, the first documents up to max_tokens."""
    ends = np.append(np.asarray(doc_starts[1:], dtype=np.int64), len(tokens))
    for start, end in zip(doc_starts, ends):
        if start >= max_tokens:
            return
        yield np.asarray(tokens[start : end - 1], dtype=np.int64).tolist()


def scored_bytes(tok, target_runs: Iterable[np.ndarray], digest=None) -> int:
    """UTF-8 bytes of the text the scored target tokens hold. Each run of contiguous targets is decoded whole
    (special tokens such as eos hold no text), so only a character cut at a run's ends can count a byte wrong.
    digest: a hashlib object fed the same bytes, in order (which text was scored)."""
    total = 0
    for run in target_runs:
        text = tok.decode(run.tolist(), skip_special_tokens=True).encode("utf-8")
        if digest is not None:
            digest.update(text)
        total += len(text)
    return total


def file_sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def validation_figures(tokenizer_path: str, val_tokens, val_doc_starts, max_tokens: int = RUN_FIGURES_MAX_TOKENS):
    """The run's tokenizer figures on its validation documents (decoded from its token file; the first ones up to
    max_tokens), with the tokenizer file's sha256: what tells runs of different tokenizers apart."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    docs = _documents(val_tokens, val_doc_starts, max_tokens)
    texts = (t for ids in docs if (t := tok.decode(ids, skip_special_tokens=True)).strip())
    return {**figures(tok, count_text(tok, texts)), "sha256": file_sha256(tokenizer_path)}


def contiguous_targets(indices, targets: np.ndarray) -> list[np.ndarray]:
    """Targets (one row per sequence, in `indices` order) joined into runs of consecutive sequence indices, which
    are contiguous in the token file."""
    indices = np.asarray(indices, dtype=np.int64)
    order = np.argsort(indices, kind="stable")
    indices, targets = indices[order], np.asarray(targets)[order]
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    return [block.reshape(-1) for block in np.split(targets, breaks)]


def scored_text(data, sequences: int, seq_len: int, chunk: int = 64) -> tuple[int, int, str]:
    """(tokens, UTF-8 bytes, sha256 of those bytes) of the targets a run's validation scores: its fixed validation
    sequences (data.val_indices, as ablate.training.callbacks.validation.Validation takes them), read through
    data.val.batch. The hash says which text was scored: bits per byte of runs of different tokenizers compare only
    where it is the same (report/tokenizers.py)."""
    import hashlib

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(data.tokenizer_path)
    indices = np.sort(np.asarray(data.val_indices(sequences, seq_len), dtype=np.int64))
    n_bytes, digest = 0, hashlib.sha256()
    for start in range(0, len(indices), chunk):
        part = indices[start : start + chunk]
        targets = np.asarray(data.val.batch(part, seq_len)[1])
        n_bytes += scored_bytes(tok, contiguous_targets(part, targets), digest)
    return len(indices) * seq_len, n_bytes, digest.hexdigest()


def bits_per_byte(loss_per_token: float, tokens: int, n_bytes: int) -> float:
    """Mean loss (nats per token) over `tokens` tokens holding n_bytes bytes of text, in bits per byte."""
    return loss_per_token * tokens / n_bytes / math.log(2) if n_bytes else math.nan
