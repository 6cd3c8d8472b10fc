"""Training stability callbacks: loss-spike detection (LossSpikes) and the monitors that explain spikes
(StabilityMonitors).

LossSpikes scores each step's loss against the recent losses of updates that were taken: a robust z-score,
(loss - expected) / (1.4826 * MAD of the residuals) over the last train.spike_window of them, the expectation a
robust (Theil-Sen) line through the window, so neither a few earlier spikes nor a falling curve hide the next one.
Above train.spike_threshold, train.spike_policy decides its verdict: "log" records it and takes the update,
"skip" drops the step's update, "rollback" has the trainer restore the newest checkpoint and skip the batches read
since (as PaLM did), "stop" ends the run as diverged. The loss is averaged over ranks, so every rank gives the same
verdict. "log" (the default) decides nothing before the update, so it scores each step from step_values, a few
steps late and without a host wait; the other policies read each step's loss before its update.

StabilityMonitors logs what decides between QK-norm and z-loss (attention and output logits) and how far each
block's weights moved in one update, every train.monitor_every steps (0: every train.log_every).
"""

from __future__ import annotations

import math
import statistics

import torch

from ablate.data.tokenizer_stats import content_sha256
from ablate.model import stability_fields
from ablate.training.callbacks.base import TAKE, Callback, StepValues, TrainerView, Verdict, due

MAX_ROLLBACKS = 5  # a run that has rolled back this often ends as diverged rather than loop
MIN_LOSSES = 8  # with fewer recent losses the median and MAD say little: no detection
MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of normal noise


def robust_z(
    losses: list[float], loss: float, steps: list[int] | None = None, step: int | None = None
) -> tuple[float, float]:
    """(z, expected): how many robust standard deviations `loss` lies above what the window expects. Without
    `steps`, the expectation is the median of `losses`; with them, a robust line through (steps, losses) (the
    Theil-Sen slope: the median of pairwise slopes) taken at `step`, so a curve still falling fast does not widen
    the spread and hide a spike."""
    slope = 0.0
    if steps is not None:
        slopes = [
            (losses[j] - losses[i]) / (steps[j] - steps[i])
            for i in range(len(steps))
            for j in range(i + 1, len(steps))
            if steps[j] != steps[i]
        ]
        slope = statistics.median(slopes) if slopes else 0.0
    residuals = [x - slope * s for x, s in zip(losses, steps)] if steps is not None else list(losses)
    center = statistics.median(residuals)
    mad = statistics.median(abs(r - center) for r in residuals)
    expected = center + slope * (step if step is not None else 0)
    # losses without spread (all equal) would divide by zero: a tiny floor keeps z finite, and huge for any rise
    scale = max(MAD_TO_SIGMA * mad, 1e-12 * max(abs(expected), 1.0))
    return (loss - expected) / scale, expected


class LossSpikes(Callback):
    """Finds loss spikes and applies train.spike_policy (see the module's docstring).

    State (in every checkpoint, so a resumed run finds the same spikes): the window of [step, loss] of recent
    updates taken, and the spikes found so far ({step, loss, z, median, action}, summary.json "spikes"). A skipped
    spike never enters the window. After a rollback the window keeps its losses up to the restored step and drops
    those of the abandoned steps (it may then hold fewer than spike_window until it refills). "rollback" before the
    first checkpoint cannot roll back: the run then ends as diverged (Trainer.roll_back raises Divergence),
    and so does a run that has rolled back MAX_ROLLBACKS times (a "stop" verdict)."""

    name, order = "loss_spikes", 10  # after NonFiniteGuard, before every callback that logs the step

    def __init__(self, threshold: float, window: int, policy: str):
        """threshold: the z above which a loss is a spike; window: how many recent losses it is scored against;
        policy: log, skip, rollback or stop (train.spike_threshold, spike_window, spike_policy)."""
        self.threshold, self.size, self.policy = threshold, window, policy
        self.window: list[list] = []  # [step, loss], oldest first
        self.spikes: list[dict] = []
        self.pending: dict | None = None  # this step's spike, logged in post_step under the step's number

    def pre_train(self, trainer: TrainerView) -> None:
        # after a rollback: forget the abandoned steps' losses (after a resume there are none past trainer.step)
        self.window = [entry for entry in self.window if entry[0] <= trainer.step]
        self.pending = None

    def before_update(self, trainer: TrainerView) -> Verdict:
        if self.policy == "log":
            return TAKE  # nothing to decide before the update: scored from step_values, without a host wait
        # skip, rollback and stop decide this step's update: its loss is read now (the step waits for the device)
        step = trainer.step + 1  # trainer.step counts the steps already taken
        return self._score(trainer, step, trainer.last_loss, trainer.last_grad_norm)

    def step_values(self, trainer: TrainerView, values: StepValues) -> None:
        if self.policy == "log":
            self._score(trainer, values.step, values.loss, values.grad_norm, values)

    def _score(
        self, trainer: TrainerView, step: int, loss: float, grad_norm: float, values: StepValues | None = None
    ) -> Verdict:
        """Score one step's loss against the window; the policy's verdict (`values`: the step's figures, given
        when it is scored after the step)."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            return TAKE  # NonFiniteGuard's case; such a loss never enters the window
        if len(self.window) >= MIN_LOSSES:
            z, median = robust_z([x for _, x in self.window], loss, [s for s, _ in self.window], step)
            if z > self.threshold:
                spike = {"step": step, "loss": loss, "z": z, "median": median, "action": self.policy}
                return self._act(trainer, spike, values)
        self._remember(step, loss)
        return TAKE

    def _act(self, trainer: TrainerView, spike: dict, values: StepValues | None) -> Verdict:
        """Record a spike; the policy's verdict on this step's update."""
        self.spikes.append(spike)
        text = (
            f"step {spike['step']}: loss spike {spike['loss']:.4f}, z {spike['z']:.1f} above the median "
            f"{spike['median']:.4f} expected from the last {len(self.window)} losses"
        )
        if self.policy == "stop":
            return Verdict("stop", f"{text}; stopped (train.spike_policy=stop)")
        if self.policy == "rollback":
            if len(trainer.rollbacks) >= MAX_ROLLBACKS:  # data that keeps spiking, or a run that cannot go on
                return Verdict(
                    "stop",
                    f"{text}; already rolled back {len(trainer.rollbacks)} times, stopped (lower "
                    f"optim.lr, set model.qk_norm or model.z_loss)",
                )
            trainer.say(f"{text}; rolling back")
            return Verdict("rollback", f"loss spike at step {spike['step']} (z {spike['z']:.1f})")
        if self.policy == "skip":
            self.pending = spike  # logged in post_step, under the step's number
            trainer.say(f"{text}; update skipped")
            return Verdict("skip", f"loss spike at step {spike['step']}")
        trainer.say(f"{text}; update taken")
        trainer.log(spike_fields(spike), at=values)  # "log": scored after its step, logged as of it
        self._remember(spike["step"], spike["loss"])
        return TAKE

    def _remember(self, step: int, loss: float) -> None:
        self.window.append([step, loss])
        del self.window[: -self.size]

    def post_step(self, trainer: TrainerView) -> None:
        if self.pending is not None and self.pending["step"] == trainer.step:
            trainer.log(spike_fields(self.pending))
        self.pending = None

    def state_dict(self) -> dict:
        return {"window": self.window, "spikes": self.spikes}

    def load_state_dict(self, state: dict) -> None:
        self.window = [list(entry) for entry in state.get("window", [])]
        self.spikes = [dict(spike) for spike in state.get("spikes", [])]

    def summary(self, trainer: TrainerView) -> dict:
        return {"spikes": self.spikes}


def spike_fields(spike: dict) -> dict[str, float]:
    """A spike's metrics.jsonl fields."""
    return {"stability/spike_z": spike["z"], "stability/spike_loss": spike["loss"]}


def parameter_groups(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """The parameters by block: embedding, layer{i}, head (the final norm and the output projection; a tied output
    projection is the embedding's, and counted there)."""
    groups: dict[str, list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():  # a tied weight comes once, under its first name (embed)
        parts = name.split(".")
        key = "embedding" if parts[0] == "embed" else f"layer{parts[1]}" if parts[0] == "layers" else "head"
        groups.setdefault(key, []).append(param)
    return groups


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """This rank's part of an FSDP2 (DTensor) parameter; a plain tensor is whole."""
    return (param.to_local() if hasattr(param, "to_local") else param).detach()


def snapshot(params: list[torch.Tensor], fp32: bool) -> list[torch.Tensor]:
    """Copies of this rank's shards before an update: as they are, or in fp32 (what squared_norms' fp32 path
    takes)."""
    return [local_shard(p).to(torch.float32, copy=True) if fp32 else local_shard(p).clone() for p in params]


def squared_norms(params: list[torch.Tensor], before: list[torch.Tensor], fp32: bool) -> torch.Tensor:
    """[||W_after - W_before||^2, ||W_before||^2] of one block's shards (float64), with no host sync.

    fp32=False: in float64, a few kernels per parameter (CPU, where these are the figures CPU runs have always
    logged). fp32=True: by foreach kernels over the whole block at once, a few launches whatever its number of
    parameters and no float64 copy of the weights (CUDA); `before` (an fp32 snapshot) is overwritten by the
    difference, as nothing needs it after."""
    if not fp32:
        zero = torch.zeros((), dtype=torch.float64, device=before[0].device)
        change = sum((((local_shard(p).double() - b.double()) ** 2).sum() for p, b in zip(params, before)), zero)
        size = sum(((b.double() ** 2).sum() for b in before), zero)
        return torch.stack([change, size])
    size = torch.stack(torch._foreach_norm(before)).double().square().sum()
    torch._foreach_sub_(before, [local_shard(p).float() for p in params])
    change = torch.stack(torch._foreach_norm(before)).double().square().sum()
    return torch.stack([change, size])


class StabilityMonitors(Callback):
    """Every `every` steps (train.monitor_every, 0: every log_every) and at the end, to metrics.jsonl and TensorBoard:
    `stability/max_attention_logit`, `stability/attention_logit_max/layer{i}` and `stability/output_logit_norm`
    (Transformer.stability_stats), and `stability/update_ratio/<block>` = ||W_after - W_before|| / ||W_before|| of
    that step's update, per block (embedding, layer{i}, head).

    The logits are measured on a fixed micro-batch of validation sequences (the first `micro_batch`), not on
    the step's data: the curve then follows the weights alone, not which batch came, and is the same at any world
    size (every rank feeds the same sequences). The ratios need a copy of this rank's shards, taken in
    before_update on monitored steps only; the squared norms are summed over ranks, so they do not depend on the
    world size either. Not due: a step costs one comparison."""

    name, order = "stability_monitors", 15  # after the spike check, before the callbacks that log and checkpoint

    def __init__(self, every: int, micro_batch: int, doc_mask: bool):
        self.every, self.micro_batch, self.doc_mask = every, micro_batch, doc_mask
        self.groups: dict[str, list[torch.nn.Parameter]] = {}
        self.before: tuple[int, dict[str, list[torch.Tensor]]] | None = None  # (step, the shards before its update)
        self.inputs: tuple[torch.Tensor, torch.Tensor | None] | None = None  # the fixed micro-batch, made once
        self.inputs_sha256 = ""  # of the fixed micro-batch: what a stack's members share to be measured in one pass
        self.handed: tuple[int, list[float]] | None = None  # (step, stability_values) a stack measured for this member

    def pre_train(self, trainer: TrainerView) -> None:
        # the sharded parameters the optimizer updates: no forward has run since the last load or backward, so
        # FSDP2 has them registered (a forward leaves the last block's whole ones in their place until backward)
        self.groups = parameter_groups(trainer.model)
        self.before = None
        self.handed = None  # nothing a stack measured before a rollback or resume

    def before_update(self, trainer: TrainerView) -> Verdict:
        step = trainer.step + 1
        if due(step, self.every, trainer.max_steps):
            fp32 = self.fp32(trainer)
            self.before = (step, {name: snapshot(params, fp32) for name, params in self.groups.items()})
        return TAKE

    @staticmethod
    def fp32(trainer: TrainerView) -> bool:
        """The update ratios in fp32 by foreach kernels on CUDA (cheap there); in float64 per parameter on CPU,
        where the figures stay those CPU runs have always logged."""
        return trainer.dist.device.type == "cuda"

    def acts_at(self, trainer: TrainerView) -> bool:
        return due(trainer.step, self.every, trainer.max_steps)

    def post_step(self, trainer: TrainerView) -> None:
        if not self.acts_at(trainer):
            return
        fields = {}
        if self.before is not None and self.before[0] == trainer.step:  # not a snapshot of an abandoned step
            fields.update(self.update_ratios(trainer))
        self.before = None
        fields.update({f"stability/{key}": value for key, value in self.logit_stats(trainer).items()})
        trainer.log(fields)

    def update_ratios(self, trainer: TrainerView) -> dict[str, float]:
        fp32 = self.fp32(trainer)
        # per block: [||W_after - W_before||^2, ||W_before||^2] of this rank's shards
        totals = torch.stack(
            [squared_norms(params, self.before[1][name], fp32) for name, params in self.groups.items()]
        )
        totals = trainer.dist.sum_tensor(totals)  # float64 sums: the same figure at any world size, up to rounding
        ratios = (totals[:, 0].sqrt() / totals[:, 1].sqrt()).tolist()  # the one host read of the ratios
        return {f"stability/update_ratio/{name}": ratio for name, ratio in zip(self.groups, ratios)}

    def logit_stats(self, trainer: TrainerView) -> dict[str, float]:
        """Transformer.stability_stats on the fixed micro-batch; every rank calls it (FSDP2 gathers the weights).
        A stack's values for this step, where it handed them, instead."""
        inputs = self.fixed_inputs(trainer)
        handed, self.handed = self.handed, None
        if handed is not None and handed[0] == trainer.step:
            return stability_fields(handed[1], inputs[0].numel())
        return trainer.model.stability_stats(*inputs)

    def fixed_inputs(self, trainer: TrainerView) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The fixed micro-batch (the first `micro_batch` validation sequences) on the device, made once."""
        if self.inputs is None:
            count = min(self.micro_batch, trainer.data.val.num_sequences(trainer.seq_len))
            inputs, _, doc_ids = trainer.data.val.batch(list(range(count)), trainer.seq_len)
            doc_ids = doc_ids if self.doc_mask else None
            self.inputs_sha256 = content_sha256(*(t.numpy() for t in (inputs, doc_ids) if t is not None))
            self.inputs = tuple(None if t is None else t.to(trainer.dist.device) for t in (inputs, doc_ids))
        return self.inputs

    def scoring_key(self, trainer: TrainerView) -> tuple:
        """What the logit figures depend on besides the model (a stack's members sharing a key are measured in one
        pass, training.stack_eval): the fixed micro-batch's tokens and document ids."""
        self.fixed_inputs(trainer)
        return (self.inputs_sha256, self.doc_mask)

    def hand(self, step: int, values: list[float]) -> None:
        """A stack's stability_values for this member at `step` (training.stack_eval), for its coming post_step."""
        self.handed = (step, values)
