"""Load a trained model for inference (eval, export) from a run folder or one of its checkpoints.

No process group is needed: DCP reads a checkpoint written by any number of ranks into one plain model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from ablate.checkpoint import META, latest_checkpoint
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


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path]:
    """(run folder, checkpoint folder) from a run folder (its newest checkpoint) or a checkpoints/step_N folder."""
    path = Path(path)
    if (path / META).is_file() and path.parent.name == "checkpoints":
        return path.parent.parent, path
    if (path / "config.json").is_file():
        ckpt = latest_checkpoint(path / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"{path}: a run folder with no complete checkpoint under checkpoints/")
        return path, ckpt
    raise FileNotFoundError(f"{path}: neither a run folder (with config.json) nor a checkpoints/step_N folder")


def read_run_config(path: str | Path) -> RunConfig:
    """The RunConfig of a run folder or of one of its checkpoints."""
    run_dir, _ = resolve_checkpoint(path)
    return _config_of(run_dir)


def _config_of(run_dir: Path) -> RunConfig:
    return RunConfig.from_dict(json.loads((run_dir / "config.json").read_text())["config"])


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    run_dir, ckpt = resolve_checkpoint(path)
    run = _config_of(run_dir)
    meta = json.loads((ckpt / META).read_text())
    model = Transformer(run.model, max_seq_len=run.data.seq_len)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt))
    model.load_state_dict(state["model"])
    model.reset_buffers()
    model.to(device).eval()
    return LoadedModel(model=model, run=run, run_dir=run_dir, checkpoint=ckpt, step=meta["step"],
                       tokens=meta["tokens"], tokenizer_path=run_dir / "tokenizer.json")
