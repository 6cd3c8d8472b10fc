"""Runs of one shape as one stacked model: the mechanism under `ablate run --stack` (not wired to the CLI yet).

K member models, each built and initialised exactly as its lone run builds it, give their parameters and buffers
one storage with a leading dimension of K: every member's tensor becomes a view of its slice. So the members (their
optimizers, checkpoints, validation and evals, which see an ordinary model) and the stack read the same numbers,
and an update through either is seen by both. The stack's forward and backward are one call for all K:
torch.func.vmap over functional_call of one member's modules, each member on its own batch.

Exactness: on CPU in fp32 every member's loss and gradients equal its lone model's bit for bit for dense and latent
attention (vmap runs the chunked loss member by member, kernels/reference.LinearCrossEntropyFunction.vmap, and
attention falls back to a loop over members); mixture-of-experts layers agree to ~1e-10 (batched matmuls round
differently). tests/test_stack.py checks both, and five optimizer steps of AdamW per member.

StackedTrainer steps K ordinary Trainers (each its own run folder, sampler, optimizer, learning-rate schedule,
callbacks) through one Stack: one forward and backward for all, then each member's own Trainer.finish_step
(clipping by its own norm, its non-finite guard and spike policy, its update). A member that diverges is masked:
its row is still computed (on another member's batch) but never stepped again, and the others go on.

StackedTrainer.fit trains the members to their last step as Trainer.fit trains one: each resumed from its own
newest intact checkpoint (a member's checkpoint is an ordinary one, written from its views), then stepped together;
it returns each member's summary.

Not yet: `ablate run --stack` and the run folders' life around a stack (training.run: locks, identity, status.json,
failure records), the MoE router's per-step statistics (reset here: ExpertBalance
reads nothing from a stack), a batched optimizer step (each member's optimizer steps its own views), compile and
bf16 autocast under vmap (the stack runs the model's eager loss), Triton kernels under vmap (ablate.kernels'
triton_ops have no batching rule: Stack refuses kernels="triton"), FSDP2 (a stack is one device's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings

import torch
from torch import nn
from torch.func import functional_call, vmap

from ablate.moe import Router
from ablate.training.callbacks import Divergence
from ablate.training.parallel import seed_everything


class _Loss(nn.Module):
    """The member model's training loss as its forward, for functional_call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, targets, doc_ids):
        # the class's loss, not the instance's: at world size 1 the instance's may be compiled or wrapped in
        # autocast (training.parallel); the stack compiles and casts its own vmapped call instead
        return type(self.model).loss(self.model, tokens, targets, doc_ids)


def _torch_kernels_twin(model: nn.Module) -> nn.Module:
    """The code vmap runs: a copy of `model`'s structure on the meta device whose ops take their torch references
    (the Triton kernels, "auto"'s choice on a GPU, have no batching rule). functional_call swaps every parameter
    and buffer in, so the twin holds no storage; a model without a `cfg` of kernels is its own twin."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "kernels"):
        return model
    with torch.device("meta"):
        twin = type(model)(dataclasses.replace(cfg, kernels="torch"), max_seq_len=model.max_seq_len)
    twin.loss_chunks = model.loss_chunks
    return twin


class Stack:
    """K models of one structure trained as one: `params` and `buffers` (name -> (K, ...) tensor) are the storage
    the members' own tensors now view. loss() runs every member on its own batch; after backward, member_grads()
    hands each member its slice of the gradients, so its own optimizer steps it as a lone run's would."""

    def __init__(self, models: list[nn.Module], compute_dtype: torch.dtype | None = None, compile: bool = False):
        if not models:
            raise ValueError("Stack: no models; allowed: one or more models of one structure")
        shapes = [[(n, tuple(t.shape)) for n, t in (*m.named_parameters(), *m.named_buffers())] for m in models]
        for k, found in enumerate(shapes[1:], start=1):
            if found != shapes[0]:
                raise ValueError(
                    f"Stack: model {k} differs from model 0 in its parameters or their shapes; allowed: models of "
                    f"one structure (runs that differ only in values)"
                )
        if getattr(getattr(models[0], "cfg", None), "kernels", "torch") == "triton":
            raise NotImplementedError(
                "Stack: model.kernels='triton' has no batching rule under vmap yet; use kernels='auto' (a stack "
                "runs the torch references, compiled where train.compile is on) or 'torch'"
            )
        self.models = list(models)
        self.loss_module = _Loss(_torch_kernels_twin(models[0]))  # member 0's structure, its tensors swapped in
        self.params = self._share([dict(m.named_parameters()) for m in models], parameters=True)
        self.buffers = self._share([dict(m.named_buffers()) for m in models], parameters=False)
        self._routers = [m for m in self.loss_module.modules() if isinstance(m, Router)]
        self.compute_dtype = compute_dtype
        # one graph for every member's forward and loss (and, through AOTAutograd, their backward), as a lone
        # run's single-device path compiles its model and loss
        self._stacked_loss = torch.compile(self._eager_loss, fullgraph=True) if compile else self._eager_loss

    @property
    def size(self) -> int:
        return len(self.models)

    def _share(self, per_model: list[dict], parameters: bool) -> dict[str, torch.Tensor]:
        """name -> the members' tensors stacked; each member's tensor re-pointed to its slice (a view). A tied
        parameter appears once (named_parameters drops repeats), so a member's tie survives."""
        stacked = {}
        for name in per_model[0]:
            whole = torch.stack([tensors[name].detach() for tensors in per_model])
            stacked[name] = nn.Parameter(whole) if parameters else whole
            for k, tensors in enumerate(per_model):
                tensors[name].data = whole[k]  # a Parameter made from `whole` shares its storage
        return stacked

    def loss(
        self, tokens: torch.Tensor, targets: torch.Tensor, doc_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(K,) losses to backpropagate and (K,) cross-entropies of tokens/targets (K, B, S), member k on row k."""
        if tokens.shape[0] != self.size:
            raise ValueError(f"Stack.loss: {tokens.shape[0]} batches for {self.size} members")
        named = {f"model.{n}": t for n, t in self.params.items()} | {f"model.{n}": t for n, t in self.buffers.items()}
        try:
            with warnings.catch_warnings():  # known costs of vmap here (docs/performance.md), not the user's to fix
                warnings.filterwarnings("ignore", ".*not yet implemented the batching rule", UserWarning)
                warnings.filterwarnings("ignore", ".*searchsorted.*non-contiguous", UserWarning)  # MoE routing
                return self._stacked_loss(named, tokens, targets, doc_ids)
        finally:
            for router in self._routers:  # statistics taken inside vmap would leak batched tensors
                router.step_stats = None

    def _eager_loss(self, named, tokens, targets, doc_ids):
        def member(tensors, tokens, targets, doc_ids):
            return functional_call(self.loss_module, tensors, (tokens, targets, doc_ids))

        cast = (
            torch.autocast(tokens.device.type, dtype=self.compute_dtype)
            if self.compute_dtype is not None
            else contextlib.nullcontext()
        )
        with cast:
            return vmap(member, in_dims=(0, 0, 0, None if doc_ids is None else 0), randomness="different")(
                named, tokens, targets, doc_ids
            )

    def member_grads(self) -> None:
        """Each member's parameters get their slice of the stacked gradients (views, no copy); the stacked
        gradients are kept until zero_grad."""
        for k, model in enumerate(self.models):
            for name, param in model.named_parameters():
                grad = self.params[name].grad
                param.grad = None if grad is None else grad[k]

    def zero_grad(self) -> None:
        for param in self.params.values():
            param.grad = None
        for model in self.models:
            model.zero_grad(set_to_none=True)


class StackedTrainer:
    """Member Trainers of one shape (the same batch plan, sequence length, micro batch and device, at world size
    1) stepped as one Stack. `failed`: member index -> the Divergence that masked it."""

    def __init__(self, members: list):
        def shape(t):  # what a stack's members must share: their steps' shapes and how they are computed
            return (t.batch_plan, t.seq_len, t.run.train.micro_batch, t.dist.device, t.compute_dtype, t.compiled)

        first = members[0]
        for k, t in enumerate(members):
            if shape(t) != shape(first) or t.dist.world != 1:
                raise ValueError(
                    f"StackedTrainer: member {k} ({t.run.name} seed {t.run.train.seed}) differs from member 0 in "
                    f"its batch plan, sequence length, micro batch, device, dtype or compile, or trains over ranks; "
                    f"allowed: runs that differ only in values, at world size 1"
                )
        self.members = list(members)
        self.stack = Stack([t.model for t in members], compute_dtype=first.compute_dtype, compile=first.compiled)
        self.failed: dict[int, Divergence] = {}

    def fit(self) -> list[dict | None]:
        """Every member trained to its last step, as Trainer.fit trains one: each resumed from its own newest
        intact checkpoint (its own folder; the stack sees what they restore, its storage is theirs), then stepped
        together. Returns each member's summary, None for a member that diverged (`failed` says why)."""
        seed_everything(self.members[0].run.train.seed)  # one process: the global RNG is the first member's
        for member in self.members:
            member.start()
        steps = {member.step for member in self.members}
        if len(steps) > 1:
            raise NotImplementedError(
                f"StackedTrainer: members resumed at steps {sorted(steps)}; a stack resumes only from checkpoints "
                f"of one step (resume the others alone, or from that step)"
            )
        try:
            for member in self.members:
                member.begin()
            while self.live and self.members[self.live[0]].step < self.members[self.live[0]].max_steps:
                self.train_step()
            for k in self.live:
                for callback in self.members[k].callbacks:
                    callback.post_train(self.members[k])
        finally:
            for member in self.members:
                member.end()
        return [None if k in self.failed else member.summary() for k, member in enumerate(self.members)]

    @property
    def live(self) -> list[int]:
        return [k for k in range(len(self.members)) if k not in self.failed]

    def train_step(self) -> None:
        """One step of every live member: each its own learning rate and batch (its own sampler), one stacked
        forward and backward per pass, then each member's finish_step on its slice of the gradients."""
        start, live = time.perf_counter(), self.live
        if not live:
            raise RuntimeError("StackedTrainer: every member has diverged (see `failed`)")
        steps = {self.members[k].step for k in live}
        if len(steps) > 1:  # a rollback moved one member back: its batches may differ in size from the others'
            raise NotImplementedError(
                f"StackedTrainer: members at steps {sorted(steps)} (a rollback within a stack is not supported yet)"
            )
        batch = self.members[live[0]].batch_plan[steps.pop()]
        lrs = {k: self.members[k].set_step_lr(batch) for k in live}
        passes = {k: list(self.members[k].passes(batch)) for k in live}
        rows = [passes.get(k, passes[live[0]]) for k in range(len(self.members))]  # a masked member: any batch
        loss_sum = torch.zeros(len(self.members), device=self.members[0].dist.device)
        for i, (_, share) in enumerate(rows[0]):
            parts = [row[i][0] for row in rows]  # each member's [inputs, targets, doc_ids or None]
            inputs, targets, doc_ids = (
                None if parts[0][j] is None else torch.stack([p[j] for p in parts]) for j in range(3)
            )
            loss, ce = self.stack.loss(inputs, targets, doc_ids)
            (loss / share).sum().backward()  # members' rows never mix: each slice's gradient is its own loss's
            loss_sum = loss_sum + ce.detach() / share
        self.stack.member_grads()
        for k in live:
            try:
                self.members[k].finish_step(loss_sum[k], batch, lrs[k], start)
            except Divergence as exc:
                self.failed[k] = exc
        self.stack.zero_grad()
