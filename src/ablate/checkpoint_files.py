"""A checkpoint's files, as training and eval both read them: the errors, DCP's metadata and entries read without
running code, the integrity check, and the step_N folders listed. Writing and resuming are training's
(ablate.training.checkpoint); the folder names (step_N, .tmp_step_N, damaged_step_N) are rundir's.

Reading a checkpoint never runs code from it: DCP unpickles `.metadata` with plain `pickle`, so it is read here
through an unpickler that allows only DCP's metadata classes, and non-tensor entries load with
`torch.load(weights_only=True)`. A checkpoint damaged later (a truncated shard, a lost file) is found by a cheap
check (`check_checkpoint`), which reads no tensor.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes places with
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ablate import rundir
from ablate.config import ConfigError

META = rundir.CKPT_META
DCP_METADATA = ".metadata"
META_KEYS = ("step", "world", "tokens", "sampler")


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used; the message names it and why. A ValueError/ConfigError, so the command
    line reports it in one line (exit code 2)."""


class DamagedCheckpointError(CheckpointError):
    """A checkpoint damaged after it was written (missing or truncated files, unreadable JSON or pickle)."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(str(path), reason)  # both in args: the error crosses ranks pickled
        self.path, self.reason = Path(path), reason

    def __str__(self) -> str:
        return f"{self.path}: damaged checkpoint ({self.reason})"


# ---------------------------------------------------------------------------------------------------------------
# reading without running code

_DCP = "torch.distributed.checkpoint.metadata"
# Every global the .metadata of this project's checkpoints references (listed from real ones with pickletools):
# dataclasses and enums that only hold what they are given.
_ALLOWED_GLOBALS = frozenset(
    {
        (_DCP, "Metadata"),
        (_DCP, "MetadataIndex"),
        (_DCP, "StorageMeta"),
        (_DCP, "TensorStorageMetadata"),
        (_DCP, "BytesStorageMetadata"),
        (_DCP, "ChunkStorageMetadata"),
        (_DCP, "TensorProperties"),
        (_DCP, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # looks a name up among torch's layouts, nothing else
        ("pathlib", "PosixPath"),
        ("pathlib._local", "PosixPath"),  # StorageMeta.checkpoint_id (3.13 moved the class)
    }
)


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, path: Path):
        super().__init__(file, fix_imports=False)  # no Python 2 renames: the names checked are the names used
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS or _is_dtype(module, name):
            return super().find_class(module, name)
        raise CheckpointError(
            f"{self.path}: refused to unpickle {module}.{name}: checkpoint metadata may only hold "
            f"DCP metadata classes; this file may have been crafted"
        )


def read_metadata(ckpt: Path) -> Metadata:
    """A checkpoint's DCP metadata, unpickled with only DCP's metadata classes allowed. Raises CheckpointError for
    any other class, DamagedCheckpointError when the file is missing or unreadable."""
    path = Path(ckpt) / DCP_METADATA
    try:
        with path.open("rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except FileNotFoundError:
        raise DamagedCheckpointError(ckpt, f"{DCP_METADATA} is missing") from None
    except CheckpointError:
        raise
    except Exception as exc:  # a truncated or garbled pickle fails in many ways
        raise DamagedCheckpointError(ckpt, f"{DCP_METADATA} is unreadable: {_describe(exc)}") from None
    if not isinstance(metadata, Metadata):
        raise DamagedCheckpointError(ckpt, f"{DCP_METADATA} holds no DCP metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with `.metadata` read by the restricted unpickler (or handed over, already read)."""

    def __init__(self, path: str | Path, metadata: Metadata | None = None):
        super().__init__(path)
        self.metadata = metadata

    def read_metadata(self) -> Metadata:  # no **kwargs: DCP then never falls back to a per-rank pickle
        metadata = read_metadata(Path(self.path)) if self.metadata is None else self.metadata
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but non-tensor entries (optimizer hyperparameters) unpickle as plain data only."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as exc:  # DCP reports it per rank; dcp_load names the checkpoint
            raise pickle.UnpicklingError(f"entry {fqn} is not plain data ({_describe(exc)})") from None
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes places it
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


def dcp_load(state: dict, ckpt: Path, metadata: Metadata | None = None) -> None:
    """dcp.load that runs no code from the checkpoint; its failures become one DamagedCheckpointError."""
    metadata = read_metadata(ckpt) if metadata is None else metadata
    try:
        with warnings.catch_warnings():  # eval and export load without a process group, as DCP warns it assumes
            warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
            dcp.load(state, storage_reader=SafeFileSystemReader(ckpt, metadata), planner=SafeLoadPlanner())
    except CheckpointException as exc:  # DCP gathers each rank's error: name the first one
        first = next(iter(exc.failures.values()))[0]
        raise DamagedCheckpointError(ckpt, f"loading failed: {_describe(first)}") from None


# torch.load's advice around the cause of a refused or garbled pickle
_TORCH_BOILERPLATE = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _describe(exc: BaseException) -> str:
    """One line: the exception's type and the first line of its message that says what went wrong."""
    lines = [line.strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line and not line.startswith(_TORCH_BOILERPLATE)]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


# ---------------------------------------------------------------------------------------------------------------
# integrity


def read_meta(ckpt: Path) -> dict:
    """meta.json (step, world, tokens, sampler, ...), or DamagedCheckpointError."""
    try:
        meta = json.loads((Path(ckpt) / META).read_text())
    except FileNotFoundError:
        raise DamagedCheckpointError(ckpt, f"{META} is missing") from None
    except (OSError, ValueError) as exc:
        raise DamagedCheckpointError(ckpt, f"{META} is unreadable: {_describe(exc)}") from None
    missing = [k for k in META_KEYS if k not in meta] if isinstance(meta, dict) else list(META_KEYS)
    if missing:
        raise DamagedCheckpointError(ckpt, f"{META} lacks {', '.join(missing)}")
    return meta


def _check_storage(ckpt: Path, metadata: Metadata) -> None:
    """Every file the metadata points into exists and is long enough for every entry in it."""
    index = metadata.storage_data
    if not isinstance(index, dict) or not index:
        raise DamagedCheckpointError(ckpt, f"{DCP_METADATA} lists no storage")
    needed: dict[str, int] = {}
    for info in index.values():
        if not (
            isinstance(info, _StorageInfo)
            and isinstance(info.relative_path, str)
            and isinstance(info.offset, int)
            and isinstance(info.length, int)
        ):
            raise DamagedCheckpointError(ckpt, f"{DCP_METADATA} holds a malformed storage entry")
        rel = Path(info.relative_path)
        if rel.is_absolute() or ".." in rel.parts:  # DCP writes plain file names; reading elsewhere is no accident
            raise CheckpointError(
                f"{ckpt / DCP_METADATA}: storage path {info.relative_path!r} leaves the checkpoint "
                f"folder; this file may have been crafted"
            )
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        file = ckpt / name
        if not file.is_file():
            raise DamagedCheckpointError(ckpt, f"{name} is missing")
        size = file.stat().st_size
        if size < end:
            raise DamagedCheckpointError(ckpt, f"{name} is truncated: {size} bytes, {end} expected")


def verify_checkpoint(ckpt: Path) -> tuple[dict, Metadata]:
    """(meta.json, DCP metadata) of a checkpoint that passes the integrity check, else DamagedCheckpointError;
    CheckpointError for a file that looks crafted."""
    meta = read_meta(ckpt)
    metadata = read_metadata(ckpt)
    _check_storage(Path(ckpt), metadata)
    return meta, metadata


def check_checkpoint(path: Path) -> str | None:
    """A cheap integrity check (no tensor is read): None when intact, else why not. Raises CheckpointError for a
    file that looks crafted (that is no accident to step around)."""
    try:
        verify_checkpoint(Path(path))
    except DamagedCheckpointError as exc:
        return exc.reason
    return None


# ---------------------------------------------------------------------------------------------------------------
# listing


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """The step_N folders (complete when written; see check_checkpoint for damage since), oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir() if rundir.step_of(p.name) is not None and p.is_dir()]
    return sorted(found, key=lambda p: rundir.step_of(p.name))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None
