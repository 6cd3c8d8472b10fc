"""The run folder: its layout, the only writer, its state, and files that a kill never leaves half written.

Every name inside a run folder is spelled here and nowhere else (training, eval, export, load, status and report
use these): config.json, summary.json, status.json, metrics.jsonl, evals.jsonl, tokenizer.json, error.txt, tb/,
logs/, eval_items/step_<NNNNNNN>/<name>.jsonl, and checkpoints/step_<N>/ with its meta.json (written as
.tmp_step_<N>/ and renamed; a damaged one is set aside as damaged_step_<N>/ with REASON.txt).

runs/<experiment>/<variant>/seed<k>/ is written by one process at a time (an OS lock, `.lock`, held for the run's
life; the kernel frees it when the holder dies, so a dead holder's lock is simply taken over). JSON files are
written to a temporary file and renamed; JSONL files get one flushed line at a time, and a line torn by a kill is
dropped on resume with a warning. `status.json` says where the run stands: running, finished, failed, diverged or
interrupted (with the message, the step and the log). This module imports neither torch nor the trainer, so
`ablate status` and `ablate report` read run folders quickly.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ablate.text import natural_key

CONFIG, SUMMARY, STATUS, METRICS, EVALS = "config.json", "summary.json", "status.json", "metrics.jsonl", "evals.jsonl"
LOCK, ERROR, LOGS, CHECKPOINTS = ".lock", "error.txt", "logs", "checkpoints"
TOKENIZER, TENSORBOARD, EVAL_ITEMS = "tokenizer.json", "tb", "eval_items"
SEED_PREFIX = "seed"  # runs/<experiment>/<variant>/seed<k>/
STUDY = "study.json"  # runs/<experiment>/study.json: an adaptive study's rule and rounds (a file, never a variant)
# inside checkpoints/: step_N/ (complete once it holds meta.json), .tmp_step_N/ while written, damaged_step_N[_k]/
CKPT_META, CKPT_REASON = "meta.json", "REASON.txt"
STEP_PREFIX, TMP_PREFIX, DAMAGED_PREFIX = "step_", ".tmp_", "damaged_"
STEP_NAME = re.compile(rf"{STEP_PREFIX}(\d+)")  # a checkpoint folder's name, matched whole
TMP_GLOB = TMP_PREFIX + STEP_PREFIX + "*"  # every half-written checkpoint
STATES = ("pending", "running", "finished", "failed", "diverged", "interrupted")


class RunFolderError(ValueError):
    """A run folder file that cannot be read; the message names the file."""


def run_dir_for(out_root: str | Path, run) -> Path:
    return Path(out_root) / run.experiment / run.name / f"{SEED_PREFIX}{run.train.seed}"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def step_dir_name(step: int) -> str:
    """A checkpoint's folder name under checkpoints/: step_N."""
    return f"{STEP_PREFIX}{step}"


def tmp_dir_name(step: int) -> str:
    """The folder a checkpoint is written to before the rename: .tmp_step_N."""
    return TMP_PREFIX + step_dir_name(step)


def damaged_dir_name(name: str, n: int = 0) -> str:
    """Where a damaged checkpoint `name` (step_N) is set aside: damaged_step_N, else damaged_step_N_<n>."""
    return f"{DAMAGED_PREFIX}{name}" + (f"_{n}" if n else "")


def damaged_file_name(name: str, n: int = 0) -> str:
    """Where a damaged file `name` is set aside: <name>.damaged, else <name>.damaged.<n>."""
    return f"{name}.damaged" + (f".{n}" if n else "")


def step_of(name: str) -> int | None:
    """step_N -> N; None for any other name."""
    match = STEP_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def sibling_run_dir(run_dir: str | Path, variant: str) -> Path:
    """The run folder of another variant of the same experiment and seed (a branch's parent)."""
    run_dir = Path(run_dir)
    return run_dir.parent.parent / variant / run_dir.name


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Steps of the complete checkpoints (checkpoints/step_N/ with its meta.json), oldest first."""
    root = checkpoint_root(run_dir)
    found = [STEP_NAME.fullmatch(p.name) for p in root.iterdir() if (p / CKPT_META).is_file()] if root.is_dir() else []
    return sorted(int(m.group(1)) for m in found if m)


def find_run_dirs(root: Path) -> list[Path]:
    """Folders holding a config.json or status.json (a walk that tolerates files vanishing under it)."""
    found = set()
    for folder, subfolders, files in os.walk(root, onerror=lambda error: None):
        subfolders[:] = [d for d in subfolders if d != CHECKPOINTS]
        if CONFIG in files or STATUS in files:
            found.add(Path(folder))
    return sorted(found, key=lambda p: natural_key(str(p.relative_to(root))))


def items_path(run_dir: str | Path, step: int, name: str) -> Path:
    """Where the per-item results of one evaluation live: eval_items/step_<NNNNNNN>/<name>.jsonl."""
    return Path(run_dir) / EVAL_ITEMS / f"{STEP_PREFIX}{step:07d}" / f"{name}.jsonl"


def warn(message: str) -> None:
    print(f"ablate: warning: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# files


# Temporary files and folders are made as open() and mkdir make them (0o666 / 0o777 less the umask, and a folder's
# default ACL), not as mkstemp and mkdtemp do (0o600 / 0o700): what is renamed from them (a run's config.json and
# summary.json, a data cache folder) must stay readable by teammates on a shared file system.


def _new_file_beside(path: Path) -> tuple[int, Path]:
    """A new temporary file beside `path`, open for writing."""
    while True:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:  # another writer drew the same name: draw again
            continue


def new_temp_folder(parent: str | Path, prefix: str) -> Path:
    """A new, empty folder parent/<prefix><random> (for content renamed into place once complete)."""
    while True:
        folder = Path(parent) / f"{prefix}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def _replace(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename: readers see the old file or the new, never
    half of one (a kill leaves at most a stray .tmp file)."""
    fd, tmp = _new_file_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, json.dumps(obj, indent=1))


def finished_summary(run_dir: Path, identity: str) -> dict | None:
    """The summary of the finished run of config `identity` in `run_dir`, read without writing anything there;
    None when it is not finished, holds another config, or a file is damaged (train() deals with those)."""
    if not (run_dir / SUMMARY).is_file():
        return None
    try:
        if read_json(run_dir / CONFIG).get("identity") != identity:
            return None
        return read_json(run_dir / SUMMARY)
    except RunFolderError:
        return None


def read_json(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunFolderError(
            f"{path}: not valid JSON ({exc}); the file is damaged: restore it or remove the run folder"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path}: cannot be read ({exc})") from None


def set_aside(path: Path, aside_name: Callable[[str, int], str] = damaged_file_name) -> Path:
    """Rename a damaged file or folder to the first free aside_name(name, n) for n = 0, 1, ... (by default
    <name>.damaged[.N]), kept for a look rather than deleted; returns where it went."""
    n = 0
    while (target := path.with_name(aside_name(path.name, n))).exists():
        n += 1
    path.rename(target)
    return target


def read_jsonl(path: str | Path, repair: bool = False) -> list[dict]:
    """The lines of a JSONL file. A torn last line (a kill mid-write) is dropped with a warning, and with
    `repair` cut from the file so appends go on cleanly; a bad line elsewhere is an error naming file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(errors="replace").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if any(rest.strip() for rest in lines[number:]):
                raise RunFolderError(f"{path}:{number}: not valid JSON; the file is damaged") from None
            warn(f"{path}:{number}: dropped a torn last line (the run was killed while writing it)")
            if repair:
                rewrite_jsonl(path, rows)
    return rows


def rewrite_jsonl(path: Path, rows: list[dict]) -> None:
    """Replace a JSONL file atomically (used on resume to keep only what the checkpoint had seen)."""
    _replace(Path(path), "".join(json.dumps(row) + "\n" for row in rows))


def write_items(run_dir: str | Path, step: int, name: str, rows: list[dict]) -> Path:
    """Per-item results of one evaluation, one JSON line per item, at items_path()."""
    path = items_path(run_dir, step, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    rewrite_jsonl(path, rows)  # whole or not at all: the report pairs items across runs
    return path


# ---------------------------------------------------------------------------------------------------------------
# the one writer


def _holder_text() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}


class RunLock:
    """An exclusive fcntl lock on <run_dir>/.lock, held while a process trains the run. The file names the holder
    (host, pid) for the messages of processes that find it taken."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask, as any file
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(_holder_text()).encode())
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing frees the lock
            self.fd = None

    def holder(self) -> str:
        try:
            info = json.loads(self.path.read_text())
            return f"pid {info['pid']} on {info['host']} (since {info['since']})"
        except (OSError, ValueError, KeyError):
            return "another process"

    def held_by_live_process(self) -> bool:
        """True when a live process holds the lock (for `ablate status`, which never takes it)."""
        if not self.path.is_file():
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also drops the shared lock if it was taken


class RunLocked(RuntimeError):
    """Another live process trains this run."""


class RunDiverged(RuntimeError):
    """The run's loss went non-finite for good; a final state, recorded in status.json."""


# ---------------------------------------------------------------------------------------------------------------
# status


def read_status(run_dir: str | Path) -> dict | None:
    path = Path(run_dir) / STATUS
    if not path.is_file():
        return None
    try:
        return read_json(path)
    except RunFolderError as exc:  # a status file is advice: a damaged one never blocks a run
        warn(str(exc))
        return None


def write_status(run_dir: str | Path, state: str, **fields) -> dict:
    """Record the run's state; the previous states stay in `history` (a retry never hides a failure)."""
    assert state in STATES, state
    old = read_status(run_dir) or {}
    history = old.get("history", [])
    if old.get("state") and old.get("state") != "running" and old.get("state") != state:
        history = history + [{k: old.get(k) for k in ("state", "step", "message", "updated")}]
    status = {
        **{k: v for k, v in old.items() if k in ("log", "max_steps")},
        "state": state,
        **fields,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "updated": time.time(),
        "history": history[-20:],
    }
    write_json_atomic(Path(run_dir) / STATUS, status)
    return status


LOG_ENV = "ABLATE_LOG"
# K runs sharing a GPU (--runs-per-gpu K, a local launcher's tasks): each process's share of its GPU's memory, 1/K,
# set by the sweep or launcher that starts it, applied by parallel.init_distributed
GPU_SHARE_ENV = "ABLATE_GPU_MEMORY_FRACTION"


def log_path() -> str | None:
    """The console log of this worker process, when a sweep started it with one."""
    return os.environ.get(LOG_ENV)
