"""Checkpoints with torch.distributed.checkpoint (DCP), as training writes and resumes them: model, optimizer,
data-loader state, RNG, step.

A checkpoint is written to `checkpoints/.tmp_step_N/` and renamed to `step_N/` once every rank has finished, so a
run killed mid-write leaves only a .tmp folder, which is ignored and cleaned. DCP reshards on load: a 2-rank
checkpoint loads into 1 rank. Reading one (without running code from it) and its integrity check are
ablate.checkpoint_files', shared with eval; a checkpoint damaged after it was written is set aside here, on resume,
as `damaged_step_N/` (with REASON.txt), and the run continues from the newest intact one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import warnings
from pathlib import Path
from collections.abc import Callable

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ablate import rundir
from ablate.checkpoint_files import (
    META,
    CheckpointError,
    DamagedCheckpointError,
    check_checkpoint,
    dcp_load,
    list_checkpoints,
    verify_checkpoint,
)
from ablate.training.parallel import Dist


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
    with warnings.catch_warnings():  # world size 1 has no process group, as DCP warns it assumes
        warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable or uninitialized")
        dcp.save(state, checkpoint_id=str(tmp), no_dist=d.world == 1)
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
