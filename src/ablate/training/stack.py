"""Runs of one shape as one stacked model: the mechanism under `ablate run --stack K` (training.run.train_stack).

K member models, each built and initialised exactly as its lone run builds it, give their parameters and buffers
one storage with a leading dimension of K: every member's tensor becomes a view of its slice. So the members (their
optimizers, checkpoints, validation and evals, which see an ordinary model) and the stack read the same numbers,
and an update through either is seen by both. The stack's forward and backward are one call for all K:
torch.func.vmap over functional_call of a twin of member 0's modules (on the meta device, torch kernels: Triton's
have no batching rule), each member on its own batch; compiled as one graph where the members compile
(train.compile), under bf16 autocast where they compute in bf16. A model with experts hands each member's routers
their own routing statistics, so ExpertBalance logs them and moves a router bias as in a lone run.

Exactness: on CPU in fp32 every member's loss and gradients equal its lone model's bit for bit for dense multi-head
and latent attention (the chunked loss runs batched over the members, kernels/reference.
StackedLinearCrossEntropyFunction: each member's chunks hold the rows and sums a lone run's do; CPU attention
falls back to a loop over members), with Muon (its Newton-Schulz batched over the stack, Muon.stacked_step), a
batch ramp, document masks and members that differ in learning rate, weight decay, init scale, clipping and
schedule; a single key-value head (MQA) and mixture-of-experts layers agree to within 1e-5 relative (batched
kernels round differently: over 50 steps MoE's losses moved ~2e-7, its grad norms ~3e-6, every routing choice the
same). tests/test_stack.py, tests/test_stack_equality.py, tests/test_stack_run.py.

StackedTrainer steps K ordinary Trainers (each its own run folder, sampler, optimizer, learning-rate schedule,
callbacks) through one Stack: one forward and backward for all; then each member's Trainer.decide_update
(clipping by its own norm, its non-finite guard and spike policy: its verdict); one update of the members that
take theirs (batched where their optimizer's class has a stacked_step, Muon's; each optimizer's own step
otherwise, AdamW's fused kernel); then each member's complete_step (its counters and callbacks). A member that
diverges is masked: its row is still computed (on another member's batch) but never stepped again, and the
others go on. Members at different steps (resumed from checkpoints of different steps, or one rolled back by its
spike policy) step alone until they are at one step again. Members due to validate, score the task suite or measure
their stability monitors' logits at one step do it in one stacked pass (training.stack_eval), each member's callback
recording its own results.

Where every member has train.cuda_graphs on, the stacked step is replayed from CUDA graphs (training.graphs.
StackGraphs). Not yet: Triton kernels under vmap, FSDP2 (a stack is one device's: ablate run refuses --stack under
torchrun).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import warnings

import torch
from torch import nn
from torch.func import functional_call, vmap

from ablate.components.moe import Router
from ablate.optim import stacked_step_of
from ablate.training import stack_eval
from ablate.training.callbacks import Divergence
from ablate.training.graphs import StackGraphs
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


def _torch_kernels_twin(model: nn.Module, loss_chunks: int | None) -> nn.Module:
    """The code vmap runs: a copy of `model`'s structure on the meta device whose ops take their torch references
    (the Triton kernels, "auto"'s choice on a GPU, have no batching rule). functional_call swaps every parameter
    and buffer in, so the twin holds no storage; a model without a `cfg` of kernels is its own twin.
    `loss_chunks`: the stacked loss's chunk count."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(cfg, "kernels"):
        return model
    with torch.device("meta"):
        twin = type(model)(dataclasses.replace(cfg, kernels="torch"), max_seq_len=model.max_seq_len)
    twin.loss_chunks = loss_chunks
    return twin


class Stack:
    """K models of one structure trained as one: `params` and `buffers` (name -> (K, ...) tensor) are the storage
    the members' own tensors now view. loss() runs every member on its own batch; after backward, member_grads()
    hands each member its slice of the gradients, so its own optimizer steps it as a lone run's would."""

    def __init__(
        self,
        models: list[nn.Module],
        compute_dtype: torch.dtype | None = None,
        compile: bool = False,
        loss_chunks: int | None | str = "member",
    ):
        """`loss_chunks`: the stacked loss's chunk count; "member": model 0's own."""
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
        chunks = getattr(models[0], "loss_chunks", None) if loss_chunks == "member" else loss_chunks
        self.loss_module = _Loss(_torch_kernels_twin(models[0], chunks))  # member 0's structure, its tensors in
        self.params = self._share([dict(m.named_parameters()) for m in models], parameters=True)
        self.buffers = self._share([dict(m.named_buffers()) for m in models], parameters=False)
        self._routers = [m for m in self.loss_module.modules() if isinstance(m, Router)]  # the twin's, in order
        self._member_routers = [[m for m in model.modules() if isinstance(m, Router)] for model in models]
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
        """(K,) losses to backpropagate and (K,) cross-entropies of tokens/targets (K, B, S), member k on row k.
        A model with experts: each member's routers add this pass's routing statistics to their own step_stats,
        as a lone run's forward does (ExpertBalance reads them after the step, and moves a router bias by them)."""
        if tokens.shape[0] != self.size:
            raise ValueError(f"Stack.loss: {tokens.shape[0]} batches for {self.size} members")
        named = {f"model.{n}": t for n, t in self.params.items()} | {f"model.{n}": t for n, t in self.buffers.items()}
        with warnings.catch_warnings():  # known costs of vmap here (docs/performance.md), not the user's to fix
            warnings.filterwarnings("ignore", ".*not yet implemented the batching rule", UserWarning)
            warnings.filterwarnings("ignore", ".*searchsorted.*non-contiguous", UserWarning)  # MoE routing
            loss, ce, stats = self._stacked_loss(named, tokens, targets, doc_ids)
        for k, routers in enumerate(self._member_routers):
            for router, router_stats in zip(routers, stats):
                taken = router_stats[k].detach()
                router.step_stats = taken if router.step_stats is None else router.step_stats + taken
        return loss, ce

    def _eager_loss(self, named, tokens, targets, doc_ids):
        """The vmapped call: (K,) losses, (K,) cross-entropies, and per router of the twin its (K, ...) routing
        statistics of the pass (returned, not left on the twin: a tensor taken inside vmap is only valid there)."""

        def member(tensors, tokens, targets, doc_ids):
            for router in self._routers:
                router.step_stats = None
            loss, ce = functional_call(self.loss_module, tensors, (tokens, targets, doc_ids))
            stats = [router.step_stats for router in self._routers]
            for router in self._routers:
                router.step_stats = None
            return loss, ce, stats

        with self.cast(tokens.device.type):
            return vmap(member, in_dims=(0, 0, 0, None if doc_ids is None else 0), randomness="different")(
                named, tokens, targets, doc_ids
            )

    def cast(self, device_type: str):
        """The members' autocast around a stacked call: bf16 where they compute in it, else nothing."""
        if self.compute_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=self.compute_dtype)

    def forget_routing(self, k: int) -> None:
        """Member k's routing statistics of this step dropped (its row ran on another member's batch)."""
        for router in self._member_routers[k]:
            router.step_stats = None

    def member_grads(self) -> None:
        """Each member's parameters get their slice of the stacked gradients (views, no copy); the stacked
        gradients are kept until zero_grad."""
        for k, model in enumerate(self.models):
            for name, param in model.named_parameters():
                grad = self.params[name].grad
                param.grad = None if grad is None else grad[k]

    @property
    def has_routers(self) -> bool:
        return bool(self._routers)

    def zero_grad(self) -> None:
        for param in self.params.values():
            param.grad = None
        for model in self.models:
            model.zero_grad(set_to_none=True)


# The model fields a stack's members may differ in: read only by the initialisation, which each member does itself
# (its own seed); every other field shapes the parameters or is read by the forward, which runs member 0's code.
VALUE_ONLY_MODEL_FIELDS = ("init_std",)


def stack_key(checked) -> tuple | str:
    """What runs must share to be trained as one stack (their model but its init scale, sequence length, batch
    plan, micro batch, device, dtype, compile and cuda_graphs), or why this run cannot be stacked at all. Everything
    else may differ: seeds, data, optimizer and schedule (each member has its own), callbacks, evals, cadences."""
    run = checked.config
    if run.branch:
        return "a branch starts from its parent's checkpoint, which a stack would have to train first"
    if run.model.kernels == "triton":
        return "model.kernels='triton' has no batching rule under vmap (use 'auto': a stack runs the references)"
    if run.train.float8:
        return "train.float8's matmuls have no batching rule under vmap"
    if run.model.dropout:
        return "model.dropout draws its masks from the one random stream a stack shares: not the lone run's masks"
    refusing = _unstackable_component(run)
    if refusing:
        return refusing
    model = {f: v for f, v in dataclasses.asdict(run.model).items() if f not in VALUE_ONLY_MODEL_FIELDS}
    t = run.train
    return (
        json.dumps(model, sort_keys=True),  # options: a dict
        run.data.seq_len,
        tuple(checked.batch_plan),
        t.micro_batch,
        t.device,
        t.dtype,
        t.compile,
        t.cuda_graphs,
    )


def _unstackable_component(run) -> str | None:
    """Why a component of the run cannot train under vmap: one whose class says `stacks = False` (its reason in
    `stacks_why`), e.g. data-dependent control flow; None when all can."""
    from ablate.components import registry
    from ablate.setup.components import used

    for kind, name in used(run).items():
        entry = registry.lookup(kind, name)
        if getattr(entry.obj, "stacks", True) is False:
            why = getattr(entry.obj, "stacks_why", "it says it has no batching rule under vmap")
            return f"{registry.FIELD_OF[kind]}={name!r} ({entry.qualname}) cannot be stacked: {why}"
    return None


def plan_stacks(runs: list, size: int) -> tuple[list[list], list[str]]:
    """`runs` (CheckedRuns) in stacks of at most `size` runs that share a stack_key, in the order they come;
    and a line per run that trains alone, saying why. A run whose key no other shares is a stack of one."""
    groups: dict[object, list] = {}
    for run in runs:
        key = stack_key(run)
        groups.setdefault(key if not isinstance(key, str) else id(run), []).append(run)
    stacks, alone = [], []
    for members in groups.values():
        stacks.extend(members[i : i + size] for i in range(0, len(members), size))
        if len(members) == 1:
            run = members[0].config
            reason = stack_key(members[0])
            why = reason if isinstance(reason, str) else "no other run shares its shape and steps"
            alone.append(f"{run.name} seed{run.train.seed}: alone ({why})")
    return stacks, alone


def _stacked_passes(rows: list[list]) -> list:
    """Each member's passes (`rows`, member k's at k) as the stack's: per pass its [inputs, targets, doc_ids or
    None] stacked over the members, and its share."""
    stacked = []
    for i, (_, share) in enumerate(rows[0]):
        parts = [row[i][0] for row in rows]  # each member's [inputs, targets, doc_ids or None]
        stacked.append(([None if parts[0][j] is None else torch.stack([p[j] for p in parts]) for j in range(3)], share))
    return stacked


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
        self.last_step_seconds: float | None = None  # the previous stacked step's, from its start to its last update
        self.stack = Stack(
            [t.model for t in members],
            compute_dtype=first.compute_dtype,
            compile=first.compiled,
            loss_chunks=first.stacked_loss_chunks(len(members)),
        )
        self.failed: dict[int, Divergence] = {}
        # train.cuda_graphs: the stacked step from CUDA graphs where every member's are on (stack_key keeps True
        # with True; "auto" may differ by member, e.g. an optimizer that cannot be captured)
        graphed = [t.graphs is not None for t in members]
        self.graphs = StackGraphs(self) if all(graphed) else None
        if any(graphed) and not all(graphed):
            without = ", ".join(f"{t.run.name} seed {t.run.train.seed}" for t in members if t.graphs is None)
            for t in members:
                if t.graphs is not None:
                    t.say(
                        f"train.cuda_graphs: the stack's steps run un-graphed ({without} has them off); only this "
                        f"run's steps alone are captured"
                    )

    def fit(self) -> list[dict | None]:
        """Every member trained to its last step, as Trainer.fit trains one: each resumed from its own newest
        intact checkpoint (its own folder; the stack sees what they restore, its storage is theirs), then stepped
        together; members resumed at different steps (a stack killed between its members' checkpoints) first
        bring the ones behind up alone. One Ctrl-C stops every member before the same step's update. Returns each
        member's summary, None for a member that diverged (`failed` says why)."""
        seed_everything(self.members[0].run.train.seed)  # one process: the global RNG is the first member's
        ctrl_c = self.members[0].ctrl_c
        for member in self.members:
            member.ctrl_c = ctrl_c  # one handler: each member's finish_step asks it before its update
            member.start()
        try:
            with ctrl_c:
                for member in self.members:
                    member.begin()
                while self.unfinished:
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

    @property
    def unfinished(self) -> list[int]:
        return [k for k in self.live if self.members[k].step < self.members[k].max_steps]

    def train_step(self) -> None:
        """One step of every unfinished member: each its own learning rate and batch (its own sampler), one
        stacked forward and backward per pass, then each member's finish_step on its slice of the gradients.
        Members at different steps (resumed from checkpoints of different steps, or one rolled back by its spike
        policy) are not stacked: the ones furthest behind take a step alone, until all are at one step again."""
        start, active = time.perf_counter(), self.unfinished
        if not self.live:
            raise RuntimeError("StackedTrainer: every member has diverged (see `failed`)")
        if not active:
            return
        steps = {k: self.members[k].step for k in active}
        if len(set(steps.values())) > 1:
            behind = min(steps.values())
            for k in [k for k in active if steps[k] == behind]:
                self._guarded(k, self.members[k].train_step)
            return
        batch = self.members[active[0]].batch_plan[steps[active[0]]]
        lrs = {k: self.members[k].set_step_lr(batch) for k in active}
        # each member's step took the whole stack's: the previous stacked step's time (this one's is not over
        # while its members' callbacks run), the time so far on the first
        seconds = self.last_step_seconds
        if self.graphs is not None and self.graphs.ready(batch):
            decided = self.graphs.decide(active, batch, lrs)  # the same step, replayed from CUDA graphs
        else:
            passes = {k: list(self.members[k].passes(batch)) for k in active}
            rows = [passes.get(k, passes[active[0]]) for k in range(len(self.members))]  # the others: any batch
            loss_sum = self.backward(_stacked_passes(rows))
            self.stack.member_grads()
            decided = self.decide(active, lambda k: self.members[k].decide_update(loss_sum[k], batch, lrs[k]))
            self.update([k for k, pending in decided.items() if pending.take])
            if self.graphs is not None:
                self.graphs.saw_eager_step(batch)
        if self.graphs is not None and any(k not in decided and k not in self.failed for k in active):
            self.graphs.forget()  # a member rolled back: its optimizer's state may be new tensors
        # the members due to validate or score the task suite at this step, each in one pass (their callbacks record)
        completing = {k: self.members[k] for k in decided}
        evals = stack_eval.validate_together(self.stack, completing, batch)
        evals += stack_eval.score_together(self.stack, completing, batch)
        evals += stack_eval.monitor_together(self.stack, completing, batch)
        for k, pending in decided.items():
            self._guarded(k, lambda k=k, p=pending: self.members[k].complete_step(p, batch, start, seconds))
        callbacks = evals + sum(self.members[k].post_step_seconds for k in decided)  # evals, checkpoints: not the step
        self.last_step_seconds = time.perf_counter() - start - callbacks
        for k in set(range(len(self.members))) - set(active):  # a row computed on another's batch: nobody's step
            self.stack.forget_routing(k)
        self.stack.zero_grad()

    def backward(self, passes: list) -> torch.Tensor:
        """Forward and backward of each of the step's `passes` (([inputs, targets, doc_ids or None] stacked over the
        members, (K, ...) each), share), the stacked gradients summed; the (K,) sums of the members' cross-entropies
        (each divided by its share), on the device."""
        loss_sum = torch.zeros(len(self.members), device=self.members[0].dist.device)
        for (inputs, targets, doc_ids), share in passes:
            loss, ce = self.stack.loss(inputs, targets, doc_ids)
            (loss / share).sum().backward()  # members' rows never mix: each slice's gradient is its own loss's
            loss_sum = loss_sum + ce.detach() / share
        return loss_sum

    def decide(self, active: list[int], decide_member) -> dict:
        """Each active member's verdict, `decide_member(k)` (its decide_update: its clipping, figures and verdict):
        member index -> its PendingStep, for the members that go on to an update or its skip (not those rolled back
        or masked as diverged). A Ctrl-C stops them all before any update: the figures the members before it staged
        are dropped."""
        decided = {}
        try:
            for k in active:
                pending = self._guarded(k, lambda k=k: decide_member(k))
                if pending is not None:
                    decided[k] = pending
        except KeyboardInterrupt:
            for k in decided:
                self.members[k].figures.drop_newest()  # this step never happened, for any member
            raise
        return decided

    def update(self, taking: list[int]) -> None:
        """The update of the members that take it: one batched step where their optimizer's class has one
        (Muon.stacked_step: Newton-Schulz over the stack), else each optimizer's own step."""
        optimizers = [self.members[k].optimizer for k in taking]
        stacked_step = stacked_step_of(optimizers)
        if stacked_step is not None:
            stacked_step(optimizers)
        else:
            for optimizer in optimizers:
                optimizer.step()

    def _guarded(self, k: int, step):
        """Member k's part of the step (its value); a Divergence masks it (recorded in `failed`: None), the others
        go on."""
        try:
            return step()
        except Divergence as exc:
            self.failed[k] = exc
            return None
