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


def file_sha256(path: str) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def validation_figures(tokenizer_path: str, val_tokens, val_doc_starts, max_tokens: int = RUN_FIGURES_MAX_TOKENS):
    """The run's tokenizer figures on its validation documents (decoded from its token file; the first ones up to
    max_tokens), with the tokenizer file's sha256: what tells runs of different tokenizers apart. Worked out once
    per process for a tokenizer and documents of the same content (the members of a stack, runs one after another
    on one data config): a copy of the figures each call."""
    sha256 = file_sha256(tokenizer_path)
    doc_starts = np.asarray(val_doc_starts, dtype=np.int64)
    count = int(np.searchsorted(doc_starts, max_tokens))  # the documents read: those starting before max_tokens
    end = int(doc_starts[count]) if count < len(doc_starts) else len(val_tokens)
    key = ("figures", sha256, content_sha256(val_tokens[:end], doc_starts[:count]), max_tokens)
    found = _MEMO.get(key)
    if found is None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tokenizer_path)
        docs = _documents(val_tokens, val_doc_starts, max_tokens)
        texts = (t for ids in docs if (t := tok.decode(ids, skip_special_tokens=True)).strip())
        found = _remember(key, {**figures(tok, count_text(tok, texts)), "sha256": sha256})
    return dict(found)


# What a process worked out from a tokenizer file and a split's tokens, keyed by their content (sha256), not by
# path or object: each member of a stack opens the cache's files anew, and a cache folder rebuilt in place is other
# content. A few entries (one per tokenizer and split a sweep uses), the oldest dropped first.
_MEMO: dict[tuple, object] = {}
_MEMO_ENTRIES = 8


def _remember(key: tuple, value):
    _MEMO[key] = value
    while len(_MEMO) > _MEMO_ENTRIES:
        del _MEMO[next(iter(_MEMO))]
    return value


def content_sha256(*arrays) -> str:
    """sha256 over the arrays' dtypes, shapes and bytes (a memory-mapped token file is read once, ~1 GB/s)."""
    import hashlib

    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


VAL_BYTES_PER_TOKEN = 4  # the validation documents' byte budget: data.val_sequences x seq_len x this


@dataclass
class ValDocuments:
    """The validation documents a run scores, fixed by their text, not by a token count: the first documents of
    the validation split whose UTF-8 bytes reach a budget (a mixture held out per source: the first of each source,
    an equal share of the budget each). Each is scored whole under any tokenizer, so runs of different tokenizers
    on the same data config score the same bytes. starts/ends: each document's targets in the val token file (its
    closing eos included: scored, holding no text); n_bytes: its text's UTF-8 bytes; text_sha256: of the texts."""

    starts: np.ndarray
    ends: np.ndarray
    n_bytes: np.ndarray
    text_sha256: str

    @property
    def tokens(self) -> int:
        return int((self.ends - self.starts).sum())

    def windows(self, seq_len: int) -> list[tuple[int, int, int]]:
        """(document index, first target, end) of each window of at most seq_len targets, document by document."""
        return [
            (d, w, min(w + seq_len, int(end)))
            for d, (start, end) in enumerate(zip(self.starts, self.ends))
            for w in range(int(start), int(end), seq_len)
        ]


def validation_documents(tokenizer_path: str, val, budget: int) -> ValDocuments:
    """The first documents of `val` (a TokenData) whose text reaches `budget` UTF-8 bytes, per source of a mixture
    held out per source (budget / sources each); all of them where the split holds less. Chosen once per process
    for a tokenizer and split of the same content (the members of a stack): the arrays returned are read-only."""
    source_starts = () if val.source_starts is None else val.source_starts
    key = ("documents", file_sha256(tokenizer_path), content_sha256(val.tokens, val.doc_starts, source_starts), budget)
    found = _MEMO.get(key)
    if found is None:
        found = _remember(key, _validation_documents(tokenizer_path, val, budget))
    return found


def _validation_documents(tokenizer_path: str, val, budget: int) -> ValDocuments:
    import hashlib

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    doc_starts = np.asarray(val.doc_starts, dtype=np.int64)
    doc_ends = np.append(doc_starts[1:], len(val.tokens))
    bounds = [0, len(val.tokens)] if val.source_starts is None else list(val.source_starts)
    share = budget / (len(bounds) - 1)
    picked, digest = [], hashlib.sha256()
    for lo, hi in zip(bounds[:-1], bounds[1:]):  # a source that runs out gives all it has: no other fills in
        total = 0
        for doc in range(int(np.searchsorted(doc_starts, lo)), int(np.searchsorted(doc_starts, hi))):
            if total >= share:
                break
            start, end = int(doc_starts[doc]), int(doc_ends[doc])
            raw = tok.decode(np.asarray(val.tokens[start : end - 1]).tolist(), skip_special_tokens=True).encode()
            digest.update(raw)
            picked.append((start, end, len(raw)))
            total += len(raw)
    columns = [np.array(col, dtype=np.int64) for col in zip(*picked)] if picked else [np.zeros(0, np.int64)] * 3
    for col in columns:
        col.flags.writeable = False  # shared by every run of the process that scores these documents
    return ValDocuments(*columns, digest.hexdigest())
