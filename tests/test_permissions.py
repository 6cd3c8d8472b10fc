"""Files written by temporary file and rename follow the umask as open() and mkdir do (a whole run under umask 022:
tests/test_names.py)."""

import os
import stat

import pytest

from ablate import rundir


@pytest.fixture(params=[0o022, 0o027, 0o002, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_renamed_files_and_folders_follow_the_umask(tmp_path, umask):
    rundir.write_json_atomic(tmp_path / "run" / rundir.CONFIG, {"a": 1})  # config.json, summary.json, status.json
    rundir.write_items(tmp_path / "run", 4, "arc_easy_cf", [{"id": 1}])  # item files
    lock = rundir.RunLock(tmp_path / "run")
    assert lock.acquire()
    lock.release()
    folder = rundir.new_temp_folder(tmp_path, ".building-")  # the data cache, renamed into place
    assert mode(tmp_path / "run" / rundir.CONFIG) == 0o666 & ~umask
    assert mode(rundir.items_path(tmp_path / "run", 4, "arc_easy_cf")) == 0o666 & ~umask
    assert mode(lock.path) == 0o666 & ~umask
    assert mode(folder) == 0o777 & ~umask and folder.name.startswith(".building-") and not any(folder.iterdir())
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [rundir.LOCK, rundir.CONFIG, rundir.EVAL_ITEMS]


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    (tmp_path / rundir.SUMMARY).mkdir()  # the rename onto it fails once the temporary file is written
    with pytest.raises(OSError):
        rundir.write_json_atomic(tmp_path / rundir.SUMMARY, {"x": 1})
    assert [p.name for p in tmp_path.iterdir()] == [rundir.SUMMARY]
