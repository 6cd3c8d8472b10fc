"""Sweeps on a SLURM cluster through submitit: one job-array task per run, requeued when preempted or timed out.

Each task calls `RunTask`, which trains its run with `ablate.sweep.run_one` (resuming from the run's newest
checkpoint). When SLURM is about to stop a task (90 s before its time limit; on preemption too where the cluster
sets SlurmctldParameters=preempt_send_user_signal), submitit's handler catches the signal (USR2), asks
`RunTask.checkpoint` for the call to make next, and requeues the task; the new attempt simply calls run_one again,
which resumes from the newest checkpoint (work since that checkpoint is redone). `max_requeues` bounds the requeues
of a task, so a run that keeps being preempted cannot loop forever.

`local=True` runs the same tasks as real processes on this machine with submitit's LocalExecutor (same pickling,
signals and requeue path, no cluster): how the tests check the code a cluster runs. There every task starts at
once (partition, account, qos, constraint, mem_gb and array_parallelism only matter on a cluster).
"""

from __future__ import annotations

import os
from pathlib import Path

from ablate import rundir
from ablate.config import ConfigError, RunConfig
from ablate.rundir import run_dir_for

try:
    import submitit
except ModuleNotFoundError:  # parse_slurm_options works without it; submit() says how to install it
    submitit = None

# --slurm key=value options: their types, smallest allowed values and defaults
OPTIONS = {
    "partition": str,
    "time": int,
    "gpus_per_run": int,
    "cpus_per_run": int,
    "mem_gb": int,
    "nodes": int,
    "account": str,
    "qos": str,
    "constraint": str,
    "array_parallelism": int,
    "folder": str,
    "max_requeues": int,
}
MINIMUM = {
    "time": 1,
    "gpus_per_run": 0,
    "cpus_per_run": 1,
    "mem_gb": 1,
    "nodes": 1,
    "array_parallelism": 1,
    "max_requeues": 0,
}
DEFAULTS = {"gpus_per_run": 0, "nodes": 1, "max_requeues": 3}
LOCAL_TIME_MIN = 7 * 24 * 60  # LocalExecutor's own default limit is 2 minutes: too short for any real run
REQUEUES_FILE = "requeues"  # <run_dir>/requeues: how many times this run's task was requeued


def parse_slurm_options(text: str) -> dict:
    """`partition=gpu,time=60,gpus_per_run=2` -> typed, checked options with the defaults filled in."""
    options, seen = dict(DEFAULTS), set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, _, value = (s.strip() for s in item.partition("="))
        if key not in OPTIONS:
            raise ConfigError(f"--slurm {key}: unknown option; allowed: {', '.join(OPTIONS)}")
        if key in seen:
            raise ConfigError(f"--slurm {key}: given twice")
        seen.add(key)
        if not value:
            raise ConfigError(f"--slurm {key}: needs a value, as in {key}=...")
        if OPTIONS[key] is int:
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(f"--slurm {key}={value}: not a whole number") from None
            if value < MINIMUM[key]:
                raise ConfigError(f"--slurm {key}={value}: allowed: whole numbers >= {MINIMUM[key]}")
        options[key] = value
    _check_nodes(options)
    return options


def _check_nodes(options: dict) -> None:
    if options.get("nodes", 1) > 1:
        raise NotImplementedError(
            f"--slurm nodes={options['nodes']}: one run over several nodes is not supported yet: it needs "
            f"tasks_per_node x nodes processes, MASTER_ADDR on the first node and LOCAL_RANK per node (submitit's "
            f"TorchDistributedEnvironment has them), and a test on a real multi-node allocation; use nodes=1"
        )


class RunTask(submitit.helpers.Checkpointable if submitit else object):
    """What one array task runs: a run (with the callbacks its experiment file defines), then (on
    preemption/timeout) the same call again, counted."""

    def __init__(self, max_requeues: int, threads: int | None, experiment_file: str | None = None):
        self.max_requeues, self.threads, self.experiment_file = max_requeues, threads, experiment_file

    def __call__(self, run: dict, out_root: str, requeues: int = 0) -> str:
        from ablate.sweep import run_one  # imports torch: only in the task

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # G processes for one run: torchrun's variables, read by init_distributed
            # CUDA_VISIBLE_DEVICES is left alone: ablate picks cuda:LOCAL_RANK among the job's GPUs
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        os.environ[rundir.LOG_ENV] = str(env.paths.stdout)  # status.json names this task's console log
        if requeues and env.global_rank == 0:
            print(
                f"ablate: requeue {requeues}/{self.max_requeues} of {run['name']} seed{run['train']['seed']}: resuming",
                flush=True,
            )
        return run_one(run, out_root, threads=self.threads, experiment_file=self.experiment_file)

    def checkpoint(self, run: dict, out_root: str, requeues: int = 0):
        """Called by submitit (rank 0) on the stop signal: the call to requeue, or None to stop here. Nothing to
        save: run_one resumes from the run's newest checkpoint on its own."""
        run_dir = run_dir_for(out_root, RunConfig.from_dict(run))
        if requeues >= self.max_requeues:
            print(
                f"ablate: {run_dir}: stopped, not requeued: already requeued {requeues} times "
                f"(max_requeues={self.max_requeues})",
                flush=True,
            )
            return None  # submitit then ends the task with an error naming why
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / REQUEUES_FILE).write_text(f"{requeues + 1}\n")
        print(f"ablate: {run_dir}: preempted or timed out, requeued ({requeues + 1}/{self.max_requeues})", flush=True)
        return submitit.helpers.DelayedSubmission(self, run, out_root, requeues + 1)


def executor_parameters(options: dict, name: str, local: bool) -> dict:
    """submitit parameters for one task per run with G = gpus_per_run processes (one per GPU; 1 on CPU)."""
    gpus = options.get("gpus_per_run", 0)
    procs = max(1, gpus)
    params = {"gpus_per_node": gpus, "tasks_per_node": procs}
    if local:
        return {**params, "timeout_min": options.get("time", LOCAL_TIME_MIN)}
    slurm = {
        "job_name": name,
        "ntasks_per_node": procs,
        "gpus_per_node": gpus,
        "nodes": 1,
        "cpus_per_task": max(1, options["cpus_per_run"] // procs) if options.get("cpus_per_run") else None,
        "mem": f"{options['mem_gb']}GB" if options.get("mem_gb") else None,
        **{k: options.get(k) for k in ("partition", "time", "account", "qos", "constraint", "array_parallelism")},
    }
    return {k: v for k, v in slurm.items() if v is not None}


def _threads(options: dict, n_runs: int, local: bool) -> int | None:
    """torch threads per process: its share of cpus_per_run; locally every task starts at once, so this
    machine's cores are split between them."""
    procs = max(1, options.get("gpus_per_run", 0))
    if options.get("cpus_per_run"):
        return max(1, options["cpus_per_run"] // procs)
    return max(1, len(os.sched_getaffinity(0)) // (n_runs * procs)) if local else None


def launch(
    runs: list[RunConfig], out_root: str, options: dict, local: bool = False, experiment_file: str | None = None
) -> list:
    """Submit one array task per run; return submitit's jobs in run order (print a line per run). Each task loads
    the callbacks `experiment_file` defines (a path every task can read)."""
    if not runs:
        return []
    if submitit is None:
        raise ConfigError("--slurm needs submitit: pip install 'ablate[slurm]'")
    options = {**DEFAULTS, **options}
    _check_nodes(options)
    if not local and "time" not in options:  # submitit would otherwise ask SLURM for 5 minutes
        raise ConfigError("--slurm time=MINUTES: required on a cluster (the time limit of each task)")
    experiment = runs[0].experiment
    folder = Path(options.get("folder") or Path(out_root) / experiment / ".slurm")
    # submitit's own timeout count also bounds requeues; ours (RunTask) counts preemptions as well
    cls = submitit.LocalExecutor if local else submitit.SlurmExecutor
    try:
        executor = cls(folder=folder, max_num_timeout=options["max_requeues"])
    except RuntimeError as exc:  # no srun on this machine
        raise ConfigError(f"--slurm: {exc}") from None
    executor.update_parameters(**executor_parameters(options, f"ablate-{experiment}", local))
    task = RunTask(options["max_requeues"], _threads(options, len(runs), local), experiment_file)
    jobs = executor.map_array(task, [r.to_dict() for r in runs], [str(out_root)] * len(runs))
    for job, run in zip(jobs, runs):
        print(f"submitted job {job.job_id}: {run_dir_for(out_root, run)}", flush=True)
    return jobs


def collect(jobs: list, runs: list[RunConfig], out_root: str) -> list[str]:
    """Wait for every task; its state in run order. A task that crashed outright (killed, out of memory: no
    state returned) counts as failed: its message is printed and, unless a live process holds the run, recorded
    in the run's status.json as sweep's workers do."""
    states = []
    for job, run in zip(jobs, runs):
        try:
            state = job.results()[0]  # rank 0's answer
        except Exception as exc:
            state, folder = "failed", run_dir_for(out_root, run)
            print(
                f"failed job {job.job_id}: {folder}: {type(exc).__name__}: {str(exc).strip()[-2000:]}\n"
                f"  log: {job.paths.stdout}",
                flush=True,
            )
            if not rundir.RunLock(folder).held_by_live_process():
                message = f"job {job.job_id} ended without a result ({type(exc).__name__}); see {job.paths.stdout}"
                rundir.write_status(folder, "failed", message=message, log=str(job.paths.stdout))
        states.append(state)
    counts = {s: states.count(s) for s in ("finished", "failed", "diverged")}
    others = {s: states.count(s) for s in sorted(set(states) - set(counts))}
    print("slurm: " + ", ".join(f"{n} {s}" for s, n in {**counts, **others}.items()), flush=True)
    return states


def submit(
    runs: list[RunConfig],
    out_root: str,
    options: dict,
    local: bool = False,
    wait: bool = True,
    experiment_file: str | None = None,
) -> list[str]:
    """One job-array task per run (SLURM, or real local processes with local=True), each with the callbacks
    `experiment_file` defines. With wait, the runs' final states in run order (finished, failed, diverged, locked);
    without, the job ids."""
    jobs = launch(runs, out_root, options, local, experiment_file)
    return collect(jobs, runs, out_root) if wait else [str(job.job_id) for job in jobs]
