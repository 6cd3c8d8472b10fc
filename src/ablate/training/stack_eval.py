"""A stack's members scored by the cloze task suite, and validated, in one pass (issue 58 parts 4 and 5): where a
stack's members reach an eval or validation step together, one pass over the rows runs every member's forward at
once, instead of K passes one member after another.

The engine's model for a stack (for_stack) is torch.func.vmap over functional_call of the stack's twin (member 0's
structure on the meta device, torch kernels: training.stack), the members' tensors swapped in: every member runs on
the same rows (the same tokens, positions and tree masks), its hidden states and logits a slice of a leading
dimension of K, and engine.score_members reads each member's scores off its slice. On one CPU thread in fp32 every score
equals the member's own pass bit for bit for dense, grouped-query, latent and mixture-of-experts models
(tests/test_stack_eval.py). A hand-batched model (model.py's layers with a (K, ...) weight path of their own) is
not built: vmap already dispatches a stacked pass's operators once for all members, but for CPU attention's loop
over the members; which is faster on a GPU is not measured (scripts/bench_stack_eval.py times vmap against member
by member).

In training (StackedTrainer.train_step, after the update and before the members' complete_step), score_together
asks each member's EvalSuite whether it acts at the step the member is completing, groups those that do by what
they score (EvalSuite.scoring_key), scores each group of two or more in one pass and hands every callback its
member's results; its post_step records them as its own. A member alone in its group, or not due, scores itself in
its post_step as a lone run does: nothing is skipped, and a result handed for a step its post_step does not act at
is dropped.

validate_together does the same for the held-out loss: the members whose Validation acts at the step and shares a
scoring_key (the same documents, tokens and pass size) have their documents' losses computed by one vmapped
per_token_loss a pass (stacked_token_losses), each Validation handed its member's row; bit for bit each member's own
in fp32 on one CPU thread. monitor_together, for StabilityMonitors' logit figures on their fixed micro-batch: one
vmapped stability_values (stacked_stability_values) and one device read for the group, bit for bit likewise.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap

from ablate.eval import engine, suite
from ablate.training.callbacks.evals import EvalSuite, Handed
from ablate.training.callbacks.stability import StabilityMonitors
from ablate.training.callbacks.validation import Validation


class _Hidden(nn.Module):
    """The member model's final hidden states at the engine's rows as its forward, for functional_call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, positions, attn_mask):
        return self.model.hidden_states(tokens, positions=positions, attn_mask=attn_mask)


class _TokenLosses(nn.Module):
    """The member model's validation losses (per_token_loss) as its forward, for functional_call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, targets):
        return self.model.per_token_loss(tokens, targets, None)


class _StabilityValues(nn.Module):
    """The member model's stability_values (StabilityMonitors' logit figures) as its forward, for functional_call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, doc_ids):
        return self.model.stability_values(tokens, doc_ids)


class _Head(nn.Module):
    """The member model's output projection as its forward, for functional_call (a tied head follows the
    embedding: functional_call ties it)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, hidden):
        return self.model.lm_head(hidden)


@contextlib.contextmanager
def _vmap_costs_quiet():
    """The known costs of vmap here (docs/performance.md), not the user's to fix: CPU attention's loop over the
    members, MoE routing's non-contiguous searchsorted."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*not yet implemented the batching rule", UserWarning)
        warnings.filterwarnings("ignore", ".*searchsorted.*non-contiguous", UserWarning)
        yield


def for_stack(
    stack, members: list[int] | None = None, max_len: int | None = None, device=None, autocast=None
) -> engine.LogitsModel:
    """The engine's model for `members` of `stack` (a training.stack.Stack; None: every member, in order): one
    vmapped forward and output projection for all of them, their parameters as the stack holds them now. A subset
    is copied out of the stack's tensors (an index), all members are used in place."""
    chosen = list(range(stack.size)) if members is None else list(members)
    if not chosen or any(not 0 <= k < stack.size for k in chosen):
        raise ValueError(f"for_stack: members {chosen}; allowed: one or more of 0..{stack.size - 1}")
    tensors = _member_tensors(stack, chosen)
    twin = stack.loss_module.model
    hidden, head = _Hidden(twin), _Head(twin)

    def member_hidden(member_tensors, tokens, positions, attn_mask):
        return functional_call(hidden, member_tensors, (tokens, positions, attn_mask))

    def member_logits(member_tensors, rows):
        return functional_call(head, member_tensors, (rows,))

    def forward(tokens, positions=None, attn_mask=None):
        with _vmap_costs_quiet():  # every member on the same rows: the inputs are not batched
            return vmap(member_hidden, in_dims=(0, None, None, None))(tensors, tokens, positions, attn_mask)

    def project(rows):  # (K, T, d_model) -> (K, T, vocab), each member by its own head
        return vmap(member_logits)(tensors, rows)

    return engine.LogitsModel(
        forward,
        max_len or twin.max_seq_len,
        torch.device(device) if device is not None else next(iter(stack.params.values())).device,
        True,
        autocast or contextlib.nullcontext(),
        head=project,
        members=len(chosen),
    )


@contextlib.contextmanager
def eval_mode(module: nn.Module):
    """`module` in eval mode inside, back in training mode after: as EvalSuite.evaluate puts a lone model."""
    module.eval()
    try:
        yield
    finally:
        module.train()


@dataclass(frozen=True)
class AfterStep:
    """What EvalSuite.acts_at reads of a member, as its complete_step is about to leave it (the step counted, its
    tokens added): asked before the members complete the step, so that the stack scores those due in one pass
    after the update, where each would score itself in its post_step."""

    step: int
    max_steps: int
    tokens: int
    last_step_tokens: int


def after_step(trainer, batch: int) -> AfterStep:
    tokens = batch * trainer.seq_len  # what complete_step adds
    return AfterStep(trainer.step + 1, trainer.max_steps, trainer.tokens + tokens, tokens)


def _shared_passes(trainers: dict, batch: int, kind: type) -> list[tuple[list[int], list]]:
    """The groups of two or more members whose callback of `kind` (EvalSuite, Validation) acts at the step they
    complete and shares a scoring_key: (their member indices, sorted; their (index, callback) pairs). A member
    alone in its group is left out: its post_step does the work as a lone run's does."""
    groups: dict[tuple, list] = {}
    for k, trainer in trainers.items():
        coming = after_step(trainer, batch)
        for callback in trainer.callbacks:
            if isinstance(callback, kind) and callback.acts_at(coming):
                groups.setdefault(callback.scoring_key(trainer), []).append((k, callback))
    shared = [(sorted({k for k, _ in due}), due) for due in groups.values()]
    return [(members, due) for members, due in shared if len(members) > 1]


def score_together(stack, trainers: dict, batch: int) -> float:
    """Before the members' complete_step of a stacked step of `batch` sequences (trainers: member index -> its
    Trainer, those completing the step): each group of two or more members whose EvalSuites act at that step and
    share a scoring_key scored in one pass, every callback of the group handed its member's results. Returns the
    seconds it took (the members' evaluation, not the step's)."""
    start = time.perf_counter()
    for members, due in _shared_passes(trainers, batch, EvalSuite):
        first = trainers[members[0]]
        lm = for_stack(stack, members, max_len=first.seq_len, device=first.dist.device)
        pass_start = time.perf_counter()
        with eval_mode(stack.loss_module), torch.no_grad():
            scored = due[0][1].score(lm, suite.evaluate_members)
        seconds = time.perf_counter() - pass_start
        for k, callback in due:
            step = after_step(trainers[k], batch).step
            callback.hand(Handed(step, scored[members.index(k)], seconds, len(members)))
    return time.perf_counter() - start


def _member_tensors(stack, members: list[int]) -> dict[str, torch.Tensor]:
    """`members`' tensors as the stack holds them now, named for a wrapper of the twin (`model.` first): all
    members in place, a subset copied out (an index)."""
    if members == list(range(stack.size)):
        return {f"model.{name}": t for name, t in (*stack.params.items(), *stack.buffers.items())}
    index = torch.tensor(members, device=next(iter(stack.params.values())).device)
    return {f"model.{name}": t.detach()[index] for name, t in (*stack.params.items(), *stack.buffers.items())}


def _members_on_the_same_rows(stack, members: list[int], wrapper: nn.Module):
    """(*inputs) -> `wrapper`'s forward for each of `members` of `stack` ((K, ...) outputs), every member on the same
    inputs: one vmapped functional_call, under the stack's autocast as the members' own entry points run."""
    tensors = _member_tensors(stack, members)

    def member(member_tensors, *inputs):
        return functional_call(wrapper, member_tensors, inputs)

    def call(*inputs):
        with stack.cast(inputs[0].device.type), _vmap_costs_quiet():
            return vmap(member, in_dims=(0, *(None for _ in inputs)))(tensors, *inputs)

    return call


def stacked_token_losses(stack, members: list[int]):
    """(inputs, targets) -> the (K, B, S) validation losses of `members` of `stack`, every member on the same
    rows: one vmapped per_token_loss."""
    return _members_on_the_same_rows(stack, members, _TokenLosses(stack.loss_module.model))


def validate_together(stack, trainers: dict, batch: int) -> float:
    """As score_together, for the held-out loss: each group of two or more members whose Validation acts at the
    coming step and shares a scoring_key has its documents' losses computed in one vmapped pass, each callback
    handed its member's row. Returns the seconds it took (the members' validation, not the step's)."""
    start = time.perf_counter()
    for members, due in _shared_passes(trainers, batch, Validation):
        first, callback = trainers[members[0]], due[0][1]
        with eval_mode(stack.loss_module), torch.no_grad():
            nats = callback.document_nats(first, stacked_token_losses(stack, members))
        for k, member_callback in due:
            member_callback.hand(after_step(trainers[k], batch).step, nats[members.index(k)])
    return time.perf_counter() - start


def stacked_stability_values(stack, members: list[int]):
    """(tokens, doc_ids) -> the (K, layers + 1) stability_values of `members` of `stack`, every member on the same
    rows: one vmapped pass."""
    return _members_on_the_same_rows(stack, members, _StabilityValues(stack.loss_module.model))


def monitor_together(stack, trainers: dict, batch: int) -> float:
    """As score_together, for StabilityMonitors' logit figures: each group of two or more members whose monitors act
    at the coming step on the same fixed micro-batch has its stability_values computed in one vmapped pass (one
    device read for all), each callback handed its member's row. Returns the seconds it took (not the step's)."""
    start = time.perf_counter()
    for members, due in _shared_passes(trainers, batch, StabilityMonitors):
        inputs = due[0][1].fixed_inputs(trainers[members[0]])
        with torch.no_grad():
            rows = stacked_stability_values(stack, members)(*inputs).tolist()
        for k, callback in due:
            callback.hand(after_step(trainers[k], batch).step, rows[members.index(k)])
    return time.perf_counter() - start
