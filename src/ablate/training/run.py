"""The life of a run around its Trainer (training/trainer.py): its folder, lock and identity, a branch's wait for its
parent, the record of a failure, and `train()`.

runs/<experiment>/<variant>/seed<k>/ holds config.json, metrics.jsonl, tb/, checkpoints/step_N/ and, once
finished, summary.json (names from rundir). Calling train() again on the same folder resumes from the newest
complete checkpoint, or returns the summary of a finished run without redoing it.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import time
import traceback
from pathlib import Path
from collections.abc import Sequence

import torch

from ablate import rundir
from ablate.config import ConfigError, RunConfig
from ablate.data.batch_schedule import largest_pass
from ablate.rundir import run_dir_for
from ablate.setup.checks import CheckedRun, check_run
from ablate.training.callbacks import Callback, Divergence
from ablate.training.callbacks.metrics import reset_peak_memory
from ablate.training.parallel import free_memory, init_distributed
from ablate.training.callbacks.standard import run_callbacks
from ablate.training.trainer import Trainer


SOURCE = "source"  # a run folder's copy of the user code it trained with


def _code_change(held: dict, now: dict) -> str:
    """Which user components differ between a folder's record and this run (", the user code changed: ...")."""
    changed = [
        f"{key} {held.get(key, 'absent')} -> {now.get(key, 'absent')}"
        for key in sorted({*held, *now})
        if held.get(key) != now.get(key)
    ]
    return f"; the user code changed: {', '.join(changed)} (the folder's copy: {SOURCE}/)" if changed else ""


def _keep_source(run: RunConfig, run_dir: Path) -> None:
    """Copy the files defining the run's user code (its experiment file, where the components live) into
    run_dir/source/, so the folder keeps the source it trained with."""
    from ablate.components import registry
    from ablate.setup.components import used

    files = {e.file for kind, name in used(run).items() for e in registry.user_entries(kind, [name])}
    files |= {e.file for e in registry.user_entries("task", list(run.eval.task_code))}
    if run.experiment_file and (run.user_code or run.eval.task_code):
        files.add(run.experiment_file)
    for file in sorted(f for f in files if Path(f).is_file()):
        (run_dir / SOURCE).mkdir(exist_ok=True)
        target = run_dir / SOURCE / Path(file).name
        shutil.copyfile(file, target.with_suffix(".tmp"))  # then renamed: a killed copy leaves no half file
        os.replace(target.with_suffix(".tmp"), target)


def _open_run_folder(checked: CheckedRun, run_dir: Path, world: int, lock: rundir.RunLock) -> tuple[str, object]:
    """On rank 0: take the run's lock and decide what to do with its folder. Returns ("train", None), or
    ("finished", summary), ("locked" | "diverged" | "refused", message)."""
    run = checked.config
    if not lock.acquire():
        return "locked", f"{run_dir}: skipped, being trained by {lock.holder()}"
    config_path = run_dir / rundir.CONFIG
    if config_path.exists():
        held = rundir.read_json(config_path)
        # a folder with no progress (a run that failed before its first checkpoint) never blocks a corrected rerun
        if held.get("identity") != run.identity() and _has_progress(run_dir):
            return "refused", (
                f"{run_dir}: holds a run of a different config (identity {held.get('identity')} vs "
                f"{run.identity()}{_code_change(held.get('config', {}).get('user_code', {}), run.user_code)}); "
                f"pass another --out or remove the folder"
            )
    status = rundir.read_status(run_dir) or {}
    if (run_dir / rundir.SUMMARY).exists():
        try:
            return "finished", rundir.read_json(run_dir / rundir.SUMMARY)
        except rundir.RunFolderError as exc:  # resuming from the final checkpoint writes it again
            aside = rundir.set_aside(run_dir / rundir.SUMMARY)
            rundir.warn(f"{exc}; set aside as {aside.name}, resuming to write it again")
    if status.get("state") == "diverged":
        return "diverged", (
            f"{run_dir}: diverged at step {status.get('step')} on an earlier attempt "
            f"({status.get('message')}); not retried: remove the folder to train it again"
        )
    if run.branch and not _has_progress(run_dir):
        refusal = _wait_for_parent(run, run_dir)
        if refusal:
            return "refused", refusal
    plan = checked.batch_plan
    steps = len(plan)  # what max_steps was before batch schedules
    rundir.write_json_atomic(
        config_path,
        {
            "identity": run.identity(),
            "world_size": world,
            "steps": steps,
            "rank_micro_batch": largest_pass(plan, world, run.train.micro_batch),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "config": run.to_dict(),
        },
    )
    _keep_source(run, run_dir)
    attempts = status.get("attempts", 0) + 1
    rundir.write_status(
        run_dir, "running", step=0, max_steps=steps, attempts=attempts, log=rundir.log_path(), message=""
    )
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
            return (
                f"{run_dir}: a branch of {parent!r} at step {step}, but {parent_dir} has no checkpoint at step "
                f"{step} (parent {state}); train the parent first with the same experiment file (it keeps "
                f"that checkpoint), e.g. ablate run FILE --only {parent}"
            )
        if not told:
            print(f"[{run.name} seed{run.train.seed}] waiting for {parent!r} to reach step {step}", flush=True)
            told = True
        time.sleep(poll_seconds)
        waited += poll_seconds
    held = rundir.read_json(parent_dir / rundir.CONFIG).get("identity")
    if held != run.branch.get("parent_identity"):
        return (
            f"{run_dir}: a branch of {parent!r}, whose folder {parent_dir} holds another config (identity {held}, "
            f"the experiment's parent is {run.branch.get('parent_identity')}); retrain the parent or pass --out"
        )
    return ""


def _decide(checked: CheckedRun, run_dir: Path, world: int, lock: rundir.RunLock) -> tuple[str, object]:
    """Rank 0's verdict on the run folder, which every rank must hear even when deciding fails: a file that cannot
    be read refuses the run; any other error comes back as ("failed", the exception), raised by train()."""
    try:
        return _open_run_folder(checked, run_dir, world, lock)
    except rundir.RunFolderError as exc:
        return "refused", str(exc)
    except Exception as exc:
        return "failed", exc


def finished_note(run: RunConfig, run_dir: Path, summary: dict) -> str:
    """What to tell of a run found finished: it is not trained again, nor are its in-training evals redone; the
    command that scores the eval.tasks it was not scored on at its last step (ablate.launch.sweep says it)."""
    note = f"already finished ({run_dir / rundir.SUMMARY}); not trained again"
    from ablate.eval.suite import parse_tasks

    wanted = parse_tasks(run.eval.tasks, "eval.tasks") if run.eval.tasks.strip() else []  # suites expanded
    scored = {
        r.get("task")
        for r in rundir.read_jsonl(run_dir / rundir.EVALS)
        if r.get("step") == summary.get("steps") and r.get("format") == run.eval.format
    }
    missing = [t for t in wanted if t not in scored]
    if not missing:
        return note
    if not rundir.checkpoint_steps(run_dir):
        return f"{note}; eval.tasks {','.join(missing)} were not scored, and it keeps no checkpoint to score"
    command = (
        f"ablate eval {shlex.quote(str(run_dir))} --tasks {','.join(missing)} --format {run.eval.format} "
        f"--limit {run.eval.limit}"
    )
    return f"{note}; eval.tasks {','.join(missing)} were not scored at its last step: score them with {command}"


def _has_progress(run_dir: Path) -> bool:
    return (
        (run_dir / rundir.SUMMARY).exists()
        or bool(rundir.checkpoint_steps(run_dir))
        or bool(rundir.read_jsonl(run_dir / rundir.METRICS))
    )


def _record_failure(run_dir: Path, trainer: Trainer | None, exc: BaseException, lock: rundir.RunLock) -> None:
    """status.json (and error.txt with the traceback) for a run that stopped, at whatever stage; rank 0 only. A
    folder whose lock another live process holds is that process's to write: left as it is (the exception still
    reaches the caller, whole); a diverged or finished run's status stays."""
    if lock.fd is None and not lock.acquire():  # a failure before the folder decision: taken here, released by train
        return
    final = (rundir.read_status(run_dir) or {}).get("state") == "diverged" or (run_dir / rundir.SUMMARY).exists()
    step = trainer.step if trainer is not None else 0
    skipped = {"skipped_steps": trainer.skipped_steps} if trainer is not None else {}
    message = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):  # Ctrl-C, or a launcher's requeue (submitit exits)
        resume = (rundir.checkpoint_steps(run_dir) or [0])[-1]
        rundir.write_status(
            run_dir,
            "interrupted",
            step=step,
            resume_step=resume,
            message=f"interrupted at step {step}; rerun the same command to resume from step {resume}",
        )
        return
    if isinstance(exc, Divergence):  # a final state, reported instead of resumed
        step = step if exc.step is None else exc.step  # a divergence learnt of a few steps after it happened
        rundir.write_status(run_dir, "diverged", step=step, message=str(exc), **skipped)
        return
    (run_dir / rundir.ERROR).write_text("".join(traceback.format_exception(exc)))
    if final:  # a failure before the decision never overwrites a final state (the next attempt must still see it)
        return
    rundir.write_status(
        run_dir, "failed", step=step, message=message, error_file=str(run_dir / rundir.ERROR), **skipped
    )


def train(run: RunConfig | CheckedRun, out_root: str | Path = "runs", callbacks: Sequence[Callback] = ()) -> dict:
    """Train one run (resuming if its folder has a checkpoint); return its summary. `callbacks`: your own
    (ablate.training.callbacks.Callback), added to the standard ones (all run by `order`), a fresh copy for each
    run. Rank 0 holds the run's lock and writes the files. Raises RunLocked when another live process trains the run,
    RunDiverged when it diverged (now or on an earlier attempt), ConfigError when the folder holds another config;
    any other failure, at any stage from the process group on, is recorded in status.json and error.txt (the
    traceback), then raised."""
    config = run.config if isinstance(run, CheckedRun) else run
    run_dir = run_dir_for(out_root, config)
    summary = rundir.finished_summary(run_dir, config.identity())
    if summary is not None:  # before any check, data or lock: a finished run's folder is only read
        return summary
    checked = check_run(run)  # as it is when loading checked it (ablate.setup.checks); before any folder or data
    every_callback = run_callbacks(config, callbacks)  # a name clash or a non-callback is refused here too
    lock = rundir.RunLock(run_dir)
    d = trainer = None
    try:
        try:  # from here on, a failure at any stage is recorded in the run folder
            d = init_distributed(config.train.device)
            checked = check_run(checked, d.world)  # the world torchrun started agrees with WORLD_SIZE: the same check
            decided = _decide(checked, run_dir, d.world, lock) if d.is_main else None
            decision, detail = d.broadcast_object(_shareable(decided))
            if decision == "failed":
                raise decided[1] if d.is_main else RuntimeError(f"{run_dir}: rank 0 failed deciding: {detail}")
            if decision == "train":
                reset_peak_memory(d.device)  # summary.json's peak_memory_bytes is this run's, not an earlier one's
                trainer = Trainer(checked, run_dir, d, every_callback)
                if d.is_main:  # the run folder carries its tokenizer: eval and export need nothing from the cache
                    shutil.copyfile(trainer.data.tokenizer_path, run_dir / rundir.TOKENIZER)
                summary = trainer.fit()
        except BaseException as exc:
            if d.is_main if d is not None else os.environ.get("RANK", "0") == "0":  # no group yet: torchrun's rank
                _record_failure(run_dir, trainer, exc, lock)
            if isinstance(exc, Divergence):
                raise rundir.RunDiverged(f"{run_dir}: {exc}") from None
            raise
        if decision == "finished":
            return detail
        if decision != "train":  # a refusal (locked, diverged before, another config): the folder is not ours
            raise REFUSALS[decision](detail)
        if d.is_main:
            _write_finished(run_dir, summary)
        d.barrier()
        return summary
    finally:
        lock.release()
        trainer = None
        if d is not None:
            free_memory(d.device)


def _write_finished(run_dir: Path, summary: dict) -> None:
    rundir.write_json_atomic(run_dir / rundir.SUMMARY, summary)
    rundir.write_status(run_dir, "finished", step=summary["steps"], message="", skipped_steps=summary["skipped_steps"])


REFUSALS = {"locked": rundir.RunLocked, "diverged": rundir.RunDiverged, "refused": ConfigError}


def train_stack(
    runs: Sequence[RunConfig | CheckedRun], out_root: str | Path = "runs", callbacks: Sequence[Callback] = ()
) -> list[dict | BaseException]:
    """Train runs of one shape as one stacked model (training.stack) in this process, at world size 1. Each run
    keeps its own folder exactly as train() keeps a lone run's: its lock, config.json (a lone run's identity),
    status.json, tokenizer, metrics, checkpoints, summary.json, and its failure record. Returns, per run in order,
    its summary or the exception that ended it: RunLocked, RunDiverged, ConfigError (another config in its
    folder), or its failure (recorded in its folder as train() records one). A run found finished is only read.
    A failure of the stack itself (not one member's divergence) ends every member it trains, each recorded; Ctrl-C
    too (each member's status says where it resumes), and is raised after."""
    checked = [check_run(run) for run in runs]  # every config checked before any folder, data or lock
    results: list[dict | BaseException | None] = [None] * len(checked)
    folders = [run_dir_for(out_root, c.config) for c in checked]
    locks = [rundir.RunLock(folder) for folder in folders]
    trainers: dict[int, Trainer] = {}
    d = None
    try:
        try:
            d = init_distributed(checked[0].config.train.device)
            if d.world != 1:
                raise ConfigError(f"--stack: a stack trains in one process at world size 1, not {d.world}")
            reset_peak_memory(d.device)  # each summary's peak_memory_bytes is the stack's: its members' together
        except Exception as exc:  # before any member's folder is decided: recorded in each, as train() would
            for k, folder in enumerate(folders):
                _record_failure(folder, None, exc, locks[k])
            return [exc] * len(folders)
        for k, (run, folder) in enumerate(zip(checked, folders)):
            results[k] = rundir.finished_summary(folder, run.config.identity())
            if results[k] is not None:
                continue
            run = check_run(run, 1)
            decision, detail = _decide(run, folder, 1, locks[k])
            if decision == "finished":
                results[k] = detail
            elif decision == "failed":
                _record_failure(folder, None, detail, locks[k])
                results[k] = detail
            elif decision != "train":
                results[k] = REFUSALS[decision](detail)
            else:
                try:
                    trainers[k] = Trainer(run, folder, d, run_callbacks(run.config, callbacks))
                    shutil.copyfile(trainers[k].data.tokenizer_path, folder / rundir.TOKENIZER)
                except Exception as exc:
                    trainers.pop(k, None)
                    _record_failure(folder, None, exc, locks[k])
                    results[k] = exc
        if trainers:
            _fit_stack(trainers, folders, locks, results)
    finally:
        for lock in locks:
            lock.release()
        trainers.clear()
        if d is not None:
            free_memory(d.device)
    return results


def _fit_stack(trainers: dict[int, Trainer], folders: list[Path], locks: list, results: list) -> None:
    """The members trained together (one alone trains as a lone run); each outcome written to its folder and
    `results`."""
    from ablate.training.stack import StackedTrainer

    order, stacked, summaries, stopped = sorted(trainers), None, [], None
    try:
        if len(order) == 1:
            summaries = [trainers[order[0]].fit()]
        else:
            stacked = StackedTrainer([trainers[k] for k in order])
            summaries = stacked.fit()
    except BaseException as exc:  # the stack's own failure, or Ctrl-C: it ends every member it was training
        stopped, summaries = exc, [None] * len(order)
    diverged = stacked.failed if stacked is not None else {}
    for position, (k, summary) in enumerate(zip(order, summaries)):
        if summary is not None:
            if len(order) > 1:  # who shared its steps: its speed and peak memory are the stack's
                summary = {**summary, "stack": {"members": len(order), "member": position}}
            _write_finished(folders[k], summary)
            results[k] = summary
            continue
        cause = diverged.get(position, stopped)
        _record_failure(folders[k], trainers[k], cause, locks[k])
        results[k] = rundir.RunDiverged(f"{folders[k]}: {cause}") if isinstance(cause, Divergence) else cause
    if stopped is not None and not isinstance(stopped, Exception):  # Ctrl-C, a launcher's exit: recorded, raised
        raise stopped


def _shareable(decided: tuple[str, object] | None) -> tuple[str, object] | None:
    """Rank 0's decision as every rank hears it: a failure as its one-line message (rank 0 keeps the exception)."""
    if decided is None or decided[0] != "failed":
        return decided
    exc = decided[1]
    return "failed", f"{type(exc).__name__}: {exc}"
