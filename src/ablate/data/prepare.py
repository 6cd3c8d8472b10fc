"""Data: text sources -> tokenizer -> one flat memory-mapped file of token ids per split -> shuffled sequences.

Sources are resolved, checked and read in `data.sources`; the tokenizer is `data.tokenizer`'s; the token files
are read back through `data.token_files`. `prepare_data` hashes the raw text on the main rank (unless its files
are unchanged since they were last hashed: <cache>/data/source_index.json), and only when no cache folder holds
that content trains or loads the tokenizer and tokenizes once into
<cache>/data/<key>/: train.bin + train_docs.npy, val.bin + val_docs.npy, tokenizer.json, stats.json. Documents are
concatenated, each followed by eos; `doc_starts` keeps the boundaries for document masks. Each phase prints a line
to stderr when it starts and ends (a first run spends minutes here and must not look hung).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from collections.abc import Callable, Iterator

import numpy as np

from ablate import rundir
from ablate.config import ConfigError, DataConfig
from ablate.data import mixture
from ablate.data.sources import (
    ALLOWED,
    check_source_file,
    default_corpus_path,
    entries,
    is_document,
    load_documents,
    raw_texts,
    resolve,
    source_names,
    source_weights,
    valid_texts,
)
from ablate.data.token_files import PreparedData, open_split
from ablate.data.tokenizer import BPE_TRAINING_CAP, check_tokenizer, check_vocab_fits, load_tokenizer_file, train_bpe

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
ENCODE_CHUNK = 1000  # documents per encode_batch call
PROGRESS_SECONDS = 10.0  # without a terminal, a progress line at least this often (and every 25%)


def _say(message: str) -> None:
    """A progress line on stderr, terminal or not (tqdm draws nothing in logs and pipes)."""
    print(f"data: {message}", file=sys.stderr, flush=True)


def _megabytes(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 100_000 else f"{n_bytes / 1e3:.1f} kB"


def _count(n: int) -> str:
    """2.1M, 40k, 7.5k, 812: token counts at a glance."""
    for size, suffix in ((1e9, "B"), (1e6, "M")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return f"{n / 1e3:.0f}k" if n >= 1e4 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def _documents(n: int) -> str:
    return f"{n:,} document" + ("" if n == 1 else "s")


def _content_hash(parts, max_documents: int | None) -> tuple[str, int, int, int]:
    """sha256 of the documents in order, with the count of documents, of skipped (empty or non-string) ones, and
    of the documents' UTF-8 bytes."""
    digest, documents, skipped, n_bytes = hashlib.sha256(), 0, 0, 0
    for value in raw_texts(parts, max_documents):
        if is_document(value):
            raw = value.encode("utf-8")
            digest.update(len(raw).to_bytes(8, "little") + raw)  # length prefix: ["ab","c"] != ["a","bc"]
            documents += 1
            n_bytes += len(raw)
        else:
            digest.update(b"\xff" * 8)  # a skip marker, so the stored skip count matches the content
            skipped += 1
    return digest.hexdigest(), documents, skipped, n_bytes


# ---------------------------------------------------------------------------------------------------------------
# config checks


def check_data_config(cfg: DataConfig, vocab_size: int | None = None) -> None:
    """Cheap checks before any compute: sources exist, their files are not empty, binary or unparsable at their
    start and hold the text column (where a file says so cheaply), the tokenizer is 'bpe' or a loadable
    tokenizer.json (that fits model.vocab_size when given)."""
    for field_name, source in (("data.source", cfg.source), ("data.val_source", cfg.val_source)):
        if source is None:
            continue
        if not entries(source, field_name):
            raise ConfigError(f"{field_name}: empty; allowed: {ALLOWED}")
        if field_name == "data.val_source" and source_weights(source, field_name) is not None:
            raise ConfigError(
                f"data.val_source: {source!r} has weights, which only data.source takes (a mixture's "
                f"validation is held out from each of its sources); allowed: {ALLOWED}"
            )
        for entry in entries(source, field_name):
            kind, files = resolve(entry, field_name)
            for path in files if kind == "files" else []:
                check_source_file(path, field_name, cfg.text_field)
    check_tokenizer(cfg.tokenizer, vocab_size)


# ---------------------------------------------------------------------------------------------------------------
# tokenizing: documents -> a flat file of ids


class _Progress:
    """Documents tokenized so far: a tqdm bar on a terminal; elsewhere (logs, pipes, CI) a line every 25% or
    PROGRESS_SECONDS, whichever comes first."""

    def __init__(self, total: int, split: str):
        from tqdm import tqdm

        self.total, self.split, self.done = total, split, 0
        self.start = self.last_line = time.perf_counter()
        self.next_share = 0.25
        self.bar = tqdm(total=total, desc=split, unit="doc") if sys.stderr.isatty() else None

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now, share = time.perf_counter(), self.done / max(self.total, 1)
        if (share >= self.next_share or now - self.last_line >= PROGRESS_SECONDS) and self.done < self.total:
            _say(
                f"tokenizing {self.split}: {self.done:,}/{self.total:,} documents ({share:.0%}) in "
                f"{now - self.start:.1f}s"
            )
            self.last_line = now
        while self.next_share <= share:
            self.next_share += 0.25

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _write_tokens(tok, texts: Iterator[str], eos_id: int, bin_path: str, dtype, total: int, desc: str) -> np.ndarray:
    """Append every document's ids then eos to bin_path; return each document's start offset."""
    tok.encode_special_tokens = True  # a literal "<|endoftext|>" inside a text stays text: eos only marks boundaries
    starts, offset = [], 0
    progress = _Progress(total, desc)
    try:
        with open(bin_path, "wb") as f:
            while chunk := list(itertools.islice(texts, ENCODE_CHUNK)):
                docs = [enc.ids + [eos_id] for enc in tok.encode_batch(chunk, add_special_tokens=False)]
                for ids in docs:
                    starts.append(offset)
                    offset += len(ids)
                f.write(np.fromiter(itertools.chain.from_iterable(docs), dtype=dtype).tobytes())
                progress.update(len(chunk))
    finally:
        progress.close()
    return np.asarray(starts, dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------------
# the cache: content-addressed folders of token files


def _file_hash(path: str) -> str:
    with open(os.path.expanduser(path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _cache_root(cfg: DataConfig) -> str:
    return os.path.expanduser(cfg.cache_dir or os.environ.get("ABLATE_CACHE") or "~/.cache/ablate")


@dataclass
class _Stream:
    """One source of a mixture, or all of data.source when it has no weights: its documents and their split."""

    entry: str
    parts: list
    n_train: int
    n_val: int  # its last documents, held out for validation (0 when data.val_source is given)
    skipped: int
    n_bytes: int  # UTF-8 bytes of its documents
    content_hash: str

    @property
    def train_bytes(self) -> int:  # estimated when validation is a share of the stream
        return self.n_bytes * self.n_train // (self.n_train + self.n_val)


@dataclass
class _Sources:
    """What reading and hashing the sources found: the streams to tokenize, the validation, the content's identity."""

    streams: list[_Stream]  # one, unless data.source has weights
    weighted: bool
    val_parts: list | None  # None: validation is the last documents of each stream
    n_val: int
    skipped: int
    val_spec: dict

    @property
    def n_train(self) -> int:
        return sum(s.n_train for s in self.streams)

    @property
    def documents_key(self):  # one stream keeps the key it always had: its cache stays valid
        return [s.content_hash for s in self.streams] if self.weighted else self.streams[0].content_hash


def _no_usable_document(field_name: str, source: str, skipped: int, text_field: str) -> ConfigError:
    return ConfigError(
        f"{field_name}: {source!r} holds no usable document ({skipped} empty or non-string "
        f"{text_field!r} values); allowed: documents with text in data.text_field"
    )


def _read_stream(cfg: DataConfig, entry: str, hf_cache: str, weighted: bool) -> _Stream:
    """Load and hash one stream (data.max_documents counts per stream); hold out its last documents for validation
    unless a data.val_source is given."""
    parts = load_documents(entry, cfg.text_field, cache_dir=hf_cache)
    content_hash, n_docs, skipped, n_bytes = _content_hash(parts, cfg.max_documents)
    if n_docs == 0:
        raise _no_usable_document("data.source", entry, skipped, cfg.text_field)
    n_val = max(1, round(cfg.val_fraction * n_docs)) if cfg.val_source is None else 0  # its last documents
    if n_docs - n_val < 1:
        where = f"{entry!r} of the mixture has " if weighted else ""
        raise ConfigError(
            f"data.source: {where}{n_docs} usable documents (skipped {skipped} empty or non-string) "
            f"leave {n_docs - n_val} for training and {n_val} for validation (data.val_fraction="
            f"{cfg.val_fraction}); allowed: at least one each, or a data.val_source"
        )
    return _Stream(entry, parts, n_docs - n_val, n_val, skipped, n_bytes, content_hash)


def _read_sources(cfg: DataConfig, hf_cache: str) -> _Sources:
    """Load and hash data.source (each part of a mixture apart) and data.val_source, and split train from val."""
    _say("reading and hashing sources ...")
    start = time.perf_counter()
    weighted = source_weights(cfg.source) is not None
    streams = [
        _read_stream(cfg, entry, hf_cache, weighted) for entry in (entries(cfg.source) if weighted else [cfg.source])
    ]
    skipped, n_val = sum(s.skipped for s in streams), sum(s.n_val for s in streams)
    val_parts, val_docs, val_bytes, val_spec = None, 0, 0, {"fraction": cfg.val_fraction}
    if cfg.val_source is not None:
        val_parts = load_documents(cfg.val_source, cfg.text_field, field_name="data.val_source", cache_dir=hf_cache)
        val_hash, n_val, val_skipped, val_bytes = _content_hash(val_parts, None)
        if n_val == 0:
            raise _no_usable_document("data.val_source", cfg.val_source, val_skipped, cfg.text_field)
        skipped, val_docs, val_spec = skipped + val_skipped, n_val, {"source_hash": val_hash}
    if skipped:
        log.warning("data: skipped %d documents with empty or non-string text", skipped)
    n_docs = sum(s.n_train + s.n_val for s in streams) + val_docs
    _say(
        f"read and hashed {_documents(n_docs)} ({_megabytes(sum(s.n_bytes for s in streams) + val_bytes)}) in "
        f"{time.perf_counter() - start:.1f}s"
    )
    return _Sources(streams, weighted, val_parts, n_val, skipped, val_spec)


def _tokenizer_for(cfg: DataConfig, vocab_size: int, sources: _Sources):
    if cfg.tokenizer != "bpe":
        return load_tokenizer_file(cfg.tokenizer)
    train_bytes = sum(s.train_bytes for s in sources.streams)
    _say(
        f"training a byte-level BPE tokenizer (vocab {vocab_size}) on "
        f"{_megabytes(min(train_bytes, BPE_TRAINING_CAP))} ..."
    )
    start = time.perf_counter()
    # every stream's training documents, interleaved so that the capped text holds about as much of each
    texts = mixture.balanced(
        [itertools.islice(valid_texts(s.parts, cfg.max_documents), s.n_train) for s in sources.streams]
    )
    tok, eos_id = train_bpe(texts, vocab_size)
    _say(f"tokenizer trained in {time.perf_counter() - start:.1f}s")
    return tok, eos_id


def _save_source_bounds(
    folder: str, split: str, starts: np.ndarray, n_tokens: int, docs_per_source: list, per_source: list
) -> None:
    """A mixture's split: where each source's tokens begin (and the end), for its sequences; tokens in stats."""
    bounds = np.append(starts[mixture.first_indices(docs_per_source)[:-1]], n_tokens).astype(np.int64)
    np.save(os.path.join(folder, f"{split}_sources.npy"), bounds)
    for source, n in zip(per_source, np.diff(bounds)):
        source["tokens"][split] = int(n)


def _build(folder: str, cfg: DataConfig, vocab_size: int, sources: _Sources, stats: dict) -> None:
    """Tokenizer + token files into a temp folder, renamed into place: a killed build leaves no half cache."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = str(rundir.new_temp_folder(parent, f".building-{os.path.basename(folder)}-"))  # umask, not 0o700
    try:
        tok, eos_id = _tokenizer_for(cfg, vocab_size, sources)
        tokenizer_vocab = tok.get_vocab_size(with_added_tokens=True)
        check_vocab_fits(tokenizer_vocab, vocab_size)
        tok.save(os.path.join(tmp, "tokenizer.json"))
        dtype = "uint16" if tokenizer_vocab <= 2**16 else "uint32"

        streams = sources.streams  # train: each stream's first n_train documents, stream after stream
        stream_texts = [valid_texts(s.parts, cfg.max_documents) for s in streams]
        train_texts = itertools.chain.from_iterable(
            itertools.islice(t, s.n_train) for t, s in zip(stream_texts, streams)
        )
        held_out = sources.val_parts is None  # then val: the rest of each stream, stream after stream
        val_texts = itertools.chain.from_iterable(stream_texts) if held_out else valid_texts(sources.val_parts)
        per_split = {"train": [s.n_train for s in streams], "val": [s.n_val for s in streams] if held_out else None}
        for split, texts, total in (("train", train_texts, sources.n_train), ("val", val_texts, sources.n_val)):
            _say(f"tokenizing {split} ({_documents(total)}) ...")
            start = time.perf_counter()
            starts = _write_tokens(tok, texts, eos_id, os.path.join(tmp, f"{split}.bin"), dtype, total, split)
            np.save(os.path.join(tmp, f"{split}_docs.npy"), starts)
            n_bytes = os.path.getsize(os.path.join(tmp, f"{split}.bin"))
            stats["tokens"][split] = n_bytes // np.dtype(dtype).itemsize
            if sources.weighted and per_split[split] is not None:
                _save_source_bounds(tmp, split, starts, stats["tokens"][split], per_split[split], stats["sources"])
            _say(
                f"tokenized {split}: {_documents(total)}, {_count(stats['tokens'][split])} tokens in "
                f"{time.perf_counter() - start:.1f}s"
            )
        stats.update(vocab_size=tokenizer_vocab, eos_id=eos_id, dtype=dtype)
        with open(os.path.join(tmp, "stats.json"), "w") as f:
            json.dump(stats, f, indent=1)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished the same content first: theirs is as good
            if not os.path.isdir(folder):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# Which cache folder the files seen before hashed to: reading and hashing the sources again (importing HF datasets
# to do it) costs each run of a sweep ~1 s on the embedded corpus, and minutes on a large source.
SOURCE_INDEX = "source_index.json"
RACY_SECONDS = 2  # a file written this close to its hashing is not indexed: a second write could keep its stat


def _source_signature(cfg: DataConfig, vocab_size: int) -> tuple[str, float] | None:
    """(a key of every field the cache key depends on and the stat of every file read: path, size, inode, mtime,
    ctime, of which any write changes one; the newest mtime or ctime), or None: a hub dataset (what it holds is
    the hub's to say, not a file's stat), or a file that cannot be read (hashing then says why)."""
    files = [cfg.tokenizer] if cfg.tokenizer != "bpe" else []
    try:
        for field_name, source in (("data.source", cfg.source), ("data.val_source", cfg.val_source)):
            for entry in entries(source, field_name) if source is not None else []:
                kind, found = resolve(entry, field_name)
                if kind == "hub":
                    return None
                files += [default_corpus_path()] if kind == "default" else found
        stats = [(os.path.abspath(os.path.expanduser(f)), os.stat(os.path.expanduser(f))) for f in files]
    except (ConfigError, OSError):
        return None
    states = [[path, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns] for path, st in stats]
    fields = [FORMAT_VERSION, cfg.source, cfg.val_source, cfg.text_field, cfg.tokenizer, cfg.val_fraction]
    key = hashlib.sha256(json.dumps([*fields, cfg.max_documents, vocab_size, states]).encode()).hexdigest()
    return key, max((max(s[3], s[4]) / 1e9 for s in states), default=0.0)


def _read_index(root: str) -> dict:
    try:
        with open(os.path.join(root, "data", SOURCE_INDEX)) as f:
            index = json.load(f)
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}


def _cache_folder(cfg: DataConfig, vocab_size: int) -> str:
    """Hash the sources and build the cache folder for that content if no earlier run did; returns the folder.
    Files whose stat is unchanged since they were hashed are not read again (SOURCE_INDEX). A mixture's weights
    are not part of the key: a branch that changes them reads the same tokens."""
    root = _cache_root(cfg)
    signature = _source_signature(cfg, vocab_size)
    name = _read_index(root).get(signature[0]) if signature else None
    known = os.path.join(root, "data", name) if isinstance(name, str) and name.isalnum() else None
    if known and os.path.isfile(os.path.join(known, "stats.json")):
        with open(os.path.join(known, "stats.json")) as f:
            skipped = json.load(f).get("skipped_documents", 0)
        if skipped:
            log.warning("data: skipped %d documents with empty or non-string text", skipped)
        _say(f"sources unchanged since hashed: using cached tokens at {known} ({_token_counts(known)})")
        return known
    hashed_at = time.time()
    folder = _hashed_cache_folder(cfg, vocab_size, root)
    if signature and signature[1] < hashed_at - RACY_SECONDS and _source_signature(cfg, vocab_size) == signature:
        index = {**_read_index(root), signature[0]: os.path.basename(folder)}
        with contextlib.suppress(OSError):  # two runs racing at worst lose one entry: it is a cache
            rundir.write_json_atomic(os.path.join(root, "data", SOURCE_INDEX), index)
    return folder


def _hashed_cache_folder(cfg: DataConfig, vocab_size: int, root: str) -> str:
    """Read and hash the sources; build the folder of that content unless it exists."""
    sources = _read_sources(cfg, os.path.join(root, "hf_datasets"))
    tokenizer_spec = "bpe" if cfg.tokenizer == "bpe" else "sha256:" + _file_hash(cfg.tokenizer)
    key_fields = {
        "format": FORMAT_VERSION,
        "documents": sources.documents_key,
        "text_field": cfg.text_field,
        "tokenizer": tokenizer_spec,
        "vocab_size": vocab_size,
        "val": sources.val_spec,
        "max_documents": cfg.max_documents,
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()
    folder = os.path.join(root, "data", key[:16])
    if os.path.isdir(folder):
        _say(f"using cached tokens at {folder} ({_token_counts(folder)})")
        return folder
    stats = {
        "source": cfg.source,
        "val_source": cfg.val_source,
        "documents": {"train": sources.n_train, "val": sources.n_val},
        "tokens": {},
        "skipped_documents": sources.skipped,
        "tokenizer": cfg.tokenizer,
        "key": key,
    }
    if sources.weighted:  # per source, in data.source order; named and weighted when opened
        stats["sources"] = [
            {
                "entry": s.entry,
                "documents": {"train": s.n_train, "val": s.n_val},
                "tokens": {},
                "skipped_documents": s.skipped,
            }
            for s in sources.streams
        ]
    _build(folder, cfg, vocab_size, sources, stats)
    _say(f"cache ready at {folder} ({_token_counts(folder)})")
    return folder


def _token_counts(folder: str) -> str:
    with open(os.path.join(folder, "stats.json")) as f:
        tokens = json.load(f)["tokens"]
    return f"train {_count(tokens['train'])} tokens, val {_count(tokens['val'])} tokens"


def _named_source_stats(per_source: list, names: list, weights: list) -> dict:
    """A mixture's sources by name: weight, documents, tokens, and each one's share of the training tokens."""
    total = sum(s["tokens"]["train"] for s in per_source)
    return {
        name: {"weight": w, **s, "train_token_share": s["tokens"]["train"] / total}
        for name, w, s in zip(names, weights, per_source)
    }


def _check_sources_hold_a_sequence(cfg: DataConfig, data: PreparedData) -> None:
    """Each source of a mixture holds a training sequence; one without a validation sequence is only said."""
    for name, train, val in zip(
        data.train.source_names,
        data.train.sequences_per_source(cfg.seq_len),
        data.val.sequences_per_source(cfg.seq_len) if data.val.source_names else [None] * len(data.train.source_names),
    ):
        if train < 1:
            raise ConfigError(
                f"data.source / data.seq_len: the mixture's source {name!r} has "
                f"{data.stats['sources'][name]['tokens']['train']:,} training tokens, fewer than one "
                f"sequence of data.seq_len={cfg.seq_len} (+1 for the target); allowed: more documents "
                f"in it (data.max_documents counts per source), or a smaller data.seq_len"
            )
        if val == 0:
            log.warning(
                "data: the mixture's source %r holds no validation sequence of data.seq_len=%d: validation "
                "draws from the other sources",
                name,
                cfg.seq_len,
            )


def _check_enough_tokens(cfg: DataConfig, data: PreparedData, global_batch: int | None) -> None:
    """Train needs global_batch sequences (one when not given) and val one, each seq_len tokens plus one target."""
    _check_sources_hold_a_sequence(cfg, data)
    docs = data.stats["documents"]
    sequences = global_batch or 1
    need, have = sequences * cfg.seq_len + 1, len(data.train.tokens)
    if have < need:
        what = f"train.global_batch={global_batch} sequences" if global_batch else "one sequence"
        raise ConfigError(
            f"data.source / data.seq_len: the training split ({_documents(docs['train'])}) has "
            f"{have:,} tokens; {what} of data.seq_len={cfg.seq_len} need {need:,} ({sequences} x "
            f"{cfg.seq_len} + 1 for the last target); allowed: more documents in data.source, or a "
            f"smaller data.seq_len" + (" or train.global_batch" if global_batch else "")
        )
    need, have = cfg.seq_len + 1, len(data.val.tokens)
    if have < need:
        if cfg.val_source is not None:
            fields, split, allowed = "data.val_source", "data.val_source", "more documents in data.val_source"
        else:
            fields, split = "data.val_fraction", f"the last {cfg.val_fraction * 100:g}% of data.source"
            allowed = "a larger data.val_fraction, a data.val_source"
        raise ConfigError(
            f"{fields} / data.seq_len: the validation split ({split}, {_documents(docs['val'])}) has "
            f"{have:,} tokens; one sequence of data.seq_len={cfg.seq_len} needs {need:,} (+1 for the "
            f"target); allowed: {allowed}, or a smaller data.seq_len"
        )


def prepare_data(
    cfg: DataConfig,
    vocab_size: int,
    *,
    is_main: bool = True,
    share: Callable[[object], object] = lambda obj: obj,
    global_batch: int | None = None,
) -> PreparedData:
    """Load sources, hash them and tokenize once into a content-addressed cache folder (the main rank alone), then
    open that folder on every rank. `share` sends the main rank's object to every rank (a broadcast under torchrun);
    a failure on the main rank reaches the others as an error instead of a wait. The training split must hold
    `global_batch` sequences of cfg.seq_len (one when None) and the validation split one, else ConfigError."""
    check_data_config(cfg, vocab_size)
    failure = None
    if is_main:
        try:
            outcome = ("ok", _cache_folder(cfg, vocab_size))
        except Exception as error:
            failure, outcome = error, ("error", f"{type(error).__name__}: {error}")
    status, folder = share(outcome if is_main else None)
    if failure is not None:
        raise failure
    if status != "ok":
        raise RuntimeError(f"the main rank failed to prepare the data: {folder}")
    if not os.path.isdir(folder):
        raise RuntimeError(
            f"data cache {folder}, built by the main rank, is not visible here: on several nodes set "
            f"data.cache_dir (or ABLATE_CACHE) to a folder every node shares"
        )
    with open(os.path.join(folder, "stats.json")) as f:
        stats = json.load(f)
    stats.update(source=cfg.source, val_source=cfg.val_source)  # the same content may come from another path
    names, weights = source_names(cfg.source), source_weights(cfg.source) or []
    if weights:
        stats["sources"] = _named_source_stats(stats["sources"], names, weights)
    dtype = stats["dtype"]
    prepared = PreparedData(
        train=open_split(folder, "train", dtype, names),
        val=open_split(folder, "val", dtype, names),
        tokenizer_path=os.path.join(folder, "tokenizer.json"),
        vocab_size=stats["vocab_size"],
        eos_id=stats["eos_id"],
        cache_dir=folder,
        stats=stats,
        weights=tuple(weights),
    )
    _check_enough_tokens(cfg, prepared, global_batch)  # every rank: the same files, the same verdict
    return prepared
