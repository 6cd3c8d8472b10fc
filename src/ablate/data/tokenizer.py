"""The tokenizer of a run's data: data.tokenizer is 'bpe' (a byte-level BPE trained here on the training text) or a
tokenizer.json saved by HF `tokenizers`, loaded with its end-of-text token and checked against model.vocab_size.

No torch: `check_tokenizer` runs where experiments load, before any compute. data.prepare builds the cache with it.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator

from ablate.config import ConfigError

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>")
BPE_TRAINING_CAP = 50_000_000  # characters of training text the BPE sees: bounds its time and memory
TOKENIZER_ALLOWED = "'bpe' or a tokenizer.json saved by HF tokenizers"


def check_tokenizer(tokenizer: str, vocab_size: int | None) -> None:
    """data.tokenizer is 'bpe' (with room for 256 bytes + eos) or a loadable tokenizer.json that fits vocab_size."""
    if tokenizer == "bpe":
        if vocab_size is not None and vocab_size < 257:
            raise ConfigError(
                f"model.vocab_size: {vocab_size} is too small for data.tokenizer='bpe' (256 bytes + "
                f"eos); allowed: >= 257"
            )
        return
    path = os.path.expanduser(tokenizer)
    if not os.path.isfile(path):
        raise ConfigError(f"data.tokenizer: {tokenizer!r} is not a file; allowed: {TOKENIZER_ALLOWED}")
    st = os.stat(path)
    tokenizer_vocab = _tokenizer_vocab(tokenizer, st.st_size, st.st_mtime_ns)
    if vocab_size is not None:
        check_vocab_fits(tokenizer_vocab, vocab_size)


@functools.lru_cache(maxsize=64)
def _tokenizer_vocab(path: str, size: int, mtime_ns: int) -> int:
    """Loaded once per file version: load_experiment checks every run x seed."""
    tok, _ = load_tokenizer_file(path)
    return tok.get_vocab_size(with_added_tokens=True)


def check_vocab_fits(tokenizer_vocab: int, vocab_size: int) -> None:
    if tokenizer_vocab > vocab_size:
        raise ConfigError(
            f"model.vocab_size: {vocab_size} is smaller than the tokenizer's vocabulary of "
            f"{tokenizer_vocab}; allowed: >= {tokenizer_vocab}"
        )


def load_tokenizer_file(path: str, field_name: str = "data.tokenizer", allowed: str = TOKENIZER_ALLOWED):
    """(tokenizer, eos id) of a tokenizer.json; ConfigError naming the field and what is wrong with the file."""
    from tokenizers import Tokenizer

    full_path = os.path.expanduser(path)
    try:
        tok = Tokenizer.from_file(full_path)
    except Exception as error:  # tokenizers raises a bare Exception whose text rarely says what is wrong
        raise ConfigError(f"{field_name}: {_why_not_a_tokenizer(full_path, error)}; allowed: {allowed}") from None
    for name in EOS_CANDIDATES:
        if tok.token_to_id(name) is not None:
            return tok, tok.token_to_id(name)
    raise ConfigError(f"{field_name}: {path!r} has none of the end-of-text tokens {list(EOS_CANDIDATES)}")


def _why_not_a_tokenizer(path: str, error: Exception) -> str:
    try:
        with open(path, "rb") as f:
            spec = json.loads(f.read().decode("utf-8"))
    except UnicodeDecodeError as bad:
        return f"{path}: not UTF-8 text (byte at offset {bad.start}), so not a tokenizer.json"
    except json.JSONDecodeError as bad:
        return f"{path}:{bad.lineno}: not JSON ({bad.msg} at column {bad.colno}), so not a tokenizer.json"
    missing = [k for k in ("model",) if not isinstance(spec, dict) or k not in spec]
    detail = f"no {', '.join(repr(k) for k in missing)}" if missing else str(error).strip().splitlines()[0]
    return f"{path}: JSON, but not a tokenizer ({detail})"


def train_bpe(texts: Iterator[str], vocab_size: int):
    """A byte-level BPE (every byte is a token, so any text round-trips) with <|endoftext|> as eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_CANDIDATES[0]],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def capped():  # the first ~50 MB of training text is plenty to learn merges
        seen = 0
        for text in texts:
            if seen >= BPE_TRAINING_CAP:
                return
            seen += len(text)
            yield text

    tok.train_from_iterator(capped(), trainer)
    return tok, tok.token_to_id(EOS_CANDIDATES[0])
