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
    "register_optimizer",
    "register_component",
    "register_task",
    "options_for",
]
__version__ = "0.1.0"


def train(run: RunConfig, out_root: str = "runs", callbacks: list = ()) -> dict:
    """Train one run into out_root/<experiment>/<variant>/seed<k>/ and return its summary (see ablate.training.run);
    `callbacks`: your own ablate.training.callbacks.Callback instances, added to the standard ones (all run by
    `order`)."""
    from ablate.training.run import train as _train

    return _train(run, out_root, callbacks)


def register_optimizer(name: str):
    """Class decorator: an optimizer as optim.name=`name`, built as `Cls(param_groups, optim_config)` and declaring
    its memory as the shipped ones do (static `state_elements(shapes, world)` and `transient_elements(shapes,
    world)`: ablate.optim.state). Registering the same class again does nothing; another under a taken name is
    refused, naming both files."""
    from ablate.optim.registry import register

    return register(name)


def register_component(kind: str, name: str):
    """Class decorator: a model component as model.`kind`=`name`. kind "ffn": `cls(config, layer_index)`, an
    nn.Module mapping x (B, S, d_model) to the same shape; "norm": `cls(config, dim)`, with reset_parameters();
    "score_mod": `cls(config)`, called as FlexAttention's score_mod(score, b, h, q_idx, kv_idx) -> score. A class's
    typed options are its dataclass `Options`, set through model.options and read with `options_for`."""
    from ablate.components import registry

    if kind not in ("ffn", "norm", "score_mod"):
        raise registry.RegistryError(
            f"register_component: kind {kind!r}; allowed: 'ffn', 'norm', 'score_mod' (an optimizer: register_optimizer)"
        )

    def add(cls):
        registry.register(kind, name, cls)
        return cls

    return add


def register_task(name: str, path: str, *, context: str, choices: str, answer: str, **options):
    """A cloze task from a local file (JSONL, JSON, or a format `datasets` reads: csv, parquet) as eval.tasks /
    --tasks `name`: `context`, `choices` and `answer` name the fields holding the prompt, the list of choices and
    the right one (its index or its text). Optional: primary (metric, default "acc_per_char"), template (default
    "Question: {context}\nAnswer:"), description. Every row is checked here, before any compute."""
    from ablate.eval.file_task import register_task as _register_task

    return _register_task(name, path, context=context, choices=choices, answer=answer, **options)


def options_for(config: ModelConfig, cls):
    """`cls.Options` (a component's dataclass of typed options) filled from config.options."""
    from ablate.components.registry import options_for as _options_for

    return _options_for(config, cls)


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
