"""Checkpoints with torch.distributed.checkpoint (DCP): model, optimizer, data-loader state, RNG, step.

A checkpoint is written to `checkpoints/.tmp_step_N/` and renamed to `step_N/` once every rank has finished, so a
folder named step_N is always complete; a run killed mid-write leaves only a .tmp folder, which is ignored and
cleaned. Resume picks the newest step_N. DCP reshards on load: a 2-rank checkpoint loads into 1 rank.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, get_model_state_dict,
                                                     set_state_dict)

from ablate.parallel import Dist

META = "meta.json"


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = [p for p in ckpt_root.glob("step_*") if p.is_dir() and (p / META).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_checkpoint(ckpt_root: Path, step: int, model, optimizer, extra: dict, d: Dist, keep: int) -> Path:
    """Save everything needed to continue at `step`. `extra` (data-loader state, tokens...) is the same on all ranks."""
    final = ckpt_root / f"step_{step}"
    tmp = ckpt_root / f".tmp_step_{step}"
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
        for old in list_checkpoints(ckpt_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    d.barrier()
    return final


def load_checkpoint(path: Path, model, optimizer, d: Dist) -> dict:
    """Load model and optimizer state (resharding as needed); restore RNG when the world size matches.
    Returns the checkpoint's meta (step, data-loader state, ...)."""
    meta = json.loads((path / META).read_text())
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    same_world = meta["world"] == d.world
    if same_world:
        state[f"rng_rank{d.rank}"] = _rng_state()
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if same_world:
        rng = state[f"rng_rank{d.rank}"]
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return meta


def clean_partial(ckpt_root: Path, d: Dist) -> None:
    """Remove checkpoints a killed run left half-written."""
    if d.is_main and ckpt_root.is_dir():
        for tmp in ckpt_root.glob(".tmp_step_*"):
            shutil.rmtree(tmp, ignore_errors=True)
    d.barrier()


def full_model_state(model) -> dict:
    """The unsharded model state dict (on CPU, on rank 0), for export."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
