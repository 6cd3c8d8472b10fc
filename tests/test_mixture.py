"""Weighted data mixtures (data.mixture, data.sources, data.prepare): the source syntax, preparation per source,
the share rule, resume, changed weights, validation per source, and token shares on real text. CPU, seconds."""

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer

from ablate.config import ConfigError, DataConfig
from ablate.data import sources, tokenizer_stats
from ablate.data.mixture import MixtureSampler, balanced
from ablate.data.prepare import check_data_config, prepare_data
from test_data import VOCAB, decode_docs, make_docs, write_file


@pytest.fixture
def docs():
    return make_docs(300)


def abc_mixture(weights=(0.6, 0.1, 0.3), seed=4, sizes=(50, 9, 23)):
    return MixtureSampler(list(sizes), list(weights), seed, ["a", "b", "c"][: len(sizes)], 8)


def test_weights_parse_normalise_and_a_colon_in_a_path_stays_a_path():
    pairs = sources.weighted_entries("wiki/*.jsonl.gz:7, books/b.parquet : 3 ,org/name:.5e1")
    assert pairs == [("wiki/*.jsonl.gz", 7.0), ("books/b.parquet", 3.0), ("org/name", 5.0)]
    assert sources.source_weights("a:7,b:3") == [0.7, 0.3] and sources.source_weights("a.jsonl,b.jsonl") is None
    assert sources.entries("/data/run:2/a.jsonl,/data/x:y.jsonl") == ["/data/run:2/a.jsonl", "/data/x:y.jsonl"]
    assert sources.entries("a.jsonl:0.25,default:0.75") == ["a.jsonl", "default"]
    assert sources.source_names(
        "/d/wiki2015/*.jsonl.gz:1,/d/openstax/openstax-00.jsonl.gz:1,org/TinyStories:1,default:1"
    ) == ["wiki2015", "openstax-00", "TinyStories", "default"]
    assert sources.source_names("/a/train/*.jsonl:1,/b/train/*.jsonl:1") == ["train-1", "train-2"]


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "a.jsonl:0.7,b.jsonl",
            r"data.source: 'b.jsonl' has no weight but 'a.jsonl:0.7' has one; allowed: 'default'.*"
            r"every part or on none",
        ),
        ("a.jsonl:0,b.jsonl:1", r"data.source: 'a.jsonl:0': weight 0 is not a finite number > 0; allowed: 'default'"),
        ("a.jsonl:-0.5,b.jsonl:1", r"'a.jsonl:-0.5': weight -0.5 is not a finite number > 0"),
        ("a.jsonl:1e999,b.jsonl:1", r"weight 1e999 is not a finite number > 0"),
        (":0.5,b.jsonl:0.5", r"data.source: ':0.5' has a weight but no source before the ':'"),
    ],
)
def test_weight_mistakes_name_the_field_and_the_part(source, message):
    with pytest.raises(ConfigError, match=message):
        check_data_config(DataConfig(source=source))


def test_a_weight_that_is_no_number_is_read_as_a_path_and_the_error_shows_the_forms(tmp_path, docs):
    path = write_file(tmp_path / "a.jsonl", docs)
    with pytest.raises(
        ConfigError,
        match=r"data.source: no such file or folder '.*a.jsonl:70%'.*or several such "
        r"sources joined by ','.*':weight'",
    ):
        check_data_config(DataConfig(source=f"{path}:70%"))
    check_data_config(DataConfig(source=f"{path}:0.7,{path}:0.3"))
    with pytest.raises(ConfigError, match="data.val_source: .* has weights, which only data.source takes"):
        check_data_config(DataConfig(source=path, val_source=f"{path}:1"))


def test_mixture_keeps_each_source_apart_and_holds_out_from_each(tmp_path, docs):
    a, b = write_file(tmp_path / "a.jsonl", docs[:200]), write_file(tmp_path / "b.parquet", docs[200:])

    def prepare(source):
        return prepare_data(DataConfig(source=source, seq_len=32, val_fraction=0.1, cache_dir=str(tmp_path)), VOCAB)

    prepared = prepare(f"{a}:3,{b}:1")
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    assert prepared.weights == (0.75, 0.25) and prepared.train.source_names == prepared.val.source_names == ("a", "b")
    assert decode_docs(prepared.train, tok, prepared.eos_id) == docs[:180] + docs[200:290]
    assert decode_docs(prepared.val, tok, prepared.eos_id) == docs[180:200] + docs[290:]
    per_source = prepared.stats["sources"]
    assert [per_source[n]["documents"] for n in "ab"] == [{"train": 180, "val": 20}, {"train": 90, "val": 10}]
    assert per_source["a"]["weight"] == 0.75 and per_source["b"]["entry"] == b
    starts = prepared.train.source_starts
    assert starts.tolist() == [0, prepared.train.doc_starts[180], len(prepared.train.tokens)]
    assert starts[1] == per_source["a"]["tokens"]["train"]

    # every window lies inside its own source: sequence indices run source after source
    sizes = prepared.train.sequences_per_source(32)
    assert prepared.train.num_sequences(32) == sizes.sum() and (sizes == (np.diff(starts) - 1) // 32).all()
    last_a, first_b = sizes[0] - 1, sizes[0]
    inputs, targets, _ = prepared.train.batch([last_a, first_b], 32)
    assert inputs[1].tolist() == prepared.train.tokens[starts[1] : starts[1] + 32].tolist()
    assert targets[0, -1].item() == prepared.train.tokens[last_a * 32 + 32] and last_a * 32 + 32 < starts[1]
    assert prepared.train.source_of([0, last_a, first_b, sizes.sum() - 1], 32).tolist() == [0, 0, 1, 1]
    assert prepared.train.tokens_per_source([0, first_b, first_b + 1], 32) == {"a": 32, "b": 64}

    # the weights are no part of the cache key: a branch changing them reads the same tokens
    other = prepare(f"{a}:1,{b}:1")
    assert other.cache_dir == prepared.cache_dir and other.weights == (0.5, 0.5)
    plain = prepare(f"{a},{b}")
    assert plain.cache_dir != prepared.cache_dir and plain.stats["documents"] == {"train": 270, "val": 30}


def test_mixture_with_a_val_source_and_a_source_too_small(tmp_path, docs):
    a, b, val = (
        write_file(tmp_path / f"{name}.jsonl", part)
        for name, part in [("a", docs[:150]), ("b", docs[150:250]), ("val", docs[250:])]
    )

    def prepare(source):
        return prepare_data(DataConfig(source=source, val_source=val, seq_len=32, cache_dir=str(tmp_path)), VOCAB)

    prepared = prepare(f"{a}:1,{b}:1")
    assert prepared.stats["documents"] == {"train": 250, "val": 50}
    assert prepared.val.source_names == ()
    tiny = write_file(tmp_path / "tiny.jsonl", ["Just a few words.", "And a few more."])
    with pytest.raises(
        ConfigError,
        match=r"data.source / data.seq_len: the mixture's source 'tiny' has \d+ training "
        r"tokens, fewer than one sequence of data.seq_len=32",
    ):
        prepare(f"{a}:1,{tiny}:1")


def test_tokenizer_text_alternates_between_sources_by_characters():
    x, y = ["x" * 100] * 5, ["y" * 10] * 30
    order = list(balanced([iter(x), iter(y)]))  # the next from whichever source gave fewer characters so far
    assert sorted(order) == sorted(x + y) and order[:12] == x[:1] + y[:10] + x[:1]
    assert list(balanced([iter(y)])) == y  # one stream: its own order


def test_mixture_shares_stay_within_one_sequence_of_the_weights():
    rng = np.random.default_rng(0)
    for _ in range(30):
        weights = rng.random(int(rng.integers(2, 6))) + 0.02
        sampler = MixtureSampler([7] * len(weights), weights, 0, [f"s{k}" for k in range(len(weights))], 16)
        counts = np.zeros(len(weights))
        for total in range(1, 400):
            counts[sampler.choose(1)[0]] += 1
            assert np.abs(counts - np.asarray(sampler.weights) * total).max() < 1


def test_mixture_order_is_deterministic_and_the_same_for_any_batch_sizes():
    whole = abc_mixture((0.5, 0.2, 0.3)).take(400)
    split, batches = abc_mixture((0.5, 0.2, 0.3)), [1, 7, 16, 3, 64, 5, 100, 2, 150, 52]  # n changes per step
    assert np.array_equal(np.concatenate([split.take(n) for n in batches]), whole)
    assert not np.array_equal(abc_mixture((0.5, 0.2, 0.3), seed=5).take(400), whole)
    sources_of = np.searchsorted(split.first, whole, side="right") - 1
    assert np.bincount(sources_of).tolist() == [200, 80, 120]
    # within a source: epoch after epoch, each a new permutation of its sequences
    epochs = [(whole[sources_of == 1] - split.first[1])[i : i + 9].tolist() for i in range(0, 72, 9)]
    assert all(sorted(e) == list(range(9)) for e in epochs) and len({tuple(e) for e in epochs}) > 1
    assert split.epochs_per_source() == {"a": 4.0, "b": 80 / 9, "c": 120 / 23}
    assert split.tokens_per_source() == {"a": 1600, "b": 640, "c": 960}
    assert split.source_stats()["b"] == {"weight": 0.2, "tokens": 640, "share": 0.2, "epochs": 80 / 9}


def test_mixture_resumes_bit_exact_mid_stream():
    reference, resumed, fresh = abc_mixture(), abc_mixture(), abc_mixture()
    stream = [reference.take(n) for n in [5, 11, 3, 17, 8, 13, 40, 2]]
    for chunk in stream[:4]:
        resumed.take(len(chunk))
    state = json.loads(json.dumps(resumed.state_dict()))  # survives a checkpoint's serialization
    fresh.load_state_dict(state)
    assert fresh.state_dict() == resumed.state_dict()
    assert np.array_equal(np.concatenate([fresh.take(len(c)) for c in stream[4:]]), np.concatenate(stream[4:]))
    assert fresh.state_dict() == reference.state_dict()
    with pytest.raises(ValueError, match="does not fit this mixture"):
        abc_mixture((1, 1), sizes=(50, 9)).load_state_dict(state)
    with pytest.raises(ValueError, match="one unweighted stream"):
        fresh.load_state_dict({"epoch": 0, "cursor": 3})


def test_new_weights_after_loading_keep_positions_and_apply_from_there():
    old, ahead, new = (abc_mixture(weights, sizes=(40, 40)) for weights in [(0.9, 0.1), (0.9, 0.1), (0.2, 0.8)])
    old.take(200)
    state = json.loads(json.dumps(old.state_dict()))
    ahead.load_state_dict(state)  # what each source would have given next
    next_of = {k: ahead.streams[k].take(100) + ahead.first[k] for k in range(2)}
    new.load_state_dict(state)
    assert new.drawn == old.drawn and new.tokens_per_source() == old.tokens_per_source()
    drawn = new.take(100)
    which = np.searchsorted(new.first, drawn, side="right") - 1
    for n in range(10, 101):  # the new weights from the load on, not making up for the 0.9/0.1 before it
        assert abs((which[:n] == 1).mean() - 0.8) < 1 / n
    for k in range(2):  # each source continues where it stood
        assert drawn[which == k].tolist() == next_of[k][: (which == k).sum()].tolist()


REAL = "/work/shared/data"  # real text beside the project (see its README)


@pytest.mark.skipif(not os.path.isdir(REAL), reason="needs the shared real text in /work/shared/data")
@pytest.mark.parametrize("wiki, openstax", [(0.7, 0.3), (0.3, 0.7)])  # 0.7/0.3 is also about the sizes' own mix
def test_real_mixture_token_shares_track_the_weights_within_one_percent(wiki, openstax):
    cfg = DataConfig(
        source=f"{REAL}/wiki2015/wiki-00.jsonl.gz:{wiki},{REAL}/openstax/*.jsonl.gz:{openstax}",
        max_documents=12,
        val_fraction=0.2,
        seq_len=64,
    )  # max_documents counts per source
    prepared = prepare_data(cfg, VOCAB)
    assert prepared.train.source_names == ("wiki-00", "openstax") and prepared.weights == (wiki, openstax)
    assert prepared.stats["sources"]["openstax"]["documents"] == {"train": 10, "val": 2}
    sampler, seen = prepared.sampler(cfg.seq_len, seed=0), {"wiki-00": 0, "openstax": 0}
    for step, batch in enumerate([16, 8, 24, 32, 16, 48, 8, 64] * 6):  # varying batch sizes
        for name, n in prepared.train.tokens_per_source(sampler.take(batch), cfg.seq_len).items():
            seen[name] += n
        if step >= 4:  # past 96 sequences
            assert abs(seen["openstax"] / sum(seen.values()) - openstax) < 0.01
    assert seen == sampler.tokens_per_source()
    assert seen["openstax"] / sum(seen.values()) == pytest.approx(openstax, abs=1e-3)
    val = tokenizer_stats.validation_documents(prepared.tokenizer_path, prepared.val, 4000)
    source = np.searchsorted(prepared.val.source_starts, val.starts, side="right") - 1
    for k in (0, 1):  # an equal share of the bytes per source: the same documents for every mix
        assert 2000 <= val.n_bytes[source == k].sum() < 2000 + val.n_bytes[source == k][-1]
    other_mix = DataConfig(
        **{**cfg.__dict__, "source": cfg.source.replace(f":{wiki}", ":0.2").replace(f":{openstax}", ":0.8")}
    )
    other = prepare_data(other_mix, VOCAB)
    assert tokenizer_stats.validation_documents(other.tokenizer_path, other.val, 4000).text_sha256 == val.text_sha256
