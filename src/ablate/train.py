"""The training loop: one readable function of a RunConfig, with hooks for everything else.

runs/<experiment>/<variant>/seed<k>/ holds config.json, metrics.jsonl, tb/, checkpoints/step_N/ and, once
finished, summary.json (names from rundir). Calling train() again on the same folder resumes from the newest
complete checkpoint, or returns the summary of a finished run without redoing it.
"""
from __future__ import annotations

import contextlib
import math
import platform
import shutil
import time
import traceback
from functools import lru_cache
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from ablate import checkpoint, hooks, rundir
from ablate.config import ConfigError, RunConfig, validate
from ablate.data import PreparedData, SequenceSampler, check_data_config, prepare_data
from ablate.model import Transformer
from ablate.optim import build_optimizer, lr_factor, set_lr
from ablate.rundir import run_dir_for
from ablate.parallel import Dist, check_float8, mfu, init_distributed, parallelize, peak_flops_for, seed_everything


@lru_cache(maxsize=None)
def _peak_flops(device_type: str, index: int | None, dtype: torch.dtype) -> float:
    return peak_flops_for(torch.device(device_type, index), dtype)


def check_eval_tasks(run: RunConfig) -> RunConfig:
    """The names in eval.tasks, which config (importing nothing of ablate) cannot check: ConfigError if unknown."""
    if run.eval.tasks.strip():  # lazily: runs without tasks never load the suite
        from ablate.eval.suite import check_config_tasks

        check_config_tasks(run.eval.tasks)
    return run


class Trainer:
    def __init__(self, run: RunConfig, run_dir: Path, d: Dist):
        self.run, self.run_dir, self.dist = check_eval_tasks(validate(run)), run_dir, d
        t = run.train
        per_pass = t.micro_batch * d.world
        if t.global_batch % per_pass:
            raise ConfigError(f"train.global_batch: {t.global_batch} is not a multiple of train.micro_batch "
                              f"({t.micro_batch}) x world size ({d.world}); allowed: multiples of {per_pass}")
        self.accum_steps = t.global_batch // per_pass
        self.seq_len = run.data.seq_len
        self.max_steps = t.max_steps
        self.tokens_per_step = t.global_batch * self.seq_len
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
        self.sampler = SequenceSampler(self.data.train.num_sequences(self.seq_len), seed=t.seed)
        if self.sampler.num_sequences < t.global_batch:
            raise ConfigError(f"data.source: only {self.sampler.num_sequences} sequences of data.seq_len="
                              f"{self.seq_len}, fewer than train.global_batch={t.global_batch}")
        self.flops_per_token = self.model.flops_per_token(self.seq_len)
        self.peak_flops = t.peak_flops or _peak_flops(d.device.type, d.device.index, compute_dtype)
        self.step, self.tokens, self.wall_seconds_before = 0, 0, 0.0
        self.skipped_steps, self.consecutive_skips = 0, 0
        self.last_loss = self.last_lr = self.last_grad_norm = self.last_val_loss = math.nan
        self.pause_seconds = 0.0  # time spent in validation/checkpoints, left out of tokens/s
        self.throughput: list[float] = []
        self.final_evals: dict = {}  # the eval hook's results at the last step, for summary.json

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

    def resume_state(self) -> dict:
        """What a checkpoint stores beside model/optimizer/RNG: small, and the same on every rank."""
        return {"tokens": self.tokens, "sampler": self.sampler.state_dict(), "skipped_steps": self.skipped_steps,
                "consecutive_skips": self.consecutive_skips,  # the non-finite guard counts on across a resume
                "wall_seconds": self.wall_seconds_before + time.perf_counter() - self.start_time,
                # what summary.json reports, should the run be killed after its last checkpoint and resumed
                "last_loss": self.last_loss, "last_val_loss": self.last_val_loss, "throughput": self.throughput}

    def restore(self, ckpt: Path) -> None:
        """Continue from `ckpt`, or raise checkpoint.DamagedCheckpointError (resume then tries an older one)."""
        meta = checkpoint.load_checkpoint(ckpt, self.model, self.optimizer, self.dist)
        try:
            self.step, self.tokens = meta["step"], meta["tokens"]
            self.sampler.load_state_dict(meta["sampler"])
            self.skipped_steps, self.wall_seconds_before = meta["skipped_steps"], meta["wall_seconds"]
            self.last_loss, self.last_val_loss = meta["last_loss"], meta["last_val_loss"]
            self.throughput = list(meta["throughput"])
            self.consecutive_skips = meta.get("consecutive_skips", 0)  # absent in checkpoints from before it was kept
        except (KeyError, TypeError, ValueError) as exc:  # a meta.json that parses but is not whole
            raise checkpoint.DamagedCheckpointError(ckpt, f"{checkpoint.META}: {type(exc).__name__}: {exc}") from None

    def _to_device(self, *tensors):
        return [x.to(self.dist.device, non_blocking=True) for x in tensors]

    def train_step(self) -> None:
        t, d = self.run.train, self.dist
        lr = self.run.optim.lr * lr_factor(self.step, self.max_steps, self.run.schedule)
        set_lr(self.optimizer, lr)
        # Every rank reads the same global order and takes its own slice: ranks see different data, and the global
        # batch is the same at any world size.
        indices = self.sampler.take(t.global_batch)
        per_rank = t.global_batch // d.world
        mine = indices[d.rank * per_rank:(d.rank + 1) * per_rank]
        loss_sum = torch.zeros((), device=d.device)
        for k in range(self.accum_steps):
            inputs, targets, doc_ids = self._to_device(*self.data.train.batch(
                mine[k * t.micro_batch:(k + 1) * t.micro_batch], self.seq_len))
            with self.autocast:
                loss, ce = self.model.loss(inputs, targets, doc_ids if self.run.data.doc_mask else None)
            (loss / self.accum_steps).backward()
            loss_sum += ce
        max_norm = self.run.optim.grad_clip or math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        self.last_loss = d.mean(loss_sum.item() / self.accum_steps)
        self.last_grad_norm, self.last_lr = grad_norm.item(), lr
        if math.isfinite(self.last_loss) and math.isfinite(self.last_grad_norm):
            self.optimizer.step()
            self.consecutive_skips = 0
        else:  # skip the batch rather than poison the weights; NonFiniteGuard stops a run that keeps doing this
            self.skipped_steps += 1
            self.consecutive_skips += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += self.tokens_per_step

    @torch.no_grad()
    def validation_losses(self) -> dict[int, float]:
        """Loss of each of a fixed set of held-out sequences ({sequence index: mean token loss}), split over ranks
        for the forward passes and gathered on every rank. Every rank runs the same number of forward passes, as
        FSDP2 needs."""
        t, d = self.run.train, self.dist
        count = min(self.data.val.num_sequences(self.seq_len), self.run.data.val_sequences)
        mine = list(range(d.rank, count, d.world))
        passes = -(-count // (t.micro_batch * d.world))
        losses = {}
        self.model.eval()
        for k in range(passes):
            part = mine[k * t.micro_batch:(k + 1) * t.micro_batch]
            chunk = part or [0]  # a rank with nothing left still runs a forward, on item 0, and keeps nothing
            inputs, targets, doc_ids = self._to_device(*self.data.val.batch(chunk, self.seq_len))
            with self.autocast:  # a chunk of logits at a time: a 50k vocabulary never is whole
                per_token = self.model(inputs, doc_ids if self.run.data.doc_mask else None, targets=targets,
                                       per_token=True)
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
        if latest is not None:
            if self.dist.is_main:
                print(f"[{self.run.name} seed{self.run.train.seed}] resumed from {latest} (step {self.step})",
                      flush=True)
        logger = hooks.MetricsLogger(self.run_dir, self, start_step=self.step)
        run_hooks = [logger, hooks.Validation(logger), hooks.Checkpointer(ckpt_root), hooks.NonFiniteGuard()]
        if self.run.eval.tasks.strip():  # the cloze task suite, for experiments that opt in
            from ablate.eval_hook import EvalHook

            run_hooks.insert(2, EvalHook(self, logger, start_step=self.step))
        try:
            self.model.train()
            while self.step < self.max_steps:
                self.train_step()
                for hook in run_hooks:
                    hook.after_step(self)
            for hook in run_hooks:
                hook.at_end(self)
        finally:
            for hook in run_hooks:
                hook.close()
        return self.summary()

    def summary(self) -> dict:
        wall = self.wall_seconds_before + time.perf_counter() - self.start_time
        tokens_per_second = sum(self.throughput) / len(self.throughput) if self.throughput else math.nan
        return {"experiment": self.run.experiment, "variant": self.run.name, "seed": self.run.train.seed,
                "identity": self.run.identity(), "final_loss": self.last_loss, "final_val_loss": self.last_val_loss,
                "steps": self.step, "tokens": self.tokens, "params": self.model.num_params(),
                "wall_seconds": wall, "tokens_per_second": tokens_per_second,
                "mfu": mfu(tokens_per_second / self.dist.world, self.flops_per_token, self.peak_flops),
                "peak_flops": self.peak_flops, "skipped_steps": self.skipped_steps,
                "peak_memory_bytes": hooks.peak_memory_bytes(self.dist.device), "world_size": self.dist.world,
                "data": self.data.stats, **({"evals": self.final_evals} if self.final_evals else {})}


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
    rundir.write_json_atomic(config_path, {"identity": run.identity(), "world_size": world,
                                           "torch": torch.__version__, "python": platform.python_version(),
                                           "config": run.to_dict()})
    attempts = status.get("attempts", 0) + 1
    rundir.write_status(run_dir, "running", step=0, max_steps=run.train.max_steps, attempts=attempts,
                        log=rundir.log_path(), message="")
    return "train", None


def _decide(run: RunConfig, run_dir: Path, world: int, lock: rundir.RunLock) -> tuple[str, object]:
    try:  # every rank must hear rank 0's verdict, even when a file cannot be read
        return _open_run_folder(run, run_dir, world, lock)
    except rundir.RunFolderError as exc:
        return "refused", str(exc)


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
    check_eval_tasks(run)  # before a run folder or any data exists
    check_data_config(run.data, run.model.vocab_size)
    d = init_distributed(run.train.device)
    if run.train.float8:  # refused here, before a run folder or any data exists, where it cannot run
        check_float8(d.device)
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
