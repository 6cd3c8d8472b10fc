"""Running many runs: one after another in this process, N at a time on this machine, or (slurm.py) on a cluster.

Every path ends in `attempt(run)`, which trains one run and turns its outcome into a state (finished, failed,
diverged, locked) without letting one run's failure stop the others; the failure itself is recorded in the run
folder by train(). Side by side, each run gets its share of the machine: a set of GPUs (CUDA_VISIBLE_DEVICES) or
cores / N torch threads, so N runs on one CPU neither fight over cores nor change their numbers.

An experiment file's own `callbacks` reach every run: a worker is given the file's path and loads them itself
(ablate.setup.experiment.experiment_callbacks), as each SLURM task does.

    python -m ablate.launch.sweep --serve THREADS                                # a slot's worker: runs from stdin
    python -m ablate.launch.sweep RUN_JSON OUT_ROOT [THREADS [EXPERIMENT_FILE]]  # one run (a torchrun group's process)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence

from ablate import rundir
from ablate.config import ConfigError, ExperimentError, RunConfig
from ablate.rundir import run_dir_for
from ablate.setup.checks import CheckedRun

RESULT_ENV = "ABLATE_RESULT"  # a worker writes its final state there, so the parent needs no exit-code mapping
# K runs sharing a GPU: each worker caps its CUDA allocator at 1/K of the GPU (set by the parent, applied at start)


def run_label(run: RunConfig) -> str:
    return f"{run.name} seed{run.train.seed}"


@contextlib.contextmanager
def survivors_frozen():
    """Around each run (or stack) of a process: every object alive at its start (the modules torch and ablate
    imported, ~300k objects; what earlier runs left cached) waits in the collector's permanent generation until it
    ends, so the full collections during it and the one that frees it (training.parallel.free_memory) walk only
    what the run made: ~0.3 s less a run on a 2-core CPU (scripts/bench_fixed_costs.py). Nothing alive is dropped;
    the run's own objects are collected as before. Where something else froze objects already, left as it is
    (gc.unfreeze would thaw theirs too)."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def attempt(run: RunConfig | CheckedRun, out_root: str | Path, callbacks: Sequence = ()) -> tuple[str, str]:
    """Train one run, checked or not, as train() takes it (with the user's `callbacks` beside the standard ones);
    return (state, one-line message). A run's own failure never raises (Ctrl-C does)."""
    from ablate.training.run import train

    config = run.config if isinstance(run, CheckedRun) else run
    before, started = _summary_text(run_dir_for(out_root, config)), time.time()
    try:
        result = train(run, out_root, callbacks)
    except Exception as exc:
        result = exc
    return _outcome_of(result, config, run_dir_for(out_root, config), before, started)


def attempt_stack(
    runs: Sequence[RunConfig | CheckedRun], out_root: str | Path, callbacks: Sequence = ()
) -> list[tuple[str, str]]:
    """Train runs of one shape as one stacked model (training.run.train_stack); each run's (state, message), as
    attempt() gives a lone run's. One run's failure never raises (Ctrl-C does)."""
    from ablate.training.run import train_stack

    configs = [run.config if isinstance(run, CheckedRun) else run for run in runs]
    folders = [run_dir_for(out_root, config) for config in configs]
    before, started = [_summary_text(folder) for folder in folders], time.time()
    try:
        results = train_stack(runs, out_root, callbacks)
    except Exception as exc:  # a config refused before any folder (train_stack's checks): every run failed by it
        results = [exc] * len(runs)
    return [
        _outcome_of(result, config, folder, earlier, started)
        for result, config, folder, earlier in zip(results, configs, folders, before)
    ]


def _outcome_of(
    result: dict | BaseException, config: RunConfig, run_dir: Path, before: str | None, started: float
) -> tuple[str, str]:
    """(state, one-line message) of a run's summary, or of the exception that ended it."""
    if isinstance(result, rundir.RunLocked):
        return "locked", str(result)
    if isinstance(result, rundir.RunDiverged):
        return "diverged", str(result)
    if isinstance(result, (ConfigError, rundir.RunFolderError)):
        return "failed", str(result)
    if isinstance(result, BaseException):  # its folder has the traceback in error.txt, unless another process's
        error = run_dir / rundir.ERROR
        written = error.is_file() and error.stat().st_mtime >= started - 1
        return "failed", f"{type(result).__name__}: {result}" + (f" (traceback: {error})" if written else "")
    if before is not None and before == json.dumps(result, sort_keys=True):  # finished before this command
        return "finished", finished_message(config, run_dir, result)
    return "finished", f"{_losses(result)}  {result['tokens_per_second']:.0f} tok/s  {result['wall_seconds']:.1f}s"


def _losses(summary: dict) -> str:
    return f"final_loss {summary['final_loss']:.4f}  final_val_loss {summary['final_val_loss']:.4f}"


def finished_message(run: RunConfig, run_dir: Path, summary: dict) -> str:
    """What a sweep says of a run found finished before it: its losses, and that it is not trained again."""
    from ablate.training.run import finished_note

    return f"{_losses(summary)}; {finished_note(run, run_dir, summary)}"


def file_callbacks(path: str | Path, runs: list[CheckedRun]) -> list:
    """The callbacks an experiment file defines (`callbacks = [...]`, for every run of the file), checked against
    each run's standard ones before any compute (ExperimentError naming the file); [] when it defines none."""
    from ablate.setup.experiment import experiment_callbacks

    found = experiment_callbacks(path)
    if found:
        from ablate.training.callbacks.standard import run_callbacks

        for run in runs:
            try:
                run_callbacks(run.config, found)
            except ConfigError as exc:
                raise ExperimentError(f"{path}: {exc}") from None
    return found


def _summary_text(run_dir: Path) -> str | None:
    """A finished run's summary.json as canonical JSON (NaN compares equal), or None."""
    try:
        return json.dumps(rundir.read_json(run_dir / rundir.SUMMARY), sort_keys=True)
    except rundir.RunFolderError:  # none yet, or damaged (train() sets it aside and trains on)
        return None


def run_one(
    run: dict | RunConfig, out_root: str, threads: int | None = None, experiment_file: str | None = None
) -> str:
    """A worker: train one run in this (fresh) process, with the callbacks `experiment_file` defines, and return
    its state. Honours torchrun's environment variables, so G processes started together train it as one FSDP2
    group."""
    state, message = _in_worker([run], out_root, threads, experiment_file, stacked=False)[0]
    if int(os.environ.get("RANK", 0)) == 0 and os.environ.get(RESULT_ENV):  # atomic: the parent polls for it
        rundir.write_json_atomic(os.environ[RESULT_ENV], {"state": state, "message": message})
    return state


def run_stack(
    runs: list[dict | RunConfig], out_root: str, threads: int | None = None, experiment_file: str | None = None
) -> list[str]:
    """A worker: train runs of one shape as one stack in this (fresh) process (training.run.train_stack); each
    run's state, in order."""
    outcomes = _in_worker(runs, out_root, threads, experiment_file, stacked=True)
    if os.environ.get(RESULT_ENV):  # atomic: the parent polls for it
        rundir.write_json_atomic(os.environ[RESULT_ENV], {"outcomes": outcomes})
    return [state for state, _ in outcomes]


def _in_worker(runs: list, out_root: str, threads: int | None, experiment_file: str | None, stacked: bool) -> list:
    """Each run's (state, message), trained as attempt() or attempt_stack() trains; each told on the console."""
    import torch

    from ablate.setup.experiment import experiment_callbacks
    from ablate.training.parallel import shutdown_distributed

    if threads:
        torch.set_num_threads(threads)
    runs = [RunConfig.from_dict(run) if isinstance(run, dict) else run for run in runs]
    try:
        callbacks = experiment_callbacks(experiment_file) if experiment_file else []
        with survivors_frozen():
            outcomes = attempt_stack(runs, out_root, callbacks) if stacked else [attempt(runs[0], out_root, callbacks)]
    except ExperimentError as exc:  # checked before the sweep began; the file changed since
        outcomes = [("failed", str(exc))] * len(runs)
    except KeyboardInterrupt:  # train() recorded where each stopped; the parent tells the user
        outcomes = [
            ("interrupted", (rundir.read_status(run_dir_for(out_root, run)) or {}).get("message", "")) for run in runs
        ]
    finally:
        shutdown_distributed()
    if int(os.environ.get("RANK", 0)) == 0:
        for run, (state, message) in zip(runs, outcomes):
            print(f"{state} {run_label(run)}: {message}", flush=True)
    return outcomes


def prepare_all(runs: list[CheckedRun], d=None) -> None:
    """Tokenize every distinct data config once, before any run starts: bad data, or too little of it for a run's
    global batch, stops the sweep here (exit 2), and runs started side by side find the cache ready instead of
    building it N times."""
    from ablate.data.prepare import prepare_data

    first: dict[str, tuple[RunConfig, int]] = {}  # data config -> (a run using it, the largest global batch)
    for run in (checked.config for checked in runs):
        key = json.dumps([run.data.__dict__, run.model.vocab_size], sort_keys=True)
        known, batch = first.get(key, (run, 0))
        first[key] = (known, max(batch, run.train.global_batch))
    for run, batch in first.values():
        share = {} if d is None else {"is_main": d.is_main, "share": d.broadcast_object}
        prepare_data(run.data, run.model.vocab_size, global_batch=batch, **share)


# ---------------------------------------------------------------------------------------------------------------
# side by side on this machine


@dataclass
class Slot:
    """A share of this machine for one run at a time: GPUs (empty on CPU), torch threads, and the worker process
    that trains the slot's runs one after another (a torchrun group per run when the slot spans several GPUs).
    `sharing` slots use the same GPUs at once (--runs-per-gpu K): each run gets 1/K of their memory."""

    gpus: list[str]
    threads: int
    job: Job | None = None
    process: subprocess.Popen | None = None
    sharing: int = 1


def machine_slots(
    jobs: int | None, runs_per_gpu: int, gpus_per_run: int, gpu_ids: list[str] | None = None, cores: int | None = None
) -> list[Slot]:
    """On GPUs one run per GPU by default, K runs per GPU, or G GPUs per run (torchrun); `jobs` caps the count.
    On CPU (no GPU visible, or gpus_per_run=0), `jobs` runs with cores // jobs threads each."""
    if gpu_ids is None:
        gpu_ids = visible_gpus()
    cores = cores or os.cpu_count() or 1
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs: {jobs}; allowed: a whole number >= 1")
    if runs_per_gpu < 1 or gpus_per_run < 0:
        raise ConfigError(
            f"--runs-per-gpu {runs_per_gpu} / --gpus-per-run {gpus_per_run}: allowed: --runs-per-gpu >= 1, "
            f"--gpus-per-run >= 0 (0: CPU)"
        )
    if runs_per_gpu > 1 and gpus_per_run != 1:
        raise ConfigError(
            f"--runs-per-gpu {runs_per_gpu} and --gpus-per-run {gpus_per_run}: choose one (several runs share a "
            f"GPU, or one run spans several, or 0: CPU)"
        )
    if not gpu_ids or gpus_per_run == 0:
        if runs_per_gpu > 1 or gpus_per_run > 1:
            raise ConfigError("--runs-per-gpu / --gpus-per-run: no CUDA GPU is visible here; on CPU use --jobs N")
        count = jobs or 1
        return [Slot([], max(1, cores // count)) for _ in range(count)]
    groups = [g for g in gpu_groups(gpu_ids, gpus_per_run) for _ in range(runs_per_gpu)]
    groups = groups[:jobs] if jobs else groups
    return [Slot(g, max(1, cores // len(groups)), sharing=groups.count(g)) for g in groups]


def gpu_groups(gpu_ids: list[str], gpus_per_run: int) -> list[list[str]]:
    """The visible GPUs cut into disjoint groups of `gpus_per_run` (left-over GPUs unused); ConfigError when one
    run asks for more GPUs than there are."""
    if gpus_per_run > len(gpu_ids):
        raise ConfigError(
            f"--gpus-per-run: {gpus_per_run}, but {len(gpu_ids)} GPUs are visible; allowed: 1 to {len(gpu_ids)}"
        )
    return [gpu_ids[i : i + gpus_per_run] for i in range(0, len(gpu_ids) - gpus_per_run + 1, gpus_per_run)]


def in_this_process(slots: list[Slot] | None, gpu_ids: list[str]) -> bool:
    """Whether the runs train in the calling process, one after another: under torchrun (no slots), or one slot
    that is this process's own view (a GPU, or CPU on a machine without one). Otherwise worker processes train
    them, and the parent touches no GPU."""
    return slots is None or (len(slots) == 1 and (len(slots[0].gpus) == 1 or not gpu_ids))


def visible_gpus() -> list[str]:
    """The GPU ids this process may hand out (CUDA_VISIBLE_DEVICES respected), counted without initialising CUDA
    (torch.cuda.device_count creates no context): the parent of a sweep leaves the GPUs to its workers."""
    import torch

    count = torch.cuda.device_count()
    listed = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return listed[:count] if listed else [str(i) for i in range(count)]


@dataclass
class Job:
    indices: list[int]  # its runs' 1-based positions in the sweep
    runs: list[CheckedRun]  # one run, or a stack of runs trained as one (--stack)
    log_path: Path
    result_path: Path


def _env(slot: Slot, job: Job) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(slot.threads),
        rundir.LOG_ENV: str(job.log_path),
        RESULT_ENV: str(job.result_path),
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a worker is its own process group
    env["CUDA_VISIBLE_DEVICES"] = ",".join(slot.gpus)  # a CPU slot's '' hides the GPUs (--gpus-per-run 0)
    if slot.sharing > 1:
        env[rundir.GPU_SHARE_ENV] = str(1 / slot.sharing)
    else:
        env.pop(rundir.GPU_SHARE_ENV, None)
    return env


def _dispatch(slot: Slot, job: Job, out_root: str, experiment_file: str | None) -> None:
    """Hand a run to the slot: to its waiting worker (imports and start-up paid once per slot, not per run), or,
    for several GPUs, to a torchrun group of its own."""
    job.log_path.parent.mkdir(parents=True, exist_ok=True)
    configs = [run.config.to_dict() for run in job.runs]  # the worker checks them again, in its own process
    request = {
        **({"run": configs[0]} if len(configs) == 1 else {"stack": configs}),
        "out_root": str(out_root),
        "log": str(job.log_path),
        "result": str(job.result_path),
        "experiment_file": experiment_file,
    }
    slot.job = job
    if len(slot.gpus) > 1:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={len(slot.gpus)}",
            "-m",
            "ablate.launch.sweep",
            json.dumps(request["run"]),
            str(out_root),
            str(slot.threads),
            *([experiment_file] if experiment_file else []),
        ]
        with job.log_path.open("a") as log:
            slot.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_env(slot, job))
        return
    if slot.process is None or slot.process.poll() is not None:
        with job.log_path.open("a") as log:  # what the worker prints outside a run (a crash at import) lands here
            slot.process = subprocess.Popen(
                [sys.executable, "-m", "ablate.launch.sweep", "--serve", str(slot.threads)],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_env(slot, job),
                text=True,
            )
    slot.process.stdin.write(json.dumps(request) + "\n")
    slot.process.stdin.flush()


def _finished(slot: Slot) -> bool:
    """The slot's run is over: its result is written, or its process has ended."""
    return slot.job.result_path.is_file() or slot.process.poll() is not None


def _outcome(slot: Slot, out_root: str) -> list[tuple[str, str]]:
    """Each of the job's runs' state as the worker reported it, or, if it died before it could, a failure recorded
    in each run folder."""
    job = slot.job
    if job.result_path.is_file():
        result = rundir.read_json(job.result_path)
        if len(slot.gpus) > 1:
            slot.process.wait()
        return (
            [tuple(o) for o in result["outcomes"]] if "outcomes" in result else [(result["state"], result["message"])]
        )
    code = slot.process.returncode
    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
    message = f"worker process ended ({how}) before recording a result; see {job.log_path}"
    for run in job.runs:
        run_dir = run_dir_for(out_root, run.config)
        if not rundir.RunLock(run_dir).held_by_live_process():
            rundir.write_status(run_dir, "failed", message=message, log=str(job.log_path))
    return [("failed", message)] * len(job.runs)


def run_side_by_side(
    runs: list[CheckedRun],
    out_root: str,
    slots: list[Slot],
    report,
    experiment_file: str | None = None,
    stacks: list[list[CheckedRun]] | None = None,
) -> list[str]:
    """Run every run in worker processes, as many at once as there are slots (a stack of runs, `stacks`, --stack,
    takes one slot), each with the callbacks `experiment_file` defines; returns the states in run order (the order
    of `stacks` where given). `report(index, run, state, message)` is told each start ("started") and each end."""
    groups = stacks if stacks is not None else [[run] for run in runs]
    states: list[str | None] = [None] * len(runs)
    pending, first = [], 1
    for group in groups:
        pending.append((list(range(first, first + len(group))), group))
        first += len(group)
    if not slots[0].gpus:
        _measure_cpu_peaks(runs, slots[0].threads)
    scratch = Path(tempfile.mkdtemp(prefix="ablate-sweep-"))
    try:
        while pending or any(slot.job for slot in slots):
            while pending and (slot := _next_free_slot(slots)):  # one run left, two slots free: one stays idle
                indices, group = pending.pop(0)
                stamp = time.strftime("%Y%m%d-%H%M%S")
                log = run_dir_for(out_root, group[0].config) / rundir.LOGS / f"{stamp}-{indices[0]}.log"
                _dispatch(slot, Job(indices, group, log, scratch / f"{indices[0]}.json"), out_root, experiment_file)
                for index, run in zip(indices, group):
                    report(index, run, "started", f"log {slot.job.log_path}")
            time.sleep(0.1)
            for slot in [s for s in slots if s.job and _finished(s)]:
                for index, run, (state, message) in zip(slot.job.indices, slot.job.runs, _outcome(slot, out_root)):
                    states[index - 1] = state
                    report(index, run, state, message)
                slot.job = None
    finally:  # on Ctrl-C too: it reached the workers as well, and they record where they stopped
        _stop_workers(slots, timeout=60)
        shutil.rmtree(scratch, ignore_errors=True)
    return [s or "failed" for s in states]


def _next_free_slot(slots: list[Slot]) -> Slot | None:
    """A free slot on the GPUs that the fewest running runs use (K slots per GPU: runs spread over the GPUs
    before they double up), the first such; None when every slot is busy."""
    free = [s for s in slots if s.job is None]
    return min(free, key=lambda s: sum(1 for o in slots if o.job and o.gpus == s.gpus), default=None)


def _measure_cpu_peaks(runs: list[CheckedRun], threads: int) -> None:
    """This machine's peak FLOP/s at the slots' thread count (for MFU), measured here once if no run measured it
    before: N workers measuring at once would each see a share of the machine, and the low figure would be kept."""
    import torch

    from ablate.setup.auto import uses_bf16
    from ablate.training.parallel import peak_flops_for

    cpu = torch.device("cpu")
    measured = [r.config for r in runs if not r.config.train.peak_flops]
    dtypes = {torch.bfloat16 if uses_bf16(r.train.dtype, cpu) else torch.float32 for r in measured}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # part of the peak's key
    try:
        for dtype in dtypes:  # the trainer's compute dtype on CPU (ablate.setup.auto's rule)
            peak_flops_for(torch.device("cpu"), dtype)
    finally:
        torch.set_num_threads(before)


def _stop_workers(slots: list[Slot], timeout: float) -> None:
    for slot in slots:
        if slot.process is None:
            continue
        if slot.process.stdin and not slot.process.stdin.closed:
            slot.process.stdin.close()  # a waiting worker ends when its input does
        try:
            slot.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            slot.process.kill()
        slot.process = None


@contextlib.contextmanager
def _output_to(path: str):
    """Send this process's stdout and stderr (file descriptors too: torch and tokenizers print there) to a file."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def serve(threads: int) -> None:
    """A slot's worker: train the runs the parent sends on stdin (one JSON request a line), one after another,
    each with its output in its own log and its result in its own file; end when the input ends."""
    for line in sys.stdin:
        request = json.loads(line)
        os.environ[rundir.LOG_ENV], os.environ[RESULT_ENV] = request["log"], request["result"]
        with _output_to(request["log"]):
            if "stack" in request:
                states = run_stack(request["stack"], request["out_root"], threads, request.get("experiment_file"))
            else:
                states = [run_one(request["run"], request["out_root"], threads, request.get("experiment_file"))]
        if "interrupted" in states:
            sys.exit(130)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        try:
            serve(int(sys.argv[2]))
        except KeyboardInterrupt:  # Ctrl-C between runs
            sys.exit(130)
        # Every run's files are written and closed: skip the interpreter's teardown of torch (~0.6 s), which the
        # sweep's end would wait for.
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(0)
    else:
        final = run_one(
            json.loads(sys.argv[1]),
            sys.argv[2],
            int(sys.argv[3]) if len(sys.argv) > 3 else None,
            sys.argv[4] if len(sys.argv) > 4 else None,
        )
        sys.exit({"failed": 1, "interrupted": 130}.get(final, 0))
