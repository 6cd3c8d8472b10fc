"""The training loop: one readable function of a RunConfig, with callbacks (ablate.callbacks) for everything else.

runs/<experiment>/<variant>/seed<k>/ holds config.json, metrics.jsonl, tb/, checkpoints/step_N/ and, once
finished, summary.json (names from rundir). Calling train() again on the same folder resumes from the newest
complete checkpoint, or returns the summary of a finished run without redoing it.
"""
from __future__ import annotations

import contextlib
import math
import os
import platform
import shlex
import shutil
import time
import traceback
from functools import lru_cache
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from ablate import checkpoint, rundir
from ablate.batching import check_plan, largest_pass, lr_batch_scale, rank_passes, run_plan
from ablate.checks import check_registered_names, check_this_machine
from ablate.callbacks import Callback, Checkpointer, MetricsChannel, NonFiniteGuard, TrainMetrics, Validation, \
    peak_memory_bytes
from ablate.config import ConfigError, RunConfig, validate
from ablate.data import PreparedData, check_data_config, prepare_data
from ablate.model import Transformer
from ablate.optim import build_optimizer, lr_factor, set_lr
from ablate.parallel import Dist, init_distributed, mfu, parallelize, peak_flops_for, seed_everything
from ablate.rundir import run_dir_for
from ablate.stability import LossSpikes, StabilityMonitors


@lru_cache(maxsize=None)
def _peak_flops(device_type: str, index: int | None, dtype: torch.dtype) -> float:
    return peak_flops_for(torch.device(device_type, index), dtype)


def standard_callbacks(run: RunConfig) -> list[Callback]:
    """Every run's callbacks in their order, with the eval suite for runs that name tasks."""
    found: list[Callback] = [NonFiniteGuard(), LossSpikes(), StabilityMonitors(), Validation(), TrainMetrics(),
                             Checkpointer()]
    if run.eval.tasks.strip():  # lazily: runs without tasks never load the suite
        from ablate.eval_callback import EvalSuite

        found.append(EvalSuite())
    return sorted(found, key=lambda c: c.order)


class Trainer:
    def __init__(self, run: RunConfig, run_dir: Path, d: Dist, callbacks: list[Callback] | None = None):
        self.run, self.run_dir, self.dist = check_registered_names(validate(run)), run_dir, d
        t = run.train
        self.seq_len = run.data.seq_len
        self.batch_plan = run_plan(run)  # the global batch of every step (0 before a branch's start), known ahead
        check_plan(self.batch_plan, d.world, t)
        self.max_steps = len(self.batch_plan)
        self.callbacks = sorted(callbacks if callbacks is not None else standard_callbacks(run), key=lambda c: c.order)
        self.channel = MetricsChannel(run_dir, f"[{run.name} seed{t.seed}]", d.is_main)
        largest = largest_pass(self.batch_plan, d.world, t.micro_batch)
        if largest != t.micro_batch:  # micro_batch is the most a pass may take, not what it must
            self.say(f"world size {d.world}: each rank takes {t.global_batch // d.world} of a step's "
                     f"{t.global_batch} sequences, in passes of at most {largest} (train.micro_batch={t.micro_batch} "
                     f"is the most a pass may take; config.json: rank_micro_batch)")
        on_gpu = d.device.type == "cuda"
        use_bf16 = t.dtype == "bf16" or (t.dtype == "auto" and on_gpu)
        # GPU: FSDP2 casts parameters to bf16 for compute. CPU: autocast (FSDP2's cast is slower there).
        self.autocast = torch.autocast("cpu", dtype=torch.bfloat16) if use_bf16 and not on_gpu \
            else contextlib.nullcontext()
        compute_dtype = torch.bfloat16 if use_bf16 else torch.float32

        self.data: PreparedData = prepare_data(run.data, run.model.vocab_size, is_main=d.is_main,
                                                  share=d.broadcast_object, global_batch=t.global_batch)
        self.model = self._build_model(compute_dtype if on_gpu and use_bf16 else None)
        self.optimizer = build_optimizer(self.model, run.optim)
        self.sampler = self.data.sampler(self.seq_len, t.seed)  # a mixture's sampler draws by the weights
        if self.sampler.num_sequences < t.global_batch:
            raise ConfigError(f"data.source: only {self.sampler.num_sequences} sequences of data.seq_len="
                              f"{self.seq_len}, fewer than train.global_batch={t.global_batch}")
        self.flops_per_token = self.model.flops_per_token(self.seq_len)
        self.peak_flops = t.peak_flops or _peak_flops(d.device.type, d.device.index, compute_dtype)
        self.step, self.tokens, self.wall_seconds_before = 0, 0, 0.0
        self.skipped_steps = 0  # updates a callback vetoed (non-finite or spiking loss)
        self.rollbacks: list[dict] = []  # checkpoints restored mid-run (ablate.stability), for summary.json
        self.last_loss = self.last_lr = self.last_grad_norm = math.nan
        self.last_batch, self.last_step_tokens, self.last_step_seconds = 0, 0, 0.0

    def _build_model(self, param_dtype) -> Transformer:
        """Meta-device model -> FSDP2 -> real storage -> weights initialised once on rank 0 and broadcast, so every
        world size starts from the same numbers."""
        run, d = self.run, self.dist
        with torch.device("meta"):
            model = Transformer(run.model, max_seq_len=self.seq_len)
        parallelize(model, d, param_dtype=param_dtype, compile_model=run.train.compile, float8=run.train.float8)
        model.to_empty(device=d.device)
        full_state = {}
        if d.is_main:
            reference = Transformer(run.model, max_seq_len=self.seq_len)
            reference.init_weights(torch.Generator().manual_seed(run.train.seed))
            full_state = reference.state_dict()
        set_model_state_dict(model, full_state, options=StateDictOptions(full_state_dict=True,
                                                                        broadcast_from_rank0=True))
        model.reset_buffers()
        return model

    # -- the one channel callbacks report through --------------------------------------------------------------

    def log(self, fields: dict, *, tensorboard_only: bool = False) -> None:
        """Metrics of this step: a metrics.jsonl line and TensorBoard scalars (rank 0)."""
        self.channel.log(self.step, self.tokens, fields, tensorboard_only=tensorboard_only)

    def say(self, text: str) -> None:
        """A console line, prefixed with the run's name (rank 0)."""
        self.channel.print(text)

    def data_counts(self) -> dict:
        """Tokens seen per data source, for mixtures ({} for a single source)."""
        counts = getattr(self.sampler, "tokens_per_source", None)
        return {f"data/tokens/{name}": n for name, n in counts().items()} if callable(counts) else {}

    # -- checkpoints -------------------------------------------------------------------------------------------

    def resume_state(self) -> dict:
        """What a checkpoint stores beside model/optimizer/RNG: small, and the same on every rank."""
        return {"tokens": self.tokens, "sampler": self.sampler.state_dict(), "skipped_steps": self.skipped_steps,
                "wall_seconds": self.wall_seconds_before + time.perf_counter() - self.start_time,
                "last_loss": self.last_loss, "rollbacks": self.rollbacks,
                "callbacks": {c.name: c.state_dict() for c in self.callbacks}}

    def restore(self, ckpt: Path, keep_data_position: bool = False) -> dict:
        """Continue from `ckpt` (model, optimizer, step, counters, callbacks' states; with keep_data_position,
        the sampler stays where it is: a rollback skips the data it had read since). Raises
        checkpoint.DamagedCheckpointError (resume then tries an older one)."""
        meta = checkpoint.load_checkpoint(ckpt, self.model, self.optimizer, self.dist)
        try:
            self.step, self.tokens = meta["step"], meta["tokens"]
            if not keep_data_position:
                try:
                    self.sampler.load_state_dict(meta["sampler"])
                except ValueError as exc:  # a state of other sources: the config changed, the checkpoint is fine
                    raise ConfigError(f"data.source: {exc}; {ckpt} was written for other data sources "
                                      f"(a branch may change the weights of its parent's sources, not the sources)"
                                      ) from None
                self.skipped_steps, self.rollbacks = meta["skipped_steps"], list(meta.get("rollbacks", []))
                self.wall_seconds_before, self.last_loss = meta["wall_seconds"], meta["last_loss"]
                states = meta.get("callbacks") or _callback_states_before_callbacks(meta)
                for callback in self.callbacks:
                    callback.load_state_dict(states.get(callback.name, {}))
        except ConfigError:
            raise
        except (KeyError, TypeError, ValueError) as exc:  # a meta.json that parses but is not whole
            raise checkpoint.DamagedCheckpointError(ckpt, f"{checkpoint.META}: {type(exc).__name__}: {exc}") from None
        return meta

    def roll_back(self, reason: str) -> Path:
        """Restore the newest checkpoint's weights, optimizer and step, keeping the data position: the batches
        read since (the offending one among them) are skipped, as PaLM did for loss spikes. Logs from the
        abandoned steps are dropped."""
        ckpt = checkpoint.latest_checkpoint(rundir.checkpoint_root(self.run_dir))
        if ckpt is None:
            raise FloatingPointError(f"{self.run.name}: {reason}, and no checkpoint to roll back to yet")
        from_step = self.step
        self.restore(ckpt, keep_data_position=True)
        self.rollbacks.append({"from_step": from_step, "to_step": self.step, "reason": reason})
        self.say(f"rolled back from step {from_step} to step {self.step} ({reason}); the batches between are skipped")
        self._rolled_back = True
        self.channel.truncate(self.step)
        for callback in self.callbacks:
            callback.pre_train(self)
        return ckpt

    def _to_device(self, *tensors):
        return [x.to(self.dist.device, non_blocking=True) for x in tensors]

    # -- the loop ----------------------------------------------------------------------------------------------

    def train_step(self) -> None:
        t, d = self.run.train, self.dist
        start = time.perf_counter()
        batch = self.batch_plan[self.step]
        lr = self.run.optim.lr * lr_factor(self.step, self.max_steps, self.run.schedule) * lr_batch_scale(batch, t)
        set_lr(self.optimizer, lr)
        # Every rank reads the same global order and takes its own slice: ranks see different data, and the global
        # batch is the same at any world size.
        indices = self.sampler.take(batch)
        per_rank = batch // d.world
        mine = indices[d.rank * per_rank:(d.rank + 1) * per_rank]
        loss_sum, done = torch.zeros((), device=d.device), 0
        for size in rank_passes(batch, d.world, t.micro_batch):
            inputs, targets, doc_ids = self._to_device(*self.data.train.batch(mine[done:done + size], self.seq_len))
            done += size
            with self.autocast:
                loss, ce = self.model.loss(inputs, targets, doc_ids if self.run.data.doc_mask else None)
            # a pass's mean loss weighs by its share of the rank's sequences: the sum is their mean (k equal passes:
            # divided by k), and ranks with equal shares average to the step's mean, at any world size
            share = per_rank / size
            (loss / share).backward()
            loss_sum += ce / share
        max_norm = self.run.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        self.last_loss = d.mean(loss_sum.item())
        self.last_grad_norm, self.last_lr, self.last_batch = grad_norm.item(), lr, batch
        self._rolled_back = False
        # every callback is asked (none is skipped because another vetoed): each keeps its own count
        verdicts = [callback.before_update(self) for callback in self.callbacks]
        if self._rolled_back:  # a callback restored a checkpoint: this step never happened
            self.optimizer.zero_grad(set_to_none=True)
            return
        if all(verdicts):
            self.optimizer.step()
        else:  # skip the batch rather than poison the weights
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.last_step_tokens = batch * self.seq_len
        self.tokens += self.last_step_tokens
        self.last_step_seconds = time.perf_counter() - start
        for callback in self.callbacks:
            callback.post_step(self)

    @torch.no_grad()
    def validation_losses(self) -> dict[int, float]:
        """Loss of each of a fixed set of held-out sequences ({sequence index: mean token loss}), split over ranks
        for the forward passes and gathered on every rank. Every rank runs the same number of forward passes, as
        FSDP2 needs."""
        t, d = self.run.train, self.dist
        indices = [int(i) for i in self.data.val_indices(self.run.data.val_sequences, self.seq_len)]
        count, mine = len(indices), indices[d.rank::d.world]
        passes = -(-count // (t.micro_batch * d.world))
        losses = {}
        self.model.eval()
        for k in range(passes):
            part = mine[k * t.micro_batch:(k + 1) * t.micro_batch]
            chunk = part or [0]  # a rank with nothing left still runs a forward, on item 0, and keeps nothing
            inputs, targets, doc_ids = self._to_device(*self.data.val.batch(chunk, self.seq_len))
            with self.autocast:  # a chunk of logits at a time: a 50k vocabulary never is whole
                per_token = self.model.per_token_loss(inputs, targets, doc_ids if self.run.data.doc_mask else None)
            losses.update(zip(part, per_token.mean(dim=1).tolist()))
        self.model.train()
        gathered = [None] * d.world
        torch.distributed.all_gather_object(gathered, losses)
        return {i: loss for part in gathered for i, loss in part.items()}

    def fit(self) -> dict:
        self.start_time = time.perf_counter()
        seed_everything(self.run.train.seed + self.dist.rank)  # a checkpoint of the same world size restores RNG
        ckpt_root = rundir.checkpoint_root(self.run_dir)
        checkpoint.clean_partial(ckpt_root, self.dist)
        latest = checkpoint.restore_newest_intact(ckpt_root, self.restore, self.dist)  # damaged ones set aside
        if latest is None and self.run.branch:
            latest = self.start_branch()
        if latest is not None:
            self.say(f"{'resumed' if latest.parent == ckpt_root else 'branched'} from {latest} (step {self.step})")
        self.channel.open(self.step)
        try:
            for callback in self.callbacks:
                callback.pre_train(self)
            self.model.train()
            while self.step < self.max_steps:
                self.train_step()
            for callback in self.callbacks:
                callback.post_train(self)
        finally:
            for callback in self.callbacks:
                callback.close()
            self.channel.close()
        return self.summary()

    def start_branch(self) -> Path:
        """A branch's first start: the parent's checkpoint at the branch step (weights, optimizer, data position,
        step), and the parent's logs up to there, so the branch's curves begin where the parent's were."""
        parent_dir, step = rundir.sibling_run_dir(self.run_dir, self.run.branch["parent"]), self.run.branch["step"]
        ckpt = rundir.checkpoint_root(parent_dir) / rundir.step_dir_name(step)
        if self.dist.is_main:
            for name in (rundir.METRICS, rundir.EVALS):
                if (parent_dir / name).exists():
                    rundir.rewrite_jsonl(self.run_dir / name, [row for row in rundir.read_jsonl(parent_dir / name)
                                                               if row.get("step", 0) <= step])
        self.dist.barrier()
        self.restore(ckpt)
        return ckpt

    def summary(self) -> dict:
        wall = self.wall_seconds_before + time.perf_counter() - self.start_time
        extra = {k: v for c in self.callbacks for k, v in c.summary().items()}
        throughput = extra.pop("throughput", [])
        tokens_per_second = sum(throughput) / len(throughput) if throughput else math.nan
        return {"experiment": self.run.experiment, "variant": self.run.name, "seed": self.run.train.seed,
                "identity": self.run.identity(), "final_loss": self.last_loss,
                "final_val_loss": extra.pop("final_val_loss", math.nan),
                "steps": self.step, "tokens": self.tokens, "params": self.model.num_params(),
                "wall_seconds": wall, "tokens_per_second": tokens_per_second,
                "mfu": mfu(tokens_per_second / self.dist.world, self.flops_per_token, self.peak_flops),
                "peak_flops": self.peak_flops, "skipped_steps": self.skipped_steps,
                "peak_memory_bytes": peak_memory_bytes(self.dist.device), "world_size": self.dist.world,
                "data": {**self.data.stats, **self._sources_seen()},
                **({"branch": self.run.branch} if self.run.branch else {}),
                **({"rollbacks": self.rollbacks} if self.rollbacks else {}), **extra}


    def _sources_seen(self) -> dict:
        """A mixture's tokens drawn per source: {"drawn": {name: {weight, tokens, share, epochs}}}."""
        stats = getattr(self.sampler, "source_stats", None)
        return {"drawn": stats()} if callable(stats) else {}


def _callback_states_before_callbacks(meta: dict) -> dict:
    """The callbacks' states in a checkpoint written before callbacks kept their own (fields at the top)."""
    return {"train_metrics": {"throughput": meta.get("throughput", [])},
            "validation": {"last_val_loss": meta.get("last_val_loss", math.nan)},
            "non_finite_guard": {"in_a_row": meta.get("consecutive_skips", 0)}}


def _open_run_folder(run: RunConfig, run_dir: Path, world: int, lock: rundir.RunLock) -> tuple[str, object]:
    """On rank 0: take the run's lock and decide what to do with its folder. Returns ("train", None), or
    ("finished", summary), ("locked" | "diverged" | "refused", message)."""
    if not lock.acquire():
        return "locked", f"{run_dir}: skipped, being trained by {lock.holder()}"
    config_path = run_dir / rundir.CONFIG
    if config_path.exists():
        held = rundir.read_json(config_path)
        # a folder with no progress (a run that failed before its first checkpoint) never blocks a corrected rerun
        if held.get("identity") != run.identity() and _has_progress(run_dir):
            return "refused", (f"{run_dir}: holds a run of a different config (identity {held.get('identity')} vs "
                               f"{run.identity()}); pass another --out or remove the folder")
    status = rundir.read_status(run_dir) or {}
    if (run_dir / rundir.SUMMARY).exists():
        try:
            return "finished", rundir.read_json(run_dir / rundir.SUMMARY)
        except rundir.RunFolderError as exc:  # resuming from the final checkpoint writes it again
            aside = rundir.set_aside(run_dir / rundir.SUMMARY)
            rundir.warn(f"{exc}; set aside as {aside.name}, resuming to write it again")
    if status.get("state") == "diverged":
        return "diverged", (f"{run_dir}: diverged at step {status.get('step')} on an earlier attempt "
                            f"({status.get('message')}); not retried: remove the folder to train it again")
    if run.branch and not _has_progress(run_dir):
        refusal = _wait_for_parent(run, run_dir)
        if refusal:
            return "refused", refusal
    plan = run_plan(run)
    steps = len(plan)  # what max_steps was before batch schedules
    rundir.write_json_atomic(config_path, {"identity": run.identity(), "world_size": world, "steps": steps,
                                           "rank_micro_batch": largest_pass(plan, world, run.train.micro_batch),
                                           "torch": torch.__version__, "python": platform.python_version(),
                                           "config": run.to_dict()})
    attempts = status.get("attempts", 0) + 1
    rundir.write_status(run_dir, "running", step=0, max_steps=steps, attempts=attempts,
                        log=rundir.log_path(), message="")
    return "train", None


def _wait_for_parent(run: RunConfig, run_dir: Path, poll_seconds: float = 2.0, start_grace: float = 120.0) -> str:
    """A branch starts from its parent's checkpoint at the branch step: wait while the parent is being trained
    (or queued to start within `start_grace` seconds); '' when the checkpoint is there, else why not."""
    parent, step = run.branch["parent"], run.branch["step"]
    parent_dir = rundir.sibling_run_dir(run_dir, parent)
    ckpt = rundir.checkpoint_root(parent_dir) / rundir.step_dir_name(step)
    waited, told = 0.0, False
    while not (ckpt / rundir.CKPT_META).is_file():
        state = (rundir.read_status(parent_dir) or {}).get("state", "not started")
        if not rundir.RunLock(parent_dir).held_by_live_process() and (state != "pending" or waited > start_grace):
            return (f"{run_dir}: a branch of {parent!r} at step {step}, but {parent_dir} has no checkpoint at step "
                    f"{step} (parent {state}); train the parent first with the same experiment file (it keeps "
                    f"that checkpoint), e.g. ablate run FILE --only {parent}")
        if not told:
            print(f"[{run.name} seed{run.train.seed}] waiting for {parent!r} to reach step {step}", flush=True)
            told = True
        time.sleep(poll_seconds)
        waited += poll_seconds
    held = rundir.read_json(parent_dir / rundir.CONFIG).get("identity")
    if held != run.branch.get("parent_identity"):
        return (f"{run_dir}: a branch of {parent!r}, whose folder {parent_dir} holds another config (identity {held}, "
                f"the experiment's parent is {run.branch.get('parent_identity')}); retrain the parent or pass --out")
    return ""


def _decide(run: RunConfig, run_dir: Path, world: int, lock: rundir.RunLock) -> tuple[str, object]:
    try:  # every rank must hear rank 0's verdict, even when a file cannot be read
        return _open_run_folder(run, run_dir, world, lock)
    except rundir.RunFolderError as exc:
        return "refused", str(exc)


def finished_note(run: RunConfig, run_dir: Path, summary: dict) -> str:
    """What to tell of a run found finished: it is not trained again, nor are its in-training evals redone; the
    command that scores the eval.tasks it was not scored on at its last step (ablate.sweep says it)."""
    note = f"already finished ({run_dir / rundir.SUMMARY}); not trained again"
    from ablate.eval.suite import parse_tasks

    wanted = parse_tasks(run.eval.tasks, "eval.tasks") if run.eval.tasks.strip() else []  # suites expanded
    scored = {r.get("task") for r in rundir.read_jsonl(run_dir / rundir.EVALS)
              if r.get("step") == summary.get("steps") and r.get("format") == run.eval.format}
    missing = [t for t in wanted if t not in scored]
    if not missing:
        return note
    if not rundir.checkpoint_steps(run_dir):
        return f"{note}; eval.tasks {','.join(missing)} were not scored, and it keeps no checkpoint to score"
    command = (f"ablate eval {shlex.quote(str(run_dir))} --tasks {','.join(missing)} --format {run.eval.format} "
               f"--limit {run.eval.limit}")
    return f"{note}; eval.tasks {','.join(missing)} were not scored at its last step: score them with {command}"


def _has_progress(run_dir: Path) -> bool:
    return (run_dir / rundir.SUMMARY).exists() or bool(rundir.checkpoint_steps(run_dir)) or \
        bool(rundir.read_jsonl(run_dir / rundir.METRICS))


def _record_failure(run_dir: Path, trainer: Trainer | None, exc: BaseException) -> None:
    """status.json (and error.txt with the traceback) for a run that stopped; rank 0 only."""
    step = trainer.step if trainer is not None else 0
    skipped = {"skipped_steps": trainer.skipped_steps} if trainer is not None else {}
    message = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Ctrl-C, or a launcher's requeue (submitit exits)
        resume = (rundir.checkpoint_steps(run_dir) or [0])[-1]
        rundir.write_status(run_dir, "interrupted", step=step, resume_step=resume,
                            message=f"interrupted at step {step}; rerun the same command to resume from step {resume}")
        return
    if isinstance(exc, FloatingPointError):  # NonFiniteGuard: a final state, reported instead of resumed
        rundir.write_status(run_dir, "diverged", step=step, message=str(exc), **skipped)
        return
    (run_dir / rundir.ERROR).write_text(traceback.format_exc())
    rundir.write_status(run_dir, "failed", step=step, message=message, error_file=str(run_dir / rundir.ERROR),
                        **skipped)


def train(run: RunConfig, out_root: str | Path = "runs") -> dict:
    """Train one run (resuming if its folder has a checkpoint); return its summary. Rank 0 holds the run's lock
    and writes the files. Raises RunLocked when another live process trains the run, RunDiverged when it diverged
    (now or on an earlier attempt); any other failure is recorded in status.json and error.txt, then raised."""
    check_registered_names(run)  # before a run folder or any data exists
    check_data_config(run.data, run.model.vocab_size)
    d = init_distributed(run.train.device)
    check_this_machine(run, d.world)
    run_dir = run_dir_for(out_root, run)
    lock = rundir.RunLock(run_dir)
    trainer = None
    try:
        decision, detail = d.broadcast_object(_decide(run, run_dir, d.world, lock) if d.is_main else None)
        if decision == "finished":
            return detail
        if decision != "train":
            raise {"locked": rundir.RunLocked, "diverged": rundir.RunDiverged, "refused": ConfigError}[decision](detail)
        try:
            trainer = Trainer(run, run_dir, d)
            if d.is_main:  # the run folder carries its tokenizer, so eval and export need nothing from the data cache
                shutil.copyfile(trainer.data.tokenizer_path, run_dir / rundir.TOKENIZER)
            summary = trainer.fit()
        except BaseException as exc:
            if d.is_main:
                _record_failure(run_dir, trainer, exc)
            if isinstance(exc, FloatingPointError):
                raise rundir.RunDiverged(f"{run_dir}: {exc}") from None
            raise
        if d.is_main:
            rundir.write_json_atomic(run_dir / rundir.SUMMARY, summary)
            rundir.write_status(run_dir, "finished", step=summary["steps"], message="",
                                skipped_steps=summary["skipped_steps"])
        d.barrier()
        return summary
    finally:
        lock.release()
