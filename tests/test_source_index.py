"""data.prepare's source index: files unchanged since they were hashed are not read and hashed again (each run of a
sweep paid ~1 s for it on the embedded corpus), and any write to them, or a write too close to the hashing to
trust the file's stat, makes the next run hash them again. CPU, seconds."""

import json
import os
import shutil
import time

import pytest
from test_data import VOCAB, make_docs, write_jsonl

from ablate.config import DataConfig
from ablate.data import prepare as data
from ablate.data.prepare import prepare_data


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    monkeypatch.setattr(data, "RACY_SECONDS", 0.2)  # a file's ctime cannot be set back: wait this long instead


def _aged(path):
    """A file last written (and changed: ctime) before the racy window, as a source made before the sweep is."""
    time.sleep(0.3)
    return path


def _config(path, tmp_path):
    return DataConfig(source=str(path), seq_len=16, cache_dir=str(tmp_path / "cache"))


def _index(tmp_path) -> dict:
    path = tmp_path / "cache" / "data" / data.SOURCE_INDEX
    return json.loads(path.read_text()) if path.exists() else {}


def test_unchanged_files_are_not_hashed_again(tmp_path, capsys):
    cfg = _config(_aged(write_jsonl(tmp_path / "a.jsonl", make_docs(200))), tmp_path)
    first = prepare_data(cfg, VOCAB)
    assert "read and hashed 200 documents" in capsys.readouterr().err
    assert list(_index(tmp_path).values()) == [os.path.basename(first.cache_dir)]
    second = prepare_data(cfg, VOCAB)
    err = capsys.readouterr().err
    assert "reading and hashing" not in err and "sources unchanged since hashed" in err
    assert second.cache_dir == first.cache_dir and second.stats["documents"] == first.stats["documents"]


def test_a_write_that_keeps_size_and_mtime_is_still_seen(tmp_path, capsys):
    path = _aged(write_jsonl(tmp_path / "a.jsonl", make_docs(200)))
    cfg = _config(path, tmp_path)
    prepare_data(cfg, VOCAB)
    before = data._source_signature(cfg, VOCAB)
    mtime, size = os.stat(path).st_mtime_ns, os.stat(path).st_size
    text = open(path).read()
    with open(path, "w") as f:  # one letter changed, the old mtime put back: only the ctime tells
        f.write(text.replace("Doc 7:", "Doc 8:", 1))
    os.utime(path, ns=(mtime, mtime))
    assert (os.stat(path).st_mtime_ns, os.stat(path).st_size) == (mtime, size)
    assert data._source_signature(cfg, VOCAB) != before
    capsys.readouterr()
    prepare_data(cfg, VOCAB)
    assert "read and hashed 200 documents" in capsys.readouterr().err


def test_more_documents_make_another_cache(tmp_path, capsys):
    path = _aged(write_jsonl(tmp_path / "a.jsonl", make_docs(200)))
    cfg = _config(path, tmp_path)
    first = prepare_data(cfg, VOCAB)
    _aged(write_jsonl(path, make_docs(250)))
    capsys.readouterr()
    second = prepare_data(cfg, VOCAB)
    assert "read and hashed 250 documents" in capsys.readouterr().err
    assert second.cache_dir != first.cache_dir and sum(second.stats["documents"].values()) == 250
    assert len(_index(tmp_path)) == 2


def test_a_file_written_just_before_hashing_is_not_indexed(tmp_path, capsys):
    cfg = _config(write_jsonl(tmp_path / "a.jsonl", make_docs(200)), tmp_path)  # written now: racy
    prepare_data(cfg, VOCAB)
    assert _index(tmp_path) == {}
    capsys.readouterr()
    prepare_data(cfg, VOCAB)
    assert "read and hashed 200 documents" in capsys.readouterr().err


def test_a_cache_folder_removed_is_rebuilt(tmp_path, capsys):
    cfg = _config(_aged(write_jsonl(tmp_path / "a.jsonl", make_docs(200))), tmp_path)
    first = prepare_data(cfg, VOCAB)
    shutil.rmtree(first.cache_dir)
    capsys.readouterr()
    again = prepare_data(cfg, VOCAB)
    assert "read and hashed 200 documents" in capsys.readouterr().err
    assert again.cache_dir == first.cache_dir and os.path.isdir(again.cache_dir)
