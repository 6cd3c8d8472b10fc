"""A run's fixed costs (scripts/bench_fixed_costs.py measures them): the tokenizer's figures and the validation
documents worked out once per process for the same content (a stack's members, runs one after another), one host
read per validation, and the collector walking only what a run made."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from ablate.data import tokenizer_stats
from ablate.data.token_files import TokenData
from conftest import TINY, cli_in_process

TEXTS = [f"document {k}: the quick brown fox jumps over {k} lazy dogs." for k in range(40)]


def _split(tok, texts) -> TokenData:
    """The texts as a prepared split holds them: each document's ids, then eos."""
    eos = tok.token_to_id("<|endoftext|>")
    tokens, starts = [], []
    for text in texts:
        starts.append(len(tokens))
        tokens += tok.encode(text, add_special_tokens=False).ids + [eos]
    return TokenData(np.asarray(tokens, dtype=np.uint16), np.asarray(starts, dtype=np.int64))


@pytest.fixture
def tokenizer(tmp_path):
    from ablate.data.tokenizer import train_bpe

    tok, _ = train_bpe(iter(TEXTS * 5), 300)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    tokenizer_stats._MEMO.clear()
    yield tok, str(path)
    tokenizer_stats._MEMO.clear()


def test_a_tokenizers_figures_are_worked_out_once_for_the_same_content(tokenizer, monkeypatch, tmp_path):
    """Each member of a stack opens the cache's files anew: equal content (not the same objects) finds the figures
    worked out once; other documents, or another tokenizer under the same path, are worked out afresh."""
    tok, path = tokenizer
    counted = []
    count_text = tokenizer_stats.count_text
    monkeypatch.setattr(tokenizer_stats, "count_text", lambda *a: counted.append(1) or count_text(*a))
    val = _split(tok, TEXTS)
    first = tokenizer_stats.validation_figures(path, val.tokens, val.doc_starts)
    again = _split(tok, TEXTS)  # another copy of the same split, as the next member opens it
    second = tokenizer_stats.validation_figures(path, again.tokens, again.doc_starts)
    assert second == first and len(counted) == 1
    second["fertility"] = -1.0  # each call's figures are its own copy
    assert tokenizer_stats.validation_figures(path, val.tokens, val.doc_starts) == first and len(counted) == 1

    other = _split(tok, TEXTS[:-1] + ["another last document."])
    assert tokenizer_stats.validation_figures(path, other.tokens, other.doc_starts) != first and len(counted) == 2
    # only the documents read count: those starting before max_tokens (their last one whole)
    limit = int(val.doc_starts[3])
    short = tokenizer_stats.validation_figures(path, val.tokens, val.doc_starts, max_tokens=limit)
    tail = _split(tok, TEXTS[:3] + ["a different rest"] * 5)
    assert tokenizer_stats.validation_figures(path, tail.tokens, tail.doc_starts, max_tokens=limit) == short
    assert len(counted) == 3 and short["documents"] == 3

    from ablate.data.tokenizer import train_bpe

    train_bpe(iter(TEXTS * 5), 280)[0].save(path)  # another tokenizer, the same file name
    assert tokenizer_stats.validation_figures(path, val.tokens, val.doc_starts)["sha256"] != first["sha256"]
    assert len(counted) == 4


def test_the_validation_documents_are_chosen_once_and_shared_read_only(tokenizer, monkeypatch):
    tok, path = tokenizer
    chosen = []
    choose = tokenizer_stats._validation_documents
    monkeypatch.setattr(tokenizer_stats, "_validation_documents", lambda *a: chosen.append(1) or choose(*a))
    docs = tokenizer_stats.validation_documents(path, _split(tok, TEXTS), 500)
    same = tokenizer_stats.validation_documents(path, _split(tok, TEXTS), 500)
    assert same is docs and len(chosen) == 1
    assert docs.n_bytes.sum() >= 500 > docs.n_bytes[:-1].sum()
    with pytest.raises(ValueError, match="read-only"):
        docs.starts[0] = 1
    tokenizer_stats.validation_documents(path, _split(tok, TEXTS), 900)  # another budget: chosen anew
    assert len(chosen) == 2


def test_a_validation_reads_the_host_once_and_scores_as_a_read_a_pass_did(tokenizer, monkeypatch):
    """Every pass's per-window sums stay on the device until the last pass: one .tolist for the whole
    validation, the same numbers as reading each pass's own."""
    from ablate.config import ModelConfig
    from ablate.model import Transformer
    from ablate.training.callbacks.validation import Validation
    from ablate.training.parallel import init_distributed

    tok, path = tokenizer
    val = _split(tok, TEXTS)
    model = Transformer(ModelConfig(vocab_size=320, d_model=32, n_layers=1, n_heads=2), max_seq_len=16)
    model.init_weights(torch.Generator().manual_seed(0))
    data = type("Data", (), {"val": val, "tokenizer_path": path, "eos_id": tok.token_to_id("<|endoftext|>")})
    trainer = type("Trainer", (), {"model": model, "data": data, "dist": init_distributed("cpu"), "seq_len": 16})
    validation = Validation(every=1, sequences=8, micro_batch=3)  # several passes, the last one short
    windows = validation.documents(trainer).windows(16)
    assert len(windows) > 6 and len(windows) % 3

    reads, tolist = [], torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.shape) or tolist(self))
    nats = validation.document_nats(trainer)
    monkeypatch.undo()
    assert reads == [(len(windows),)]

    expected = np.zeros(len(nats))  # a pass at a time, each read on its own, as validation read them before
    for start in range(0, len(windows), 3):
        chunk = windows[start : start + 3]
        inputs, targets = val.document_batch(chunk, 16, data.eos_id)
        for (doc, _, _), value in zip(chunk, model.per_token_loss(inputs, targets).sum(dim=1).tolist()):
            expected[doc] += value
    assert nats.tolist() == expected.tolist()  # bit for bit


@pytest.mark.slow  # trains the tiny experiment's two variants in this process
def test_runs_one_after_another_are_collected_with_the_survivors_frozen(tmp_path, monkeypatch):
    """During each run the objects alive at its start wait in the collector's permanent generation; after the
    command nothing is left frozen, and the collection after each run still freed its model."""
    from ablate.training import trainer

    models, frozen = [], []  # weak references to each run's model; the frozen objects while it was built
    build = trainer.Trainer._build_model

    def recorded(self, *args):
        model = build(self, *args)
        models.append(weakref.ref(model))
        frozen.append(gc.get_freeze_count())
        return model

    monkeypatch.setattr(trainer.Trainer, "_build_model", recorded)
    assert gc.get_freeze_count() == 0
    cli_in_process("run", TINY, "--out", tmp_path)
    assert len(models) == 2 and min(frozen) > 10_000  # torch's modules, at least
    assert gc.get_freeze_count() == 0
    assert [ref() for ref in models] == [None, None]  # freed by the collection after each run
