"""`ablate tokenizer FILES`: fertility, continued-word rate, bytes per token and vocabulary use of each tokenizer
(bpe:N trained on FILES, a tokenizer.json, a run's tokenizer) on each corpus (a data source, or the embedded
corpus one language at a time). The figures themselves, and their definition of a word, are
ablate.data.tokenizer_stats: the same as every run's summary.json, so they compare.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ablate import rundir
from ablate.cli.options import PATH, number, text
from ablate.config import ConfigError
from ablate.data.sources import check_source_file, default_corpus_path, entries, load_documents, resolve, valid_texts
from ablate.data.tokenizer import load_tokenizer_file, train_bpe
from ablate.text import aligned

SPEC_FORMS = (
    "bpe:N (a byte-level BPE of N >= 257 tokens trained on FILES, as data.tokenizer='bpe' trains one), a "
    "tokenizer.json, or a run folder holding one; comma-separated"
)


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "tokenizer",
        help="fertility, continued-word rate, bytes per token, vocabulary use of tokenizers, per corpus or language",
    )
    parser.add_argument(
        "files",
        nargs="+",
        type=PATH,
        metavar="FILES",
        help="'default' (the embedded corpus: en, es, fr, a row each), default/<lang>, or data sources as "
        "data.source takes them (jsonl/jsonl.gz/json/parquet/txt files, folders, globs)",
    )
    parser.add_argument(
        "--tokenizers",
        default="bpe:8192",
        type=text("bpe:N, a tokenizer.json or a run folder, comma-separated"),
        help="comma-separated: bpe:N (a byte-level BPE of N tokens trained on FILES, as data.tokenizer='bpe' "
        "trains one), a tokenizer.json, or a run folder (its tokenizer.json) (default: bpe:8192). A word is a run "
        "of letters, digits and underscores, or one punctuation or symbol character",
    )
    parser.add_argument("--text-field", default="text", type=text("a column name"), help="text column (default: text)")
    parser.add_argument("--max-documents", type=number(int, 1), help="read only the first N documents of each corpus")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.set_defaults(func=cmd_tokenizer)


def cmd_tokenizer(args) -> int:
    """Fertility, continued-word rate, bytes per token and vocabulary use of each tokenizer on each corpus."""
    specs = parse_specs(args.tokenizers)  # every entry checked before any compute
    bodies = corpora(args.files, args.text_field, args.max_documents)
    rows = study(specs, bodies)
    print(json.dumps(rows, indent=1) if args.json else tokenizer_table(rows))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# the tokenizers (--tokenizers)


@dataclass
class Spec:
    text: str  # as given
    bpe_size: int | None = None  # bpe:N
    path: str | None = None  # a tokenizer.json


def parse_specs(text: str) -> list[Spec]:
    """--tokenizers: each entry bpe:N or a tokenizer.json (or a run folder holding one), checked and loaded before
    any compute; ConfigError naming the entry and the allowed forms."""
    specs = []
    for entry in [e.strip() for e in text.split(",") if e.strip()] or [text]:
        where = f"--tokenizers {entry!r}"
        if entry.lower().startswith("bpe:"):
            size = entry[4:].strip()
            if not size.isdigit() or int(size) < 257:
                raise ConfigError(f"{where}: N must be a whole number >= 257 (256 bytes + eos); allowed: {SPEC_FORMS}")
            specs.append(Spec(entry, bpe_size=int(size)))
            continue
        path = os.path.expanduser(entry)
        if os.path.isdir(path):
            path = os.path.join(path, rundir.TOKENIZER)  # a run folder
        if not os.path.isfile(path):
            raise ConfigError(f"{where}: not bpe:N and no such file{_relative(path)}; allowed: {SPEC_FORMS}")
        load_tokenizer_file(path, field_name=where, allowed=SPEC_FORMS)  # a broken file is named now
        specs.append(Spec(entry, path=path))
    return specs


def _relative(path: str) -> str:
    return "" if os.path.isabs(path) else f" (relative to {os.getcwd()})"


# ---------------------------------------------------------------------------------------------------------------
# the corpora (FILES)


@dataclass
class Corpus:
    name: str
    texts: Callable[[], Iterator[str]]  # a fresh pass over its documents


def embedded_languages() -> dict[str, str]:
    """{language: file} of the embedded package: summaries_en-us.json -> en (data.source='default' is its en)."""
    folder = os.path.dirname(default_corpus_path())
    found = sorted(glob.glob(os.path.join(folder, "summaries_*.json")))
    return {os.path.basename(p)[len("summaries_") :].split("-")[0].split(".")[0]: p for p in found}


def _embedded_texts(path: str, max_documents: int | None) -> Callable[[], Iterator[str]]:
    def texts():
        with open(path, encoding="utf-8") as f:
            articles = json.load(f)  # {title: {"title", "extract", ...}}
        docs = (a.get("extract") for a in articles.values() if isinstance(a, dict))
        return itertools.islice((t for t in docs if isinstance(t, str) and t.strip()), max_documents)

    return texts


def corpora(files: list[str], text_field: str = "text", max_documents: int | None = None) -> list[Corpus]:
    """FILES as corpora, each checked before any compute: 'default' as one corpus per language of the embedded
    package, default/<language> as one, anything else as data.source reads it (named as given)."""
    out = []
    for given in files:
        if given == "default" or given.startswith("default/"):
            languages = embedded_languages()
            chosen = list(languages) if given == "default" else [given.split("/", 1)[1]]
            for lang in chosen:
                if lang not in languages:
                    raise ConfigError(
                        f"FILES: {given!r}: the embedded corpus has no language {lang!r}; allowed: "
                        + ", ".join(["default"] + [f"default/{k}" for k in languages])
                    )
                out.append(Corpus(f"default/{lang}", _embedded_texts(languages[lang], max_documents)))
            continue
        for entry in entries(given, "FILES"):
            kind, paths = resolve(entry, "FILES")
            for path in paths if kind == "files" else []:
                check_source_file(path, "FILES", text_field)
        out.append(Corpus(given, _source_texts(given, text_field, max_documents)))
    return out


def _source_texts(source: str, text_field: str, max_documents: int | None) -> Callable[[], Iterator[str]]:
    parts = []

    def texts():
        if not parts:  # loaded once, on the first pass
            parts.extend(load_documents(source, text_field, field_name="FILES"))
        return valid_texts(parts, max_documents)

    return texts


# ---------------------------------------------------------------------------------------------------------------
# the study and its table (numpy imported here, not at the top: `ablate status` imports every command module)


def _say(message: str) -> None:
    print(f"tokenizer: {message}", file=sys.stderr, flush=True)


def load_or_train(spec: Spec, bodies: list[Corpus]):
    """The tokenizer of a spec: loaded, or a byte-level BPE trained on every corpus, interleaved so that the
    trainer's text cap holds about as much of each."""
    from ablate.data import mixture

    if spec.path is not None:
        return load_tokenizer_file(spec.path, field_name=f"--tokenizers {spec.text!r}", allowed=SPEC_FORMS)[0]
    _say(f"training {spec.text} on {len(bodies)} corpus(es) ...")
    tok, _ = train_bpe(mixture.balanced([c.texts() for c in bodies]), spec.bpe_size)
    return tok


def study(specs: list[Spec], bodies: list[Corpus]) -> list[dict]:
    """One row per tokenizer x corpus."""
    from ablate.data.tokenizer_stats import count_text, figures

    rows = []
    for spec in specs:
        tok = load_or_train(spec, bodies)
        for corpus in bodies:
            rows.append(
                {"tokenizer": spec.text, "corpus": corpus.name, **figures(tok, count_text(tok, corpus.texts()))}
            )
    return rows


TABLE_COLUMNS = [
    ("tokenizer", "tokenizer", str),
    ("vocab", "vocab_size", lambda v: f"{v:,}"),
    ("corpus", "corpus", str),
    ("docs", "documents", lambda v: f"{v:,}"),
    ("MB", "bytes", lambda v: f"{v / 1e6:.2f}"),
    ("words", "words", lambda v: f"{v:,}"),
    ("fertility", "fertility", lambda v: f"{v:.3f}"),
    ("continued", "continued_word_rate", lambda v: f"{v:.1%}"),
    ("bytes/token", "bytes_per_token", lambda v: f"{v:.3f}"),
    ("vocab use", "vocab_use", lambda v: f"{v:.1%}"),
]


def tokenizer_table(rows: list[dict]) -> str:
    """The study as an aligned table (text columns left, figures right), then what the columns mean."""
    from ablate.data.tokenizer_stats import WORD_DEFINITION

    cells = [[name for name, _, _ in TABLE_COLUMNS]] + [[show(r[key]) for _, key, show in TABLE_COLUMNS] for r in rows]
    legend = (
        f"fertility: tokens per word; continued: share of words split into more than one token ({WORD_DEFINITION}); "
        "bytes/token: UTF-8 bytes per token; vocab use: share of the vocabulary's ids (special tokens left out) "
        "the corpus uses. A bpe:N is trained on all FILES together: in-sample figures."
    )
    return "\n".join([aligned(cells, text_columns=(0, 2)), ""] + textwrap.wrap(legend, 118))
