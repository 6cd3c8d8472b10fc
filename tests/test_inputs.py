"""Every bad input stops with one message naming the file and the line or field, before any training compute:
bad data files, tokenizers, paths, seeds, --out, --only, --set, devices, experiment files whose runs() raises."""

import gzip
import json
import os
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ablate.config import ConfigError, DataConfig
from ablate.data.prepare import prepare_data
from ablate.setup.experiment import ExperimentError, check_runs_root, load_experiment
from conftest import TINY, cli_in_process, run_cli
from test_data import VOCAB, make_docs, write_file, write_jsonl


def experiment(tmp_path, data: str, name: str = "exp.py") -> str:
    """An experiment file with one tiny run on DataConfig(<data>)."""
    path = tmp_path / name
    path.write_text(
        textwrap.dedent(f"""\
        from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig
        runs = [RunConfig(name="a", model=ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=4),
                          data=DataConfig({data}),
                          train=TrainConfig(max_steps=2, global_batch=4, micro_batch=4, peak_flops=1e11))]
        seeds = [0]
    """)
    )
    return str(path)


def cli_error(tmp_path, *args, fresh_process: bool = False) -> str:
    """Run `ablate run ...` (in this process, or a fresh one); it must stop with exit code 2 and one message, no
    traceback. Returns stderr."""
    run = run_cli if fresh_process else cli_in_process
    result = run("run", *args, "--out", str(tmp_path / "runs"), check=False)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "ablate: error: " in result.stderr, result.stderr
    return result.stderr


def load_error(path, **kwargs) -> str:
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path, **kwargs)
    return str(caught.value)


def prepare_error(tmp_path, **data) -> str:
    with pytest.raises(ConfigError) as caught:
        prepare_data(DataConfig(cache_dir=str(tmp_path / "cache"), **data), VOCAB)
    return str(caught.value)


# ---------------------------------------------------------------------------------------------------------------
# data files: empty, unparsable, binary


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.txt", "empty.parquet", "empty.jsonl.gz", "blank.txt"])
def test_an_empty_source_file_is_refused_at_load(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    elif name.endswith(".gz"):
        with gzip.open(path, "wb"):
            pass
    else:
        path.write_text("\n\n  \n" if name == "blank.txt" else "")
    message = load_error(experiment(tmp_path, f"source={str(path)!r}"))
    assert f"variant 'a': data.source: {path}: empty file" in message and "allowed: " in message


def test_a_non_json_line_names_the_file_and_its_line(tmp_path):
    lines = [json.dumps({"text": d}) for d in make_docs(40)]
    lines[5] = ""  # blank lines count: the number is the line in the file, 1-based
    lines[30] = '{"text": "unterminated'
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    exp = experiment(tmp_path, f"source={str(bad)!r}, seq_len=16")
    load_experiment(exp)  # the first record is fine: loading checks only the start of a file
    message = prepare_error(tmp_path, source=str(bad), seq_len=16)
    assert message.startswith(f"data.source: {bad}:31: not JSON (") and "allowed: one JSON object per line" in message
    assert f"{bad}:31: not JSON" in cli_error(tmp_path, exp)
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(["not json"] + lines[:4]) + "\n")
    assert f"data.source: {first}:1: not JSON" in load_error(experiment(tmp_path, f"source={str(first)!r}"))
    array = tmp_path / "array.jsonl"
    array.write_text("[1, 2]\n")
    assert f"{array}:1: a JSON list, not an object" in load_error(experiment(tmp_path, f"source={str(array)!r}"))


def test_binary_and_non_utf8_sources_name_the_file_and_line(tmp_path):
    blob = tmp_path / "blob.txt"
    blob.write_bytes(bytes(range(256)) * 64)
    assert f"data.source: {blob}:1: binary content" in load_error(experiment(tmp_path, f"source={str(blob)!r}"))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 au lait\n\nna\u00efve".encode("latin-1"))
    message = load_error(experiment(tmp_path, f"source={str(latin1)!r}"))
    assert f"{latin1}:1: not UTF-8 text (byte 0xe9 at column 4); allowed: UTF-8 text" in message
    # past the start that loading checks: found when the data is read, with the right line
    docs = make_docs(2000)
    late_txt = tmp_path / "late.txt"
    late_txt.write_bytes("\n\n".join(docs[:1500]).encode() + b"\n\nbad \xff byte\n\n" + "\n\n".join(docs).encode())
    assert prepare_error(tmp_path, source=str(late_txt)).startswith(f"data.source: {late_txt}:3001: not UTF-8 text")
    in_string = tmp_path / "in_string.jsonl"
    rows = [json.dumps({"text": d}).encode() for d in docs[:20]]
    rows[11] = b'{"text": "caf\xe9"}'  # valid JSON, invalid UTF-8: datasets loads it and fails only when read
    in_string.write_bytes(b"\n".join(rows) + b"\n")
    assert prepare_error(tmp_path, source=str(in_string)).startswith(f"data.source: {in_string}:12: not UTF-8 text")
    not_gzip = tmp_path / "plain.jsonl.gz"
    not_gzip.write_text('{"text": "a"}\n')
    assert f"{not_gzip}: cannot be read (BadGzipFile" in load_error(experiment(tmp_path, f"source={str(not_gzip)!r}"))
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00garbage" * 100)
    assert f"{garbage}: not a readable parquet file" in load_error(experiment(tmp_path, f"source={str(garbage)!r}"))


def test_a_broken_json_file_names_its_line(tmp_path):
    path = tmp_path / "docs.json"
    path.write_text('[\n {"text": "a"},\n {"text": b}\n]\n')
    load_experiment(experiment(tmp_path, f"source={str(path)!r}"))  # .json is parsed only when loaded
    assert prepare_error(tmp_path, source=str(path)).startswith(f"data.source: {path}:3: not JSON")


# ---------------------------------------------------------------------------------------------------------------
# too little data, empty validation source


def test_a_corpus_shorter_than_a_sequence_says_how_many_tokens(tmp_path):
    source = write_jsonl(tmp_path / "short.jsonl", make_docs(30))
    message = prepare_error(tmp_path, source=source, seq_len=4096)
    assert message.startswith("data.source / data.seq_len: the training split (29 documents) has ")
    assert "one sequence of data.seq_len=4096 need 4,097 (1 x 4096 + 1 for the last target)" in message
    with pytest.raises(ConfigError, match=r"train.global_batch=1000 sequences of data.seq_len=32 need 32,001 \("):
        prepare_data(DataConfig(source=source, seq_len=32, cache_dir=str(tmp_path / "cache")), VOCAB, global_batch=1000)
    message = prepare_error(tmp_path, source=source, seq_len=512)  # train holds a sequence, its 1 val doc not
    assert (
        message.startswith(
            "data.val_fraction / data.seq_len: the validation split (the last 2% of data.source, 1 document) has "
        )
        and "needs 513" in message
    )
    val = write_jsonl(tmp_path / "val.jsonl", ["A short one."])
    assert prepare_error(tmp_path, source=source, val_source=val, seq_len=32).startswith(
        "data.val_source / data.seq_len: the validation split (data.val_source, 1 document) has "
    )
    stderr = cli_error(tmp_path, experiment(tmp_path, f"source={source!r}, seq_len=4096"))
    # the command checks the data against the experiment's global batch before any run starts
    assert (
        "data.source / data.seq_len: the training split" in stderr and "sequences of data.seq_len=4096 need" in stderr
    )


def test_an_empty_val_source_is_refused(tmp_path):
    source = write_jsonl(tmp_path / "a.jsonl", make_docs(100))
    empty = tmp_path / "val.jsonl"
    empty.write_text("")
    message = load_error(experiment(tmp_path, f"source={source!r}, val_source={str(empty)!r}"))
    assert f"data.val_source: {empty}: empty file" in message
    blank_texts = write_jsonl(tmp_path / "blank_val.jsonl", ["", "  "])
    message = prepare_error(tmp_path, source=source, val_source=blank_texts, seq_len=16)
    assert message.startswith(f"data.val_source: {blank_texts!r} holds no usable document (2 empty or non-string")


# ---------------------------------------------------------------------------------------------------------------
# tokenizer files, paths


def test_a_garbage_tokenizer_json_is_refused_at_load(tmp_path):
    source = write_jsonl(tmp_path / "a.jsonl", make_docs(50))
    not_json = tmp_path / "tok.json"
    not_json.write_text("{\n  'model': oops\n}\n")
    message = load_error(experiment(tmp_path, f"source={source!r}, tokenizer={str(not_json)!r}"))
    assert f"data.tokenizer: {not_json}:2: not JSON (" in message and "allowed: 'bpe' or a tokenizer.json" in message
    other_json = tmp_path / "config.json"
    other_json.write_text(json.dumps({"vocab_size": 300}))
    message = load_error(experiment(tmp_path, f"source={source!r}, tokenizer={str(other_json)!r}"))
    assert f"data.tokenizer: {other_json}: JSON, but not a tokenizer (no 'model')" in message
    binary = tmp_path / "tokenizer.bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    message = load_error(experiment(tmp_path, f"source={source!r}, tokenizer={str(binary)!r}"))
    assert f"data.tokenizer: {binary}: not UTF-8 text" in message


def test_a_path_typo_is_no_such_file_not_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for typo in ("data/wiki.jsonl", "wiki.jsonl", "./corpus", "../corpus", "~/no-such-corpus", "a/b/c"):
        message = load_error(experiment(tmp_path, f"source={typo!r}"))
        assert f"data.source: no such file or folder {typo!r}" in message, message
    assert f"(relative to {tmp_path})" in load_error(experiment(tmp_path, "source='data/wiki.jsonl'"))


def test_a_missing_org_name_path_names_both_possibilities(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on a machine without internet, without waiting for retries
    # a fresh process: huggingface_hub reads HF_HUB_OFFLINE when it is imported (and the command end to end)
    stderr = cli_error(tmp_path, experiment(tmp_path, "source='data/train'"), fresh_process=True)
    assert "data.source: no local file or folder 'data/train'" in stderr
    assert "if it is a hub dataset, it needs internet" in stderr


def test_a_broken_file_in_a_local_hub_layout_folder_is_named(tmp_path):
    repo = tmp_path / "my_dataset"
    (repo / "data").mkdir(parents=True)
    write_jsonl(repo / "data" / "train-00000-of-00002.jsonl", make_docs(50))
    broken = repo / "data" / "train-00001-of-00002.jsonl"
    broken.write_text('{"text": "fine"}\n{"text": broken}\n')
    assert prepare_error(tmp_path, source=str(repo)).startswith(f"data.source: {broken}:2: not JSON")


# ---------------------------------------------------------------------------------------------------------------
# the experiment file and the CLI's choices


def test_negative_or_repeated_seeds_are_refused(tmp_path):
    assert load_error(TINY, seeds=[-1]).startswith("--seeds -1: got [-1]; allowed: a non-empty list of ints >= 0")
    assert "--seeds 0,0: repeated seeds [0]" in load_error(TINY, seeds=[0, 0])
    path = tmp_path / "exp.py"
    path.write_text("from ablate import RunConfig\n\nruns = [RunConfig()]\nseeds = [0, -2]\n")
    assert load_error(path).startswith(f"{path}:4: seeds: got [0, -2]; allowed: a non-empty list of ints >= 0")
    # the command line's --seeds: tests/test_cli_options.py


def test_out_that_is_a_file_is_refused(tmp_path):
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    with pytest.raises(ExperimentError, match=rf"^--out {a_file}: is a file; allowed: a folder \(it is created"):
        check_runs_root(a_file)
    with pytest.raises(ExperimentError, match=rf"^--out {a_file}/runs: {a_file} is a file; allowed: a folder"):
        check_runs_root(a_file / "runs")
    assert check_runs_root(tmp_path / "new" / "runs") == tmp_path / "new" / "runs"
    assert check_runs_root(tmp_path) == tmp_path  # the command line's --out: tests/test_cli_options.py


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            """\
     from ablate import RunConfig

     def runs():
         base = RunConfig()
         raise ValueError("no runs today")
     """,
            r"exp.py:5: ValueError: no runs today$",
        ),
        (
            """\
     from ablate import RunConfig, grid, variant

     def runs():
         base = RunConfig()
         good = variant(base, "a")
         return [good] + grid(base, {"model.n_kv_heads": [1, 3]})
     """,
            r"exp.py:6: ConfigError: model.n_kv_heads: 3 does not divide model.n_heads=4",
        ),
        (
            """\
     from ablate import RunConfig

     def runs():
         return [RunConfig(), "b"]
     """,
            r"exp.py:3: runs\[1\] is a str; allowed: RunConfig",
        ),
    ],
)
def test_a_runs_function_that_fails_names_the_line_inside_it(tmp_path, body, expected):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(body))
    with pytest.raises(ExperimentError, match=expected):
        load_experiment(path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_at_load():
    message = load_error(TINY, overrides={"train.device": "cuda"})
    assert message.endswith(
        "variant 'mha': train.device: 'cuda' but no CUDA device is visible here; allowed here: 'auto', 'cpu'"
    )


def test_set_name_over_several_variants_is_refused(tmp_path):
    message = load_error(TINY, overrides={"name": "x"})
    assert message == (
        "--set name=x would give every one of the 2 variants the same name; allowed: --set name=... "
        "only with one variant (use --only)"
    )
    assert [r.name for r in load_experiment(TINY, only="mqa", overrides={"name": "x"})] == ["x"]
    assert [r.experiment for r in load_experiment(TINY, overrides={"experiment": "e2"})] == ["e2", "e2"]
    assert "--set name=x would give every one of the 2 variants" in cli_error(tmp_path, str(TINY), "--set", "name=x")


def test_only_takes_names_and_globs_and_keeps_grid_names_whole(tmp_path):
    path = tmp_path / "sweep.py"
    path.write_text(
        textwrap.dedent("""\
        from ablate import RunConfig, grid, variant
        base = RunConfig()
        runs = grid(base, {"optim.lr": [0.01, 0.1], "train.global_batch": [16, 32]}) + \\
            [variant(base, "mha"), variant(base, "mqa", {"model.n_kv_heads": 1})]
    """)
    )

    def names(only):
        return [r.name for r in load_experiment(path, only=only)]

    assert names("lr=0.01*") == ["lr=0.01,global_batch=16", "lr=0.01,global_batch=32"]
    assert names("lr=0.01,global_batch=16") == ["lr=0.01,global_batch=16"]
    assert names("*global_batch=32") == ["lr=0.01,global_batch=32", "lr=0.1,global_batch=32"]
    assert names("mha,mqa") == names(["mha", "mqa"]) == names(["mha,mqa"]) == ["mha", "mqa"]
    assert names("lr=0.1,global_batch=16,mqa,lr=0.01,global_batch=32") == [
        "lr=0.01,global_batch=32",
        "lr=0.1,global_batch=16",
        "mqa",
    ]  # file order
    assert names(["lr=0.1,global_batch=16", "m?a"]) == ["lr=0.1,global_batch=16", "mha", "mqa"]
    message = load_error(path, only="lr=0.01,global_batch=16,nope")
    assert message.startswith("--only nope: no such variant (name or glob) in ") and "'mqa']" in message
    stderr = cli_error(tmp_path, str(path), "--only", "lr=0.01,global_batch=16,gqa")
    assert "--only gqa: no such variant (name or glob)" in stderr


# ---------------------------------------------------------------------------------------------------------------
# progress


def test_a_first_prepare_prints_each_phase_and_a_second_uses_the_cache(tmp_path, capsys):
    cfg = DataConfig(
        source=write_file(tmp_path / "a.jsonl", make_docs(4000)), seq_len=32, cache_dir=str(tmp_path / "cache")
    )
    prepared = prepare_data(cfg, VOCAB)
    lines = capsys.readouterr().err.splitlines()
    phases = [line for line in lines if line.startswith("data: ")]
    expected = [
        "data: reading and hashing sources ...",
        "data: read and hashed 4,000 documents (",
        f"data: training a byte-level BPE tokenizer (vocab {VOCAB}) on ",
        "data: tokenizer trained in ",
        "data: tokenizing train (3,920 documents) ...",
        "data: tokenizing train: 1,000/3,920 documents (26%)",
        "data: tokenizing train: 2,000/3,920",
        "data: tokenizing train: 3,000/3,920",
        "data: tokenized train: 3,920 documents, ",
        "data: tokenizing val (80 documents) ...",
        "data: tokenized val: 80 documents, ",
        f"data: cache ready at {prepared.cache_dir} (train ",
    ]
    assert len(phases) == len(expected) and all(p.startswith(e) for p, e in zip(phases, expected)), phases
    assert phases[-1].endswith(" tokens)") and ", val " in phases[-1]
    prepare_data(cfg, VOCAB)
    phases = [line for line in capsys.readouterr().err.splitlines() if line.startswith("data: ")]
    assert phases[-1].startswith(f"data: using cached tokens at {prepared.cache_dir} (train ")
    assert not any("tokeniz" in p for p in phases)


@pytest.mark.slow
def test_progress_lines_show_on_the_command_line(tmp_path):
    source = write_jsonl(tmp_path / "a.jsonl", make_docs(300))
    result = run_cli(
        "run", experiment(tmp_path, f"source={source!r}, seq_len=16"), "--out", str(tmp_path / "runs"), check=False
    )
    assert result.returncode == 0, result.stderr
    assert "data: reading and hashing sources ..." in result.stderr and "data: cache ready at " in result.stderr
    assert os.path.isdir(tmp_path / "runs" / "exp" / "a" / "seed0")
