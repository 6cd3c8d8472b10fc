"""The Trainer: one run's model, optimizer and data, its step, and the callbacks (ablate.training.callbacks) around it.

Top to bottom: building the model, optimizer and data; what callbacks may call (log, say); the step, and acting on
the callbacks' verdicts; checkpoint state (resume_state, restore, roll_back); the loop (fit) and a branch's start;
summary.json's figures. A run's callbacks are made by ablate.training.callbacks.standard; a step replayed from CUDA
graphs is ablate.training.graphs'. The run's life around the Trainer (its folder, lock, identity,
failures) is ablate.training.run's.
"""

from __future__ import annotations

import math
import time
from functools import cache
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from ablate import checkpoint_files, rundir
from ablate.config import ConfigError, RunConfig
from ablate.data.batch_schedule import largest_pass, lr_batch_scale, rank_micro_batches
from ablate.data.prepare import prepare_data
from ablate.data.token_files import PreparedData
from ablate.kernels import loss_chunks
from ablate.model import Transformer
from ablate.optim import build_optimizer, lr_factor, set_lr
from ablate.setup import auto
from ablate.setup.checks import CheckedRun, cuda_graphs_refusal
from ablate.training import checkpoint
from ablate.training.callbacks import TAKE, Callback, CallbackStateError, Divergence, StepValues, Verdict
from ablate.training.callbacks.metrics import MetricsChannel, peak_memory_bytes
from ablate.training.callbacks.standard import standard_callbacks
from ablate.training.figures import PendingStep, StepFigures
from ablate.training.graphs import StepGraphs
from ablate.training.interrupt import CtrlC
from ablate.training.parallel import (
    Dist,
    device_name,
    enable_tf32,
    parallelize,
    peak_flops_for,
    peak_flops_source,
    seed_everything,
)


def loss_chunks_for(run: RunConfig, device: torch.device, rows: int, compiled: bool, members: int = 1) -> int | None:
    """How many chunks the training loss splits a pass's `rows` into on `device` (ablate.kernels.loss_chunks, from
    the device's free memory now: for a run, before its model is built); None: the CPU rule (a chunk sized for the
    caches). `members`: a stack's, whose loss holds every member's chunk at once."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_memory()
    logit_bytes = 2 if auto.uses_bf16(run.train.dtype, device) else 4
    m = run.model
    return loss_chunks(
        rows, m.d_model, m.vocab_size, device.type, free, logit_bytes=logit_bytes, compiled=compiled, members=members
    )


def available_memory() -> int:
    """The host memory a new allocation can take now (Linux's MemAvailable), or 0 where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@cache
def _peak_flops(device_type: str, index: int | None, dtype: torch.dtype) -> float:
    return peak_flops_for(torch.device(device_type, index), dtype)


class Trainer:
    """What callbacks read of it is ablate.training.callbacks.TrainerView."""

    def __init__(self, checked: CheckedRun, run_dir: Path, d: Dist, callbacks: list[Callback] | None = None):
        if checked.world != d.world:  # check_run(run, d.world) checks a run for this world
            raise ValueError(f"{checked.config.name}: checked for a world of {checked.world}, trained in {d.world}")
        run = self.run = checked.config
        self.run_dir, self.dist = run_dir, d
        t = run.train
        self.run_name, self.seq_len = run.name, run.data.seq_len
        self.batch_plan = list(checked.batch_plan)  # the global batch of every step (0 before a branch's start)
        self.max_steps = len(self.batch_plan)
        self.callbacks = sorted(callbacks if callbacks is not None else standard_callbacks(run), key=lambda c: c.order)
        self.channel = MetricsChannel(run_dir, f"[{run.name} seed{t.seed}]", d.is_main)
        largest = largest_pass(self.batch_plan, d.world, t.micro_batch)
        if largest != t.micro_batch:  # micro_batch is the most a pass may take, not what it must
            self.say(
                f"world size {d.world}: each rank takes {t.global_batch // d.world} of a step's "
                f"{t.global_batch} sequences, in passes of at most {largest} (train.micro_batch={t.micro_batch} "
                f"is the most a pass may take; config.json: rank_micro_batch)"
            )
        use_bf16 = checked.bf16
        # bf16 keeps fp32 parameters (the optimizer's master weights) on every device: at world size 1 the model
        # computes under bf16 autocast; above, FSDP2 gathers a bf16 copy of them for each forward and backward and
        # reduces gradients into the fp32 shards (training.parallel).
        compute_dtype = torch.bfloat16 if use_bf16 else torch.float32
        enable_tf32(d.device)
        self.peak_flops = t.peak_flops or _peak_flops(d.device.type, d.device.index, compute_dtype)
        # MFU is printed only against a peak that can be trusted: a datasheet's, or the one the config gives
        self.peak_flops_source = "train.peak_flops" if t.peak_flops else peak_flops_source(d.device, compute_dtype)

        self.data: PreparedData = prepare_data(
            run.data, run.model.vocab_size, is_main=d.is_main, share=d.broadcast_object, global_batch=t.global_batch
        )
        self.compute_dtype = compute_dtype if use_bf16 else None  # None: fp32, no autocast
        self.model = self._build_model(self.compute_dtype)
        self.optimizer = build_optimizer(self.model, run.optim, self.model.base_shapes())
        self.sampler = self.data.sampler(self.seq_len, t.seed)  # a mixture's sampler draws by the weights
        if self.sampler.num_sequences < t.global_batch:
            raise ConfigError(
                f"data.source: only {self.sampler.num_sequences} sequences of data.seq_len="
                f"{self.seq_len}, fewer than train.global_batch={t.global_batch}"
            )
        self.flops_per_token = self.model.flops_per_token(self.seq_len)
        self.step, self.tokens, self.wall_seconds_before = 0, 0, 0.0
        self.skipped_steps = 0  # updates not applied: a callback's veto, or a non-finite loss or gradient
        self.rollbacks: list[dict] = []  # checkpoints restored mid-run (spike rollbacks), for summary.json
        self.last_lr = math.nan
        self.last_batch, self.last_step_tokens, self.last_step_seconds, self.post_step_seconds = 0, 0, 0.0, 0.0
        # A non-finite step's update is skipped on the device by the fused optimizer (found_inf), so no step waits
        # for a host read to decide it; where the optimizer cannot, or ranks must agree on a Ctrl-C, each step's
        # figures are read before its update, as they always were.
        self.skips_on_device = d.world == 1 and getattr(self.optimizer, "takes_found_inf", False)
        self.reads_every_step = not self.skips_on_device
        self.figures = StepFigures()  # each step's loss and grad norm, on their way to the callbacks
        self.ctrl_c = CtrlC()
        # train.cuda_graphs: each step replayed from CUDA graphs (training.graphs), where setup.auto turned them on
        self.graphs = StepGraphs(self) if self.choices.cuda_graphs.on else None
        if self.choices.cuda_graphs.why:
            self.say(f"train.cuda_graphs=auto: {self.choices.cuda_graphs.why}")

    def _build_model(self, param_dtype) -> Transformer:
        """The model made ready for the world size (training.parallel), its weights initialised once on rank 0
        (and broadcast), so every world size starts from the same numbers. Sharded, it is built on the meta device
        and gets its storage after fully_shard; at world size 1 it is built where it trains (to_empty from meta
        would untie the tied head: each module's weight would get storage of its own)."""
        run, d = self.run, self.dist
        with torch.device(d.device if d.world == 1 else "meta"):
            model = Transformer(run.model, max_seq_len=self.seq_len)
        run_flops = model.flops_per_token(self.seq_len) * sum(self.batch_plan) * self.seq_len
        seconds_at_peak = run_flops / (self.peak_flops * d.world)  # per device
        self.choices = auto.for_run(run, d.device, seconds_at_peak, cuda_graphs_refusal(run, d.device, d.world))
        self.compiled = self.choices.compile.on
        if self.choices.compile.why:
            self.say(f"train.compile=auto: {self.choices.compile.why}")
        self.loss_rows = largest_pass(self.batch_plan, d.world, run.train.micro_batch) * self.seq_len  # a pass's
        model.loss_chunks = loss_chunks_for(run, d.device, self.loss_rows, self.compiled and d.world == 1)
        parallelize(model, d, param_dtype=param_dtype, compile_model=self.compiled, float8=run.train.float8)
        if d.world > 1:
            model.to_empty(device=d.device)
        full_state = {}
        if d.is_main:
            reference = Transformer(run.model, max_seq_len=self.seq_len)
            reference.init_weights(torch.Generator().manual_seed(run.train.seed))
            full_state = reference.state_dict()
        if d.world == 1:
            model.load_state_dict(full_state)
        else:
            set_model_state_dict(
                model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            )
        model.reset_buffers()
        return model

    # -- what callbacks call -----------------------------------------------------------------------------------

    def stacked_loss_chunks(self, members: int) -> int | None:
        """The loss's chunk count for a stack of `members` runs of this one's shape (training.stack): on a GPU sized
        for every member's chunk at once, from the free memory now; elsewhere this run's own (the CPU's count keeps
        each member's chunks those of its lone run, bit for bit)."""
        if self.dist.device.type != "cuda":
            return self.model.loss_chunks
        return loss_chunks_for(self.run, self.dist.device, self.loss_rows, self.compiled, members=members)

    def log(self, fields: dict, *, tensorboard_only: bool = False, at: StepValues | None = None) -> None:
        """Metrics of this step (or of the earlier step `at`): a metrics.jsonl line and TensorBoard scalars (rank 0)."""
        step, tokens = (at.step, at.tokens) if at is not None else (self.step, self.tokens)
        self.channel.log(step, tokens, fields, tensorboard_only=tensorboard_only)

    def say(self, text: str) -> None:
        """A console line, prefixed with the run's name (rank 0)."""
        self.channel.print(text)

    def data_counts(self) -> dict:
        """Tokens seen per data source, for mixtures ({} for a single source)."""
        return {f"data/tokens/{name}": n for name, n in self.sampler.tokens_per_source().items()}

    # -- the step ----------------------------------------------------------------------------------------------

    def train_step(self) -> None:
        """One optimizer step. Nothing here waits for the device unless something needs this step's figures
        before its update (a callback's verdict that reads them, ranks agreeing on a Ctrl-C, an optimizer that
        cannot skip a non-finite update on the device); they reach the host later, in batches (`settle`)."""
        start = time.perf_counter()
        batch = self.batch_plan[self.step]
        lr = self.set_step_lr(batch)
        if self.graphs is not None and self.graphs.ready(batch):
            self.graphs.train_step(batch, lr, start)  # the same step, replayed from CUDA graphs
            return
        self.finish_step(self.forward_backward(batch), batch, lr, start)
        if self.graphs is not None:
            self.graphs.saw_eager_step(batch)

    def set_step_lr(self, batch: int) -> float:
        """This step's learning rate (schedule x batch scaling) set on the optimizer, and returned."""
        lr = self.run.optim.lr * lr_factor(self.step, self.max_steps, self.run.schedule)
        lr *= lr_batch_scale(batch, self.run.train)
        set_lr(self.optimizer, lr)
        return lr

    def finish_step(self, loss_sum: torch.Tensor, batch: int, lr: float, start: float) -> None:
        """The step after its forward and backward (gradients on the parameters, loss_sum on the device): the
        verdict, the update where it is taken, the rest. A stack (training.stack) calls the three parts itself."""
        decided = self.decide_update(loss_sum, batch, lr)
        if decided is None:
            return  # rolled back: this step never happened
        if decided.take:
            self.optimizer.step()
        self.complete_step(decided, batch, start)

    def decide_update(self, loss_sum: torch.Tensor, batch: int, lr: float) -> PendingStep | None:
        """Clipping by this run's own norm, the figures staged, the callbacks' verdict: the step's PendingStep, its
        `take` set where the update is to be taken; None where the run rolled back. Raises Divergence on a verdict
        to stop, KeyboardInterrupt on a Ctrl-C (before any update)."""
        return self.judge(self.stage_figures(loss_sum, self.clip_gradients(), batch), batch, lr)

    def clip_gradients(self) -> torch.Tensor:
        """The gradients clipped by this run's own norm (optim.grad_clip); their norm before, on the device."""
        max_norm = self.run.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm

    def judge(self, pending: PendingStep, batch: int, lr: float) -> PendingStep | None:
        """decide_update once the step's figures are staged: the callbacks' verdict (see decide_update)."""
        d = self.dist
        if self.reads_every_step:
            self.figures.read()
        if pending.stop or (d.world == 1 and self.ctrl_c.requested):
            self.figures.drop_newest()
            raise KeyboardInterrupt  # before the update: this step never happened
        self.last_lr, self.last_batch = lr, batch
        verdict = self.callbacks_verdict()
        if verdict.action == "take" and not self.skips_on_device and not pending.values.finite:
            verdict = Verdict("skip", "non-finite loss or gradient")  # the weights never see it
        if verdict.action == "stop":  # the run ends as diverged (ablate.training.run records it)
            raise Divergence(f"{self.run.name}: {verdict.reason}")
        if verdict.action == "rollback":  # this step never happened
            self.figures.drop_newest()
            self.settle()
            self.roll_back(verdict.reason)
            self.optimizer.zero_grad(set_to_none=True)
            return None
        pending.take = verdict.action == "take"
        if pending.take and self.skips_on_device:  # fused AdamW leaves weights, moments and step as they are
            self.optimizer.found_inf = pending.nonfinite  # where it is 1
        return pending

    def complete_step(self, pending: PendingStep, batch: int, start: float, step_seconds: float | None = None) -> None:
        """After the update (or its skip): the counters and the callbacks. `step_seconds`: a stack's (every
        member's step takes the whole stack's); else the time since `start`."""
        if not pending.take:  # skip the batch rather than poison the weights
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.last_step_tokens = batch * self.seq_len
        self.tokens += self.last_step_tokens
        pending.over = True
        self.last_step_seconds = step_seconds if step_seconds is not None else time.perf_counter() - start
        if pending.values is not None or self.step == self.max_steps or any(c.acts_at(self) for c in self.callbacks):
            self.settle()
        callbacks_start = time.perf_counter()
        for callback in self.callbacks:
            callback.post_step(self)
        self.post_step_seconds = time.perf_counter() - callbacks_start  # validation, checkpoints: not the step

    def forward_backward(self, batch: int) -> torch.Tensor:
        """This rank's passes of the step's `batch` sequences, forward and backward; the sum of their
        cross-entropies (each pass weighted by its share), on the device."""
        return self.accumulate(self.passes(batch))

    def accumulate(self, passes) -> torch.Tensor:
        """Forward and backward of each of `passes` ((inputs, targets, doc_ids or None), share), the gradients
        summed on the parameters; the sum of their cross-entropies (each divided by its share), on the device."""
        loss_sum = None
        for (inputs, targets, doc_ids), share in passes:
            loss, ce = self.model.loss(inputs, targets, doc_ids)
            if share != 1:  # share: see rank_micro_batches. A step's one pass is not divided (x / 1 is x, in 2 ops)
                loss, ce = loss / share, ce / share
            loss.backward()
            loss_sum = ce.float() if loss_sum is None else loss_sum + ce  # 0 + x is x: no zeros to start from
        return loss_sum if loss_sum is not None else torch.zeros((), device=self.dist.device)

    def passes(self, batch: int):
        """This rank's passes of the step's `batch` sequences from the run's own sampler: ((inputs, targets,
        doc_ids or None), share) each, on the device."""
        d = self.dist
        on_gpu = d.device.type == "cuda"
        for parts, share in self.host_passes(batch):
            # pinned, the copies to a GPU run while the host goes on (a pageable non_blocking copy still waits)
            yield (
                [
                    (x.pin_memory() if on_gpu else x).to(d.device, non_blocking=True) if x is not None else None
                    for x in parts
                ],
                share,
            )

    def host_passes(self, batch: int):
        """passes(batch) before their copy to the device: on the host, doc_ids None without data.doc_mask."""
        t, d = self.run.train, self.dist
        passes = rank_micro_batches(
            self.sampler.take(batch),
            d.world,
            d.rank,
            t.micro_batch,
            lambda part: self.data.train.batch(part, self.seq_len),
        )
        doc_mask = self.run.data.doc_mask
        for (inputs, targets, doc_ids), share in passes:
            yield [inputs, targets, doc_ids if doc_mask else None], share

    def stage_figures(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor, batch: int) -> PendingStep:
        """This step's figures, left on the device: the loss over ranks (in float64, as it always was) and the grad
        norm. Above world size 1 the loss's all-reduce also carries a Ctrl-C, so every rank stops at the same step
        (see CtrlC)."""
        d, stop = self.dist, None
        if d.world > 1:
            flag = torch.tensor(float(self.ctrl_c.requested), dtype=torch.float64, device=d.device)
            summed = d.sum_tensor(torch.stack([loss_sum.double(), flag]))
            loss, stop = summed[0] / d.world, summed[1]
        else:
            loss = loss_sum.double()
        return self.figures.stage(self.step + 1, self.tokens + batch * self.seq_len, loss, grad_norm, stop)

    def settle(self) -> None:
        """Every finished step's figures to the callbacks' step_values, in step order (read first if need be);
        non-finite steps the device skipped are counted here. A callback that raises (the non-finite guard's
        Divergence) leaves the steps after the one it raised on undelivered."""
        for pending in self.figures.finished():
            if pending.take and not pending.values.finite:
                self.skipped_steps += 1  # skipped on the device (found_inf)
            for callback in self.callbacks:
                callback.step_values(self, pending.values)

    @property
    def last_loss(self) -> float:
        """This step's training loss, averaged over ranks (reading it waits for the device)."""
        self.figures.read()
        return self.figures.last.loss

    @property
    def last_grad_norm(self) -> float:
        """This step's gradient norm before clipping (reading it waits for the device)."""
        self.figures.read()
        return self.figures.last.grad_norm

    def callbacks_verdict(self) -> Verdict:
        """Every callback's verdict on this step's update (each is asked, none skipped because another objected:
        each keeps its own count), combined: the strongest wins (stop, rollback, skip, take), the first of equals."""
        verdicts = []
        for callback in self.callbacks:
            verdict = callback.before_update(self)
            if verdict is None:
                verdict = TAKE
            if not isinstance(verdict, Verdict):
                raise TypeError(
                    f"{callback.name}: before_update returned {verdict!r}; allowed: a "
                    f"ablate.training.callbacks.Verdict (or None: take the update)"
                )
            verdicts.append(verdict)
        return max(verdicts, key=lambda v: v.strength, default=TAKE)

    # -- checkpoints -------------------------------------------------------------------------------------------

    def resume_state(self) -> dict:
        """What a checkpoint stores beside model/optimizer/RNG: small, and the same on every rank."""
        return {
            "tokens": self.tokens,
            "sampler": self.sampler.state_dict(),
            "skipped_steps": self.skipped_steps,
            "wall_seconds": self.wall_seconds_before + time.perf_counter() - self.start_time,
            "last_loss": self.last_loss,
            "rollbacks": self.rollbacks,
            "callbacks": {c.name: c.state_dict() for c in self.callbacks},
        }

    def restore(self, ckpt: Path, keep_data_position: bool = False) -> dict:
        """Continue from `ckpt` (model, optimizer, step, counters, callbacks' states; with keep_data_position,
        the sampler stays where it is: a rollback skips the data it had read since). Raises
        DamagedCheckpointError when the checkpoint's own files are not whole (resume then tries an older
        one), CallbackStateError when a callback cannot take its state back (the run fails; nothing is set aside)."""
        meta = checkpoint.load_checkpoint(ckpt, self.model, self.optimizer, self.dist)
        if self.graphs is not None:
            self.graphs.forget()  # the optimizer's state may be new tensors, which no graph reads
        try:
            self.step, self.tokens = meta["step"], meta["tokens"]
            if not keep_data_position:
                try:
                    self.sampler.load_state_dict(meta["sampler"])
                except ValueError as exc:  # a state of other sources: the config changed, the checkpoint is fine
                    raise ConfigError(
                        f"data.source: {exc}; {ckpt} was written for other data sources "
                        f"(a branch may change the weights of its parent's sources, not the sources)"
                    ) from None
                self.skipped_steps, self.rollbacks = meta["skipped_steps"], list(meta.get("rollbacks", []))
                self.wall_seconds_before = meta["wall_seconds"]
                self.figures.restored(self.step, self.tokens, meta["last_loss"])
                states = meta.get("callbacks") or _callback_states_before_callbacks(meta)
                if not isinstance(states, dict):
                    raise TypeError(f"callbacks is a {type(states).__name__}, not a mapping")
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:  # a meta.json that parses but is not whole
            raise checkpoint_files.DamagedCheckpointError(
                ckpt, f"{checkpoint_files.META}: {type(exc).__name__}: {exc}"
            ) from None
        if not keep_data_position:
            # outside the damage check: a callback that cannot read its state is a bug in the callback, and
            # setting the run's checkpoints aside one by one for it would lose them all
            for callback in self.callbacks:
                try:
                    callback.load_state_dict(states.get(callback.name, {}))
                except Exception as exc:
                    raise CallbackStateError(callback.name, ckpt, exc) from exc
        return meta

    def roll_back(self, reason: str) -> Path:
        """Restore the newest checkpoint's weights, optimizer and step, keeping the data position: the batches
        read since (the offending one among them) are skipped, as PaLM did for loss spikes. Logs from the
        abandoned steps are dropped; callbacks start again from the restored step (pre_train)."""
        ckpt = checkpoint_files.latest_checkpoint(rundir.checkpoint_root(self.run_dir))
        if ckpt is None:
            raise Divergence(f"{self.run.name}: {reason}, and no checkpoint to roll back to yet")
        from_step = self.step
        self.restore(ckpt, keep_data_position=True)
        self.rollbacks.append({"from_step": from_step, "to_step": self.step, "reason": reason})
        self.say(f"rolled back from step {from_step} to step {self.step} ({reason}); the batches between are skipped")
        self.channel.truncate(self.step)
        for callback in self.callbacks:
            callback.pre_train(self)
        return ckpt

    # -- the loop ----------------------------------------------------------------------------------------------

    def fit(self) -> dict:
        seed_everything(self.run.train.seed + self.dist.rank)  # a checkpoint of the same world size restores RNG
        self.start()
        try:
            with self.ctrl_c:
                self.begin()
                while self.step < self.max_steps:
                    self.train_step()
                for callback in self.callbacks:
                    callback.post_train(self)
        finally:
            self.end()
        return self.summary()

    def start(self) -> None:
        """Where training starts: the newest intact checkpoint restored (damaged ones set aside, half-written ones
        cleaned), else a branch's start, else step 0; the metrics channel opened at that step."""
        self.start_time = time.perf_counter()
        ckpt_root = rundir.checkpoint_root(self.run_dir)
        checkpoint.clean_partial(ckpt_root, self.dist)
        latest = checkpoint.restore_newest_intact(ckpt_root, self.restore, self.dist)  # damaged ones set aside
        if latest is None and self.run.branch:
            latest = self.start_branch()
        if latest is not None:
            self.say(f"{'resumed' if latest.parent == ckpt_root else 'branched'} from {latest} (step {self.step})")
        self.channel.open(self.step)

    def begin(self) -> None:
        """Training starts (or restarts) at self.step: each callback's pre_train, the model in training mode. fit
        calls it once its checkpoint is restored and its metrics channel open (so may a benchmark that steps the
        trainer itself)."""
        for callback in self.callbacks:
            callback.pre_train(self)
        self.model.train()

    def end(self) -> None:
        """Training is over, finished or not: each callback's close, then the metrics channel's."""
        for callback in self.callbacks:
            callback.close()
        self.channel.close()

    def start_branch(self) -> Path:
        """A branch's first start: the parent's checkpoint at the branch step (weights, optimizer, data position,
        step), and the parent's logs up to there, so the branch's curves begin where the parent's were."""
        parent_dir, step = rundir.sibling_run_dir(self.run_dir, self.run.branch["parent"]), self.run.branch["step"]
        ckpt = rundir.checkpoint_root(parent_dir) / rundir.step_dir_name(step)
        if self.dist.is_main:
            for name in (rundir.METRICS, rundir.EVALS):
                if (parent_dir / name).exists():
                    rundir.rewrite_jsonl(
                        self.run_dir / name,
                        [row for row in rundir.read_jsonl(parent_dir / name) if row.get("step", 0) <= step],
                    )
        self.dist.barrier()
        self.restore(ckpt)
        return ckpt

    # -- summary.json ------------------------------------------------------------------------------------------

    def summary(self) -> dict:
        """The run's figures. Callbacks fill the places kept for theirs (final_val_loss: Validation;
        tokens_per_second and mfu: TrainMetrics) and add their own keys after (spikes, evals)."""
        figures = {
            "experiment": self.run.experiment,
            "variant": self.run.name,
            "seed": self.run.train.seed,
            "identity": self.run.identity(),
            "final_loss": self.last_loss,
            "final_val_loss": math.nan,
            "steps": self.step,
            "tokens": self.tokens,
            "params": self.model.num_params(),
            "params_active": self.model.num_params(active=True),  # with experts: those one token uses
            # the model's own count (attention included): a variant that changes FLOPs per token is compared in
            # FLOPs, never tokens (the report's compute multipliers)
            "flops_per_token": self.flops_per_token,
            "flops": self.flops_per_token * self.tokens,
            "kv_cache_bytes_per_token": self.model.kv_cache_bytes_per_token(),  # bf16, every layer: beside the loss
            "wall_seconds": self.wall_seconds_before + time.perf_counter() - self.start_time,
            "tokens_per_second": math.nan,
            "mfu": None,
            "peak_flops": self.peak_flops,
            "peak_flops_source": self.peak_flops_source,
            "device": device_name(self.dist.device),
            "device_type": self.dist.device.type,
            "skipped_steps": self.skipped_steps,
            "peak_memory_bytes": peak_memory_bytes(self.dist.device),
            "world_size": self.dist.world,
            "data": {**self.data.stats, **self._sources_seen()},
            **({"branch": self.run.branch} if self.run.branch else {}),
            **({"rollbacks": self.rollbacks} if self.rollbacks else {}),
        }
        for callback in self.callbacks:
            figures.update(callback.summary(self))  # a key already there keeps its place
        return figures

    def _sources_seen(self) -> dict:
        """A mixture's tokens drawn per source: {"drawn": {name: {weight, tokens, share, epochs}}} ({}: one source)."""
        drawn = self.sampler.source_stats()
        return {"drawn": drawn} if drawn else {}


def _callback_states_before_callbacks(meta: dict) -> dict:
    """The callbacks' states in a checkpoint written before callbacks kept their own (fields at the top)."""
    return {
        "train_metrics": {"throughput": meta.get("throughput", [])},
        "validation": {"last_val_loss": meta.get("last_val_loss", math.nan)},
        "non_finite_guard": {"in_a_row": meta.get("consecutive_skips", 0)},
    }
