"""Score the kept checkpoints of many runs on the task suite after training: `ablate eval RUNS --every-checkpoint`.

A study trained without in-training evals (or scored on other tasks) keeps its checkpoints; this scores each one
as `ablate eval` would, in one process: the tasks' requests are tokenized once per tokenizer file and reused for
every checkpoint of every run that trained with it. Results go to each run's evals.jsonl and eval_items/step_N/,
so `ablate report` reads them like in-training evals. A checkpoint already scored on a task (its item file
exists) is left alone unless `rescore`; a run a live process is training is skipped and said so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from ablate import rundir
from ablate.eval import engine, suite
from ablate.eval.load import load_model
from ablate.text import natural_key


@dataclass
class Scored:
    """What one call did: evaluations written, checkpoints skipped (with why), seconds spent scoring."""

    written: list[tuple[Path, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _pending(run_dir: Path, tasks: list[str], fmt: str, rescore: bool) -> list[tuple[int, list[str]]]:
    """(step, tasks not yet scored there) for each complete checkpoint of a run, oldest first."""
    todo = []
    for step in rundir.checkpoint_steps(run_dir):
        missing = [t for t in tasks if rescore or not rundir.items_path(run_dir, step, f"{t}_{fmt}").is_file()]
        if missing:
            todo.append((step, missing))
    return todo


def score_checkpoints(
    path: str | Path,
    tasks: list[str],
    fmt: str = "cf",
    limit: int | None = 1000,
    batch_size: int = 32,
    device: str = "cpu",
    dtype: str | None = None,
    rescore: bool = False,
    say: Callable[[str], None] = print,
    metrics: tuple[str, ...] | None = None,
) -> Scored:
    """Score every kept checkpoint of every run folder under `path` (a run folder, an experiment, a runs root), in
    `dtype` (None: each run's train.dtype, see engine.eval_dtype) on `metrics` (None: all)."""
    import time

    root = Path(path)
    run_dirs = sorted(
        (d for d in rundir.find_run_dirs(root) if (d / rundir.CONFIG).is_file()), key=lambda d: natural_key(str(d))
    )
    if not run_dirs:
        raise FileNotFoundError(f"{root}: no run folder (with {rundir.CONFIG}) under it")
    done, tokenizers, prepared = Scored(), {}, {}
    for run_dir in run_dirs:
        if rundir.RunLock(run_dir).held_by_live_process():
            done.skipped.append(f"{run_dir}: being trained by a live process (score it when it ends)")
            continue
        for step, missing in _pending(run_dir, tasks, fmt, rescore):
            start = time.perf_counter()
            loaded = load_model(rundir.checkpoint_root(run_dir) / rundir.step_dir_name(step), device=device)
            # one tokenizer object per distinct tokenizer file, so the prepared requests are reused across runs
            digest = hashlib.sha256(loaded.tokenizer_path.read_bytes()).hexdigest()
            if digest not in tokenizers:
                tokenizers[digest] = loaded.tokenizer()
            tokenizer = tokenizers[digest]
            lm, _ = engine.for_loaded(loaded, device, dtype)
            results = suite.evaluate(lm, tokenizer, missing, fmt, limit, batch_size, cache=prepared, metrics=metrics)
            suite.write_results(run_dir, step, loaded.tokens, results)
            seconds = time.perf_counter() - start
            done.seconds += seconds
            done.written.append((run_dir, step))
            say(
                f"{run_dir} step {step}: "
                + "  ".join(f"{r.task} {r.metrics[r.primary]:.3f}" for r in results)
                + f" ({seconds:.1f}s)"
            )
    return done
