"""Tokenizer figures (ablate.data.tokenizer_stats), `ablate tokenizer` (ablate.cli.tokenizer), and runs of different
tokenizers in the report: fertility and continued words on a hand-counted text, refusals before compute, a run's
figures and bits per byte, the report comparing such runs by bits per byte."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from ablate.cli import tokenizer as tokenizer_command
from ablate.data import tokenizer_stats
from conftest import cli_in_process, run_cli
from report_fixtures import build_toy_experiment


def _hand_tokenizer(tmp_path=None):
    """Letters a-z and é one token each, merges th -> the and ca -> cat, <|endoftext|> special; words split on
    whitespace and punctuation, so each word's tokens can be counted by hand."""
    from tokenizers import AddedToken

    letters = list("abcdefghijklmnopqrstuvwxyz") + ["é", "."]
    vocab = {c: i for i, c in enumerate(letters)}
    merges = [("t", "h"), ("th", "e"), ("c", "a"), ("ca", "t")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    if tmp_path is not None:
        tok.save(str(tmp_path / "tokenizer.json"))
    return tok


def test_fertility_and_continued_words_on_a_hand_counted_text():
    tok = _hand_tokenizer()
    text = "the cat sat. né"
    # words: the (1 token: "the"), cat (1: "cat"), sat (3: s a t), . (1), né (2: n é): 8 tokens over 5 words
    assert [m.group() for m in tokenizer_stats.WORD.finditer(text)] == ["the", "cat", "sat", ".", "né"]
    fig = tokenizer_stats.figures(tok, tokenizer_stats.count_text(tok, [text, "   "]))
    assert fig["words"] == 5 and fig["tokens"] == 8 and fig["fertility"] == 8 / 5
    assert fig["continued_word_rate"] == 2 / 5  # sat, né
    assert fig["bytes"] == 16 + 3 and fig["bytes_per_token"] == 19 / 8  # é is 2 bytes; 3 spaces, no token
    used = {"the", "cat", "s", "a", "t", ".", "n", "é"}  # h, e, c only inside merged tokens
    assert fig["vocab_use"] == len(used) / (tok.get_vocab_size() - 1)  # the special token is left out
    assert fig["documents"] == 2


def test_a_byte_level_token_holding_part_of_a_character_counts_for_its_word(tmp_path):
    from ablate.data.tokenizer import train_bpe

    tok, _ = train_bpe(iter(["plain ascii words only"] * 20), 300)
    text = "café"  # é is two bytes, never merged here: c a f + two byte tokens, all four overlap the one word
    fig = tokenizer_stats.figures(tok, tokenizer_stats.count_text(tok, [text]))
    assert fig["words"] == 1 and fig["tokens"] == len(tok.encode(text).ids) and fig["fertility"] == fig["tokens"]
    assert fig["continued_word_rate"] == 1.0 and fig["bytes"] == 5


@pytest.mark.slow  # prepares the corpus twice (two BPEs): the whole suite runs it
def test_validation_documents_are_the_same_text_under_two_vocabularies(tmp_path):
    """Two BPE vocabularies on one data config: the validation documents are chosen by their bytes, so both score
    the same documents, the same bytes and text hash, with other token counts; each window of a document is scored
    against the tokens before it (eos before the document's first)."""
    from ablate.config import DataConfig
    from ablate.data.prepare import prepare_data

    cfg = DataConfig(seq_len=32, cache_dir=str(tmp_path))
    docs = {}
    for vocab in (512, 1024):
        data = prepare_data(cfg, vocab)
        docs[vocab] = (data, tokenizer_stats.validation_documents(data.tokenizer_path, data.val, 4000))
    (small, a), b = docs[512], docs[1024][1]
    assert a.text_sha256 == b.text_sha256 and a.n_bytes.tolist() == b.n_bytes.tolist()
    assert a.n_bytes.sum() >= 4000 > a.n_bytes[:-1].sum() and a.tokens > b.tokens
    # each document scored whole, every token of it a target once, its closing eos included
    windows = a.windows(32)
    assert sum(end - first for _, first, end in windows) == a.tokens and all(
        end - first <= 32 for _, first, end in windows
    )
    inputs, targets = small.val.document_batch(windows[:3], 32, small.eos_id)
    d, first, end = windows[0]
    assert first == a.starts[d] == 0 and inputs[0, 0] == small.eos_id
    assert targets[0, : end - first].tolist() == np.asarray(small.val.tokens[first:end]).tolist()
    assert inputs[0, 1 : end - first].tolist() == np.asarray(small.val.tokens[first : end - 1]).tolist()
    assert (targets[0, end - first :] == -100).all()


def test_bad_tokenizers_entry_is_refused_before_compute(tmp_path):
    for bad, why in (("bpe:x", "whole number >= 257"), ("bpe:100", ">= 257"), (str(tmp_path), "no such file")):
        result = cli_in_process("tokenizer", "default", "--tokenizers", f"bpe:512,{bad}", check=False)
        assert result.returncode == 2 and result.stdout == ""
        assert f"--tokenizers {bad!r}" in result.stderr and why in result.stderr
        assert "allowed: bpe:N" in result.stderr and "tokenizer.json" in result.stderr
    result = cli_in_process("tokenizer", "default/de", check=False)
    assert result.returncode == 2 and "default/en" in result.stderr and "'de'" in result.stderr


def test_ablate_tokenizer_on_files_with_a_trained_bpe_and_a_tokenizer_json(tmp_path):
    _hand_tokenizer(tmp_path)
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["the cat sat. né", "a cat"] * 30))
    result = cli_in_process("tokenizer", source, "--tokenizers", f"bpe:300,{tmp_path}", "--json")
    rows = json.loads(result.stdout)
    assert [(r["tokenizer"], r["corpus"]) for r in rows] == [("bpe:300", str(source)), (str(tmp_path), str(source))]
    assert 257 < rows[0]["vocab_size"] <= 300 and rows[0]["documents"] == 60  # this little text runs out of merges
    hand = rows[1]  # the hand tokenizer: per document pair 8 + 2 tokens over 5 + 2 words
    assert hand["words"] == 30 * 7 and hand["tokens"] == 30 * 10 and hand["fertility"] == pytest.approx(10 / 7)
    table = cli_in_process("tokenizer", source, "--tokenizers", str(tmp_path / "tokenizer.json")).stdout
    assert table.splitlines()[0].split()[:4] == ["tokenizer", "vocab", "corpus", "docs"] and "fertility" in table


def test_the_embedded_corpus_has_three_languages():
    assert sorted(tokenizer_command.embedded_languages()) == ["en", "es", "fr"]
    names = [c.name for c in tokenizer_command.corpora(["default"], max_documents=2)]
    assert names == ["default/en", "default/es", "default/fr"]


def test_one_tokenizer_keeps_validation_loss_per_token(tmp_path):
    root = build_toy_experiment(tmp_path / "toy", unfinished=False)
    cli_in_process("report", root, "--bootstrap", "100")
    report = json.loads((root / "report.json").read_text())
    assert report["tokenizers"]["differ"] is False and report["tokenizers"]["compared_by"] == "loss"
    assert {s["metric"] for s in report["groups"][0]["series"] if s["task"] == "val_loss"} == {"loss"}


def test_runs_of_different_tokenizers_without_val_bpb_leave_validation_out(tmp_path):
    root = build_toy_experiment(tmp_path / "toy", unfinished=False)  # runs logged val/loss alone
    for config_file in root.glob("C/seed*/config.json"):
        held = json.loads(config_file.read_text())
        held["config"]["model"]["vocab_size"] = 1024  # a BPE of another size: another tokenizer
        config_file.write_text(json.dumps(held))
    cli_in_process("report", root, "--bootstrap", "100")
    report = json.loads((root / "report.json").read_text())
    assert report["tokenizers"]["differ"] and report["tokenizers"]["compared_by"] is None
    assert report["tokenizers"]["tokenizers"] == ["bpe:512", "bpe:1024"]
    assert not [s for s in report["groups"][0]["series"] if s["task"] == "val_loss"]
    assert "validation is left out of the comparison" in report["headline"]["text"]


VOCABS = """
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    experiment="vocab",
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    data=DataConfig(source="default", max_documents=400, seq_len=32, val_sequences=8),
    train=TrainConfig(max_steps=8, global_batch=8, micro_batch=8, log_every=4, val_every=4, ckpt_every=8),
)
runs = [variant(base, "v512"), variant(base, "v1024", {"model.vocab_size": 1024})]
seeds = [0, 1]
"""


@pytest.mark.slow  # trains 2 vocabularies x 2 seeds with the CLI
def test_runs_of_different_tokenizers_score_the_same_text_and_compare_by_bits_per_byte(tmp_path):
    (tmp_path / "vocab.py").write_text(VOCABS)
    run_cli("run", tmp_path / "vocab.py", "--out", tmp_path / "runs")
    root = tmp_path / "runs" / "vocab"

    # a run's summary: bits per byte of its validation documents, their bytes counted apart here from the text
    summary = json.loads((root / "v512" / "seed0" / "summary.json").read_text())
    val = summary["val_scored"]
    last = sorted((root / "v512" / "seed0").glob("eval_items/*/val_loss.jsonl"))[-1]
    items = [json.loads(line) for line in last.open()]
    assert val["documents"] == len(items) and val["bytes"] == sum(i["bytes"] for i in items)
    assert val["tokens"] == sum(i["tokens"] for i in items)
    assert summary["final_val_bpb"] == pytest.approx(
        summary["final_val_loss"] * val["tokens"] / val["bytes"] / math.log(2)
    )
    figures = summary["tokenizer"]
    assert figures["vocab_size"] == 512 and 1 < figures["fertility"] < 4 and 0 < figures["continued_word_rate"] < 1
    assert figures["bytes_per_token"] > 1 and 0 < figures["vocab_use"] <= 1 and len(figures["sha256"]) == 64

    # which text was scored: the same documents under both vocabularies (other token counts, the same bytes), so
    # the report compares validation by bits per byte
    scored = {
        (v, k): json.loads((root / v / f"seed{k}" / "summary.json").read_text())["val_scored"]
        for v in ("v512", "v1024")
        for k in (0, 1)
    }
    assert len({s["text_sha256"] for s in scored.values()}) == 1 and len({s["bytes"] for s in scored.values()}) == 1
    assert scored[("v512", 0)]["tokens"] > scored[("v1024", 0)]["tokens"]
    run_cli("report", root, "--bootstrap", "100")
    report = json.loads((root / "report.json").read_text())
    assert report["tokenizers"]["differ"] and report["tokenizers"]["compared_by"] == "bpb"
    assert {s["metric"] for s in report["groups"][0]["series"] if s["task"] == "val_loss"} == {"bpb"}
    markdown = (root / "report.md").read_text()
    assert "| fertility | bytes/token |" in markdown and "bpe:1024" in markdown

    # runs whose texts differ (here: one trained before ablate recorded it) are refused, with the reason
    for summary_file in root.glob("v1024/seed*/summary.json"):
        held = json.loads(summary_file.read_text())
        del held["val_scored"]["text_sha256"]
        summary_file.write_text(json.dumps(held))
    result = run_cli("report", root, "--bootstrap", "100")
    report = json.loads((root / "report.json").read_text())
    assert report["tokenizers"]["compared_by"] is None
    assert not [s for s in report["groups"][0]["series"] if s["task"] == "val_loss"]
    assert "trained before ablate recorded it" in result.stdout
