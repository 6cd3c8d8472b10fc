"""Every run's callbacks, set from its config (standard_callbacks), and the user's added to them (run_callbacks)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from ablate.config import ConfigError, RunConfig
from ablate.training.callbacks.base import Callback
from ablate.training.callbacks.checkpointing import Checkpointer
from ablate.training.callbacks.experts import ExpertBalance
from ablate.training.callbacks.metrics import TrainMetrics
from ablate.training.callbacks.nonfinite import NonFiniteGuard
from ablate.training.callbacks.stability import LossSpikes, StabilityMonitors
from ablate.training.callbacks.validation import Validation


def standard_callbacks(run: RunConfig) -> list[Callback]:
    """Every run's callbacks, set from its config, in their order; the eval suite for runs that name tasks."""
    t, e = run.train, run.eval
    found: list[Callback] = [
        NonFiniteGuard(),
        LossSpikes(t.spike_threshold, t.spike_window, t.spike_policy),
        StabilityMonitors(t.monitor_every or t.log_every, t.micro_batch, run.data.doc_mask),
        Validation(t.val_every, run.data.val_sequences, t.micro_batch),
        TrainMetrics(t.log_every),
        Checkpointer(t.ckpt_every, t.keep_checkpoints, t.keep_steps),
    ]
    if run.model.ffn == "moe":
        found.append(ExpertBalance(t.log_every, update_bias=run.model.moe_balance == "bias"))
    if e.tasks.strip():  # lazily: runs without tasks never load the suite
        from ablate.training.callbacks.evals import EvalSuite

        found.append(EvalSuite(e.tasks, e.format, e.limit, e.batch_size, e.every, e.every_tokens, e.metrics))
    return sorted(found, key=lambda c: c.order)


def run_callbacks(run: RunConfig, extra: Sequence[Callback] = ()) -> list[Callback]:
    """The standard callbacks, then a fresh copy of each of `extra` (the user's: state never passes from one run to
    the next), each named apart (a name keys its state in checkpoints). Raises ConfigError naming the culprit."""
    if not isinstance(extra, (list, tuple)):
        raise ConfigError(f"callbacks: a {type(extra).__name__}; allowed: a list of ablate.training.callbacks.Callback")
    found = standard_callbacks(run)
    for i, callback in enumerate(extra):
        if not isinstance(callback, Callback):
            raise ConfigError(
                f"callbacks[{i}]: a {type(callback).__name__}; allowed: an instance of a subclass of "
                f"ablate.training.callbacks.Callback"
            )
        same = next((c for c in found if c.name == callback.name), None)
        if same is not None:
            raise ConfigError(
                f"callbacks[{i}]: {type(callback).__name__} is named {callback.name!r}, as is "
                f"{type(same).__name__}; allowed: a name no other callback of the run has (set `name` "
                f"on the class; taken: {', '.join(sorted(c.name for c in found))})"
            )
        try:
            found.append(copy.deepcopy(callback))
        except Exception as exc:
            raise ConfigError(
                f"callbacks[{i}]: {type(callback).__name__} cannot be copied for a run ({exc}); make "
                f"what does not copy (open files, locks) in pre_train instead of __init__"
            ) from None
    return found
