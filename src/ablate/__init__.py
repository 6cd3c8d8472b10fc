"""ablate: small pre-training ablations, trained with FSDP2 and compared honestly.

The public API is what an experiment file imports from here.
"""

from ablate.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrainConfig,
)
from ablate.setup.variants import branch, compute_points, grid, variant

__all__ = [
    "RunConfig",
    "ModelConfig",
    "DataConfig",
    "OptimConfig",
    "ScheduleConfig",
    "TrainConfig",
    "EvalConfig",
    "variant",
    "grid",
    "branch",
    "compute_points",
    "ConfigError",
    "train",
    "Callback",
    "Verdict",
    "whole",
    "DecisionRule",
]
__version__ = "0.1.0"


def train(run: RunConfig, out_root: str = "runs", callbacks: list = ()) -> dict:
    """Train one run into out_root/<experiment>/<variant>/seed<k>/ and return its summary (see ablate.training.run);
    `callbacks`: your own ablate.training.callbacks.Callback instances, added to the standard ones (all run by
    `order`)."""
    from ablate.training.run import train as _train

    return _train(run, out_root, callbacks)


def __getattr__(name: str):
    """Callback, Verdict and whole (ablate.training.callbacks), DecisionRule (ablate.report.sections.sequential.rule)
    on first use: importing ablate stays free of torch and quick."""
    if name in ("Callback", "Verdict", "whole"):
        from ablate.training import callbacks

        return getattr(callbacks, name)
    if name == "DecisionRule":
        from ablate.report.sections.sequential.rule import DecisionRule

        return DecisionRule
    raise AttributeError(f"module 'ablate' has no attribute {name!r}")
