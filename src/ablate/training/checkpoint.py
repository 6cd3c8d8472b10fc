"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, data-loader state, RNG, step.

A checkpoint is written to `checkpoints/.tmp_step_N/` and renamed to `step_N/` once every rank has finished, so a
run killed mid-write leaves only a .tmp folder, which is ignored and cleaned. DCP reshards on load: a 2-rank
checkpoint loads into 1 rank.

Reading a checkpoint never runs code from it: DCP unpickles `.metadata` with plain `pickle`, so it is read here
through an unpickler that allows only DCP's metadata classes, and non-tensor entries load with
`torch.load(weights_only=True)`. A checkpoint damaged later (a truncated shard, a lost file) is found by a cheap
check; resume sets it aside as `damaged_step_N/` (with REASON.txt) and continues from the newest intact one.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import shutil
import sys
import warnings
from pathlib import Path
from collections.abc import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes places with
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    get_model_state_dict,
    set_state_dict,
)

from ablate import rundir
from ablate.config import ConfigError
from ablate.training.parallel import Dist

META = rundir.CKPT_META  # the folder names (step_N, .tmp_step_N, damaged_step_N) are rundir's
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
# save, load, resume


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """The step_N folders (complete when written; see check_checkpoint for damage since), oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.iterdir() if rundir.step_of(p.name) is not None and p.is_dir()]
    return sorted(found, key=lambda p: rundir.step_of(p.name))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def _rng_state() -> dict:
    """This process's generators: the CPU one, and CUDA's where CUDA is (so a checkpoint has a cuda entry only
    when it was written where CUDA was)."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _saved_rng_entries(metadata: Metadata, rank: int) -> set[str]:
    """The RNG entries (torch, cuda) a checkpoint holds for `rank`, from its own DCP metadata (DCP flattens
    `rng_rank0: {torch: ...}` to `rng_rank0.torch`), so a checkpoint written on another machine loads."""
    prefix = f"rng_rank{rank}."
    return {key.removeprefix(prefix) for key in metadata.state_dict_metadata if key.startswith(prefix)}


_told_unseeded: set[Path] = set()  # the checkpoints whose missing CUDA RNG state was told of (once each)


def _set_rng_state(rng: dict, ckpt: Path, d: Dist) -> None:
    """Restore the generators a checkpoint holds for this rank. A cuda entry where there is no CUDA is ignored;
    where CUDA is but the checkpoint was written without it, CUDA's generator is seeded from this rank's restored
    CPU state instead: the same stream each time this checkpoint is resumed, and different on every rank."""
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if not torch.cuda.is_available():
        return
    if "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"])
        return
    digest = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).digest()
    torch.cuda.manual_seed(int.from_bytes(digest[:8], "little"))
    if d.is_main and Path(ckpt) not in _told_unseeded:
        _told_unseeded.add(Path(ckpt))
        print(
            f"ablate: note: checkpoint {ckpt} was written without CUDA and holds no CUDA RNG state; the CUDA "
            f"generator of each rank is seeded from its restored CPU RNG state instead",
            file=sys.stderr,
            flush=True,
        )


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model,
    optimizer,
    extra: dict,
    d: Dist,
    keep: int,
    keep_steps: tuple[int, ...] | list[int] = (),
) -> Path:
    """Save everything needed to continue at `step`. `extra` (data-loader state, tokens...) is the same on all ranks.
    The `keep` newest are kept, and those at `keep_steps` (branch points) always."""
    final = ckpt_root / rundir.step_dir_name(step)
    tmp = ckpt_root / rundir.tmp_dir_name(step)
    if d.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    d.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, f"rng_rank{d.rank}": _rng_state()}
    dcp.save(state, checkpoint_id=str(tmp))
    d.barrier()
    if d.is_main:
        (tmp / META).write_text(json.dumps({"step": step, "world": d.world, **extra}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        rotating = [c for c in list_checkpoints(ckpt_root) if rundir.step_of(c.name) not in keep_steps]
        for old in rotating[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    d.barrier()
    return final


def load_checkpoint(path: Path, model, optimizer, d: Dist) -> dict:
    """Load model and optimizer state (resharding as needed); restore RNG when the world size matches.
    Returns the checkpoint's meta (step, data-loader state, ...). Raises DamagedCheckpointError (the same on every
    rank) for a damaged checkpoint, CheckpointError for a crafted one."""
    meta = metadata = failure = None
    try:
        meta, metadata = verify_checkpoint(path)
    except CheckpointError as exc:
        failure = exc
    failure = d.first_of(failure)  # every rank enters dcp.load, or none does
    if failure is not None:
        raise failure
    model_sd, optim_sd = get_state_dict(model, optimizer)
    # Only the optimizer's per-parameter state (moments, momentum, step) is read: its parameter groups and their
    # settings are this run's config (a branch may change the lr multipliers or weight decay), and checkpoints
    # written before the groups were per role (two groups: decay, no decay) load the same way.
    state = {"model": model_sd, "optim": {"state": optim_sd["state"]}}
    same_world = meta["world"] == d.world  # another world size: no rank's RNG is restored (ranks draw anew)
    rng_key = f"rng_rank{d.rank}"
    if same_world:  # only the entries both here and in the checkpoint: DCP fails on a key the checkpoint lacks
        saved = _saved_rng_entries(metadata, d.rank)
        wanted = {name: value for name, value in _rng_state().items() if name in saved}
        if wanted:
            state[rng_key] = wanted
    dcp_load(state, path, metadata)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict={"state": state["optim"]["state"], "param_groups": optim_sd["param_groups"]},
    )
    if same_world:
        _set_rng_state(state.get(rng_key, {}), path, d)
    return meta


def set_aside_checkpoint(ckpt: Path, reason: str) -> Path:
    """Rename a damaged checkpoint to damaged_step_N (which step_* globs skip), with REASON.txt inside."""
    target = rundir.set_aside(ckpt, rundir.damaged_dir_name)
    (target / rundir.CKPT_REASON).write_text(f"{ckpt}: {reason}\n")
    return target


def _newest_intact(ckpt_root: Path, aside: list) -> Path | None:
    """On rank 0: the newest checkpoint passing check_checkpoint; the damaged ones met are set aside."""
    for ckpt in reversed(list_checkpoints(ckpt_root)):
        reason = check_checkpoint(ckpt)
        if reason is None:
            return ckpt
        aside.append((ckpt, reason, set_aside_checkpoint(ckpt, reason)))
    return None


def restore_newest_intact(ckpt_root: Path, restore: Callable[[Path], object], d: Dist) -> Path | None:
    """Call `restore(checkpoint)` (on every rank) with the newest intact checkpoint and return it; None when there
    is none to resume from. Rank 0 chooses and sets damaged ones aside, also one whose load fails, and every rank
    follows its choice. Checkpoints that are all damaged raise CheckpointError: never a silent restart."""
    aside: list[tuple[Path, str, Path]] = []  # (checkpoint, reason, where it went)
    failed = None  # (checkpoint, reason) of a load that just failed
    while True:
        if d.is_main:
            try:
                if failed:
                    aside.append((*failed, set_aside_checkpoint(*failed)))
                decision = _newest_intact(ckpt_root, aside), aside
            except (CheckpointError, OSError) as exc:  # a crafted file: every rank stops, none waits for rank 0
                decision = exc, aside
        choice, aside = d.broadcast_object(decision if d.is_main else None)
        if isinstance(choice, Exception):
            raise choice
        if choice is None:
            break
        try:
            restore(choice)
        except DamagedCheckpointError as exc:  # the same on every rank (load_checkpoint agrees, DCP gathers)
            failed = choice, exc.reason
            continue
        if d.is_main:
            for ckpt, reason, target in aside:
                print(
                    f"ablate: warning: checkpoint {ckpt} is damaged ({reason}): set aside as {target}; resuming "
                    f"from {choice}",
                    file=sys.stderr,
                    flush=True,
                )
        return choice
    if aside:
        listing = ", ".join(f"{ckpt.name} ({reason})" for ckpt, reason, _ in aside)
        raise CheckpointError(
            f"{ckpt_root.parent}: every checkpoint is damaged ({listing}); set aside under "
            f"{rundir.CHECKPOINTS}/{rundir.damaged_dir_name(rundir.STEP_PREFIX)}*; remove the run "
            f"folder to start again from step 0"
        )
    return None


def clean_partial(ckpt_root: Path, d: Dist) -> None:
    """Remove checkpoints a killed run left half-written."""
    if d.is_main and ckpt_root.is_dir():
        for tmp in ckpt_root.glob(rundir.TMP_GLOB):
            shutil.rmtree(tmp, ignore_errors=True)
    d.barrier()


def full_model_state(model) -> dict:
    """The unsharded model state dict (on CPU, on rank 0), for export."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
