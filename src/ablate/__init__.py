"""ablate: small pre-training ablations, trained with FSDP2 and compared honestly.

The public API is what an experiment file imports from here.
"""
from ablate.config import (ConfigError, DataConfig, EvalConfig, ModelConfig, OptimConfig, RunConfig, ScheduleConfig,
                           TrainConfig, grid, variant)

__all__ = ["RunConfig", "ModelConfig", "DataConfig", "OptimConfig", "ScheduleConfig", "TrainConfig", "EvalConfig",
           "variant", "grid", "branch", "ConfigError", "train"]
__version__ = "0.1.0"


def branch(parent: RunConfig, at: float | int, name: str, changes: dict | None = None) -> RunConfig:
    """A run that continues `parent` from its checkpoint at `at` (share of its steps, or a step) with `changes`
    (see ablate.experiment.branch)."""
    from ablate.experiment import branch as _branch

    return _branch(parent, at, name, changes)


def train(run: RunConfig, out_root: str = "runs") -> dict:
    """Train one run into out_root/<experiment>/<variant>/seed<k>/ and return its summary (see ablate.train)."""
    from ablate.train import train as _train

    return _train(run, out_root)
