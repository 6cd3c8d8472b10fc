"""Load a trained model for inference (eval, export) from a run folder or one of its checkpoints.

No process group is needed: DCP reads a checkpoint written by any number of ranks into one plain model. Readers
never modify a run folder: a damaged checkpoint is skipped with a warning (training sets it aside), and nothing
in a checkpoint is unpickled except plain data and DCP's metadata classes (see checkpoint_files.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from collections.abc import Callable

import torch

from ablate import checkpoint_files, rundir
from ablate.checkpoint_files import CheckpointError, DamagedCheckpointError
from ablate.config import RunConfig
from ablate.model import Transformer


@dataclass
class LoadedModel:
    model: Transformer  # eval mode, on `device`
    run: RunConfig
    run_dir: Path
    checkpoint: Path
    step: int
    tokens: int
    tokenizer_path: Path  # the tokenizer.json the run trained with

    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))


T = TypeVar("T")


def _locate(path: Path) -> tuple[Path, list[Path], bool]:
    """(run folder, its checkpoints to try newest first, whether `path` named one checkpoint)."""
    if rundir.STEP_NAME.fullmatch(path.name) and path.parent.name == rundir.CHECKPOINTS and path.is_dir():
        return path.parent.parent, [path], True
    if (path / rundir.CONFIG).is_file():
        found = checkpoint_files.list_checkpoints(rundir.checkpoint_root(path))[::-1]
        if not found:
            raise FileNotFoundError(f"{path}: a run folder with no complete checkpoint under {rundir.CHECKPOINTS}/")
        return path, found, False
    raise FileNotFoundError(
        f"{path}: neither a run folder (with {rundir.CONFIG}) nor a "
        f"{rundir.CHECKPOINTS}/{rundir.step_dir_name('N')} folder"
    )


def _use_newest_loadable(path: str | Path, use: Callable[..., T]) -> T:
    """use(run folder, checkpoint, its meta.json, its DCP metadata) on the newest checkpoint of `path` that is
    intact and loads. A named checkpoint must be; a run folder's damaged ones are skipped with a warning, never set
    aside (training's checkpoint.restore_newest_intact does that)."""
    run_dir, candidates, named = _locate(Path(path))
    damaged = []
    for ckpt in candidates:
        try:
            return use(run_dir, ckpt, *checkpoint_files.verify_checkpoint(ckpt))
        except DamagedCheckpointError as exc:
            if named:
                raise
            damaged.append(exc)
            print(
                f"ablate: warning: checkpoint {ckpt} is damaged ({exc.reason}): skipped, trying an older one",
                file=sys.stderr,
                flush=True,
            )
    listing = ", ".join(f"{exc.path.name} ({exc.reason})" for exc in damaged)
    raise CheckpointError(f"{run_dir}: every checkpoint is damaged ({listing})")


def read_run_config(path: str | Path) -> RunConfig:
    """The RunConfig of a run folder or of one of its checkpoints."""
    run_dir, _, _ = _locate(Path(path))
    return _config_of(run_dir)


def _config_of(run_dir: Path) -> RunConfig:
    return RunConfig.from_dict(json.loads((run_dir / rundir.CONFIG).read_text())["config"])


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """The model of a run folder's newest intact checkpoint, or of a named checkpoints/step_N."""
    return _use_newest_loadable(path, lambda *found: _load(*found, device=device))


def _load(run_dir: Path, ckpt: Path, meta: dict, metadata, device: str | torch.device) -> LoadedModel:
    run = _config_of(run_dir)
    model = Transformer(run.model, max_seq_len=run.data.seq_len)
    state = {"model": model.state_dict()}
    checkpoint_files.dcp_load(state, ckpt, metadata)
    model.load_state_dict(state["model"])
    model.reset_buffers()
    model.to(device).eval()
    return LoadedModel(
        model=model,
        run=run,
        run_dir=run_dir,
        checkpoint=ckpt,
        step=meta["step"],
        tokens=meta["tokens"],
        tokenizer_path=run_dir / rundir.TOKENIZER,
    )
