"""Sweeps on a SLURM cluster through submitit: one job-array task per run, requeued when preempted or timed out.

Each task calls `RunTask`, which trains its run with `ablate.launch.sweep.run_one` (resuming from the run's newest
checkpoint). When SLURM is about to stop a task (90 s before its time limit; on preemption too where the cluster
sets SlurmctldParameters=preempt_send_user_signal), submitit's handler catches the signal (USR2), asks
`RunTask.checkpoint` for the call to make next, and requeues the task; the new attempt simply calls run_one again,
which resumes from the newest checkpoint (work since that checkpoint is redone). `max_requeues` bounds the requeues
of a task, so a run that keeps being preempted cannot loop forever.

`local=True` runs the same tasks as real processes on this machine with submitit's LocalExecutor (same pickling,
signals and requeue path, no cluster): how the tests check the code a cluster runs. There every task starts at
once (partition, account, qos, constraint, mem_gb and array_parallelism only matter on a cluster), each on its own
group of G GPUs (`local_job_gpus`; with more tasks than groups, round robin: a group's tasks share its memory).

gpus_per_run left out (neither `--slurm gpus_per_run=G` nor `--gpus-per-run G`) follows `resolve_gpus_per_run`:
what the runs ask (train.device), else the GPUs the tasks will see (here for local; the partition's GRES, as
`sinfo` reports it, on a cluster, else this machine's). The choice and its reason are printed; 0 means CPU.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ablate import rundir
from ablate.config import ConfigError, RunConfig
from ablate.rundir import run_dir_for

if TYPE_CHECKING:  # torch: parsing --slurm imports this module, and needs none
    from ablate.setup.checks import CheckedRun

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
DEFAULTS = {"nodes": 1, "max_requeues": 3}  # gpus_per_run: resolve_gpus_per_run
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


def resolve_gpus_per_run(options: dict, runs: list[CheckedRun], local: bool) -> tuple[int, str]:
    """gpus_per_run as given, or (left out) chosen, with the reason to print ('' when given). The rule: every run
    sets train.device='cpu' -> 0; one sets 'cuda' -> 1; else 1 where the tasks will see a GPU: locally this
    machine's (counted without initialising CUDA), on a cluster the partition's GRES by `sinfo` (this machine's
    when sinfo cannot tell: a login node often has none, so a GPU partition is asked for by name or its GRES)."""
    if "gpus_per_run" in options:
        return options["gpus_per_run"], ""
    devices = {run.config.train.device for run in runs}
    if devices == {"cpu"}:
        return 0, "every run sets train.device='cpu'"
    if "cuda" in devices:
        return 1, "a run sets train.device='cuda'"
    if not local:
        partition = options.get("partition")
        offers = partition_has_gpus(_sinfo_partitions(), partition)
        name = f"partition {partition}" if partition else "the default partition"
        if offers is not None:
            return int(offers), f"{name} {'offers' if offers else 'offers no'} GPUs (sinfo's GRES)"
    from ablate.launch.sweep import visible_gpus

    count = len(visible_gpus())
    return (1, f"this machine sees {count} CUDA GPU(s)") if count else (0, "no CUDA GPU visible here: CPU")


def partition_has_gpus(sinfo_text: str | None, partition: str | None) -> bool | None:
    """Whether a partition's nodes offer GPUs, from `sinfo --noheader --format=%P|%G` (one line per partition and
    GRES, the default partition's name ending in '*'); None when it cannot be told (no sinfo, partition not listed).
    `partition` None: the default partition."""
    found = None
    for line in (sinfo_text or "").splitlines():
        name, _, gres = line.strip().partition("|")
        if not name or (name.rstrip("*") != partition if partition else not name.endswith("*")):
            continue
        found = bool(found) or "gpu" in gres.lower()
    return found


def _sinfo_partitions() -> str | None:
    try:
        done = subprocess.run(
            ["sinfo", "--noheader", "--format=%P|%G"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout


def local_job_gpus(gpu_ids: list[str], gpus_per_run: int, job_index: int) -> list[str]:
    """The GPUs (CUDA_VISIBLE_DEVICES) of local task `job_index` (0-based): its own group of G distinct GPUs;
    with more tasks than groups, round robin (every task starts at once: a group's tasks share it). [] where no
    GPU is visible (the G processes then train on CPU) or G is 0; ConfigError when G exceeds the visible GPUs."""
    from ablate.launch.sweep import gpu_groups

    if gpus_per_run == 0 or not gpu_ids:
        return []
    groups = gpu_groups(gpu_ids, gpus_per_run)
    return groups[job_index % len(groups)]


def local_sharing(n_runs: int, gpus_per_run: int, gpu_ids: list[str] | None = None) -> int:
    """How many local tasks share each GPU group at most (they all start at once): each gets that share of it."""
    from ablate.launch.sweep import gpu_groups, visible_gpus

    if gpus_per_run == 0:
        return 1
    gpu_ids = visible_gpus() if gpu_ids is None else gpu_ids
    if not gpu_ids:
        return 1  # CPU: nothing shared
    return math.ceil(n_runs / len(gpu_groups(gpu_ids, gpus_per_run)))


class RunTask(submitit.helpers.Checkpointable if submitit else object):
    """What one array task runs: a run (with the callbacks its experiment file defines), then (on
    preemption/timeout) the same call again, counted."""

    def __init__(
        self,
        max_requeues: int,
        threads: int | None,
        experiment_file: str | None = None,
        gpu_memory_fraction: float | None = None,
    ):
        self.max_requeues, self.threads, self.experiment_file = max_requeues, threads, experiment_file
        self.gpu_memory_fraction = gpu_memory_fraction  # local tasks sharing a GPU group: each caps its allocator

    def __call__(self, run: dict | list[dict], out_root: str, requeues: int = 0) -> str | list[str]:
        """A run (a dict) or a stack of runs (a list of them, `--stack`): its state, or each run's."""
        from ablate.launch.sweep import run_one, run_stack  # imports torch: only in the task

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # G processes for one run: torchrun's variables, read by init_distributed
            # CUDA_VISIBLE_DEVICES is left alone: init_distributed takes cuda:LOCAL_RANK where the task sees all G
            # GPUs, and its only GPU where the cluster binds one per task (LOCAL_WORLD_SIZE > visible == 1)
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
            os.environ.pop("TORCHELASTIC_RUN_ID", None)  # sbatch copies the submitter's: these are not torchrun's
        if self.gpu_memory_fraction:
            os.environ[rundir.GPU_SHARE_ENV] = str(self.gpu_memory_fraction)  # init_distributed applies it
        os.environ[rundir.LOG_ENV] = str(env.paths.stdout)  # status.json names this task's console log
        runs = run if isinstance(run, list) else [run]
        if requeues and env.global_rank == 0:
            names = ", ".join(f"{r['name']} seed{r['train']['seed']}" for r in runs)
            print(f"ablate: requeue {requeues}/{self.max_requeues} of {names}: resuming", flush=True)
        if isinstance(run, list):
            return run_stack(run, out_root, threads=self.threads, experiment_file=self.experiment_file)
        return run_one(run, out_root, threads=self.threads, experiment_file=self.experiment_file)

    def checkpoint(self, run: dict | list[dict], out_root: str, requeues: int = 0):
        """Called by submitit (rank 0) on the stop signal: the call to requeue, or None to stop here. Nothing to
        save: run_one (run_stack) resumes each run from its newest checkpoint on its own."""
        run_dirs = [run_dir_for(out_root, RunConfig.from_dict(r)) for r in (run if isinstance(run, list) else [run])]
        if requeues >= self.max_requeues:
            for run_dir in run_dirs:
                print(
                    f"ablate: {run_dir}: stopped, not requeued: already requeued {requeues} times "
                    f"(max_requeues={self.max_requeues})",
                    flush=True,
                )
            return None  # submitit then ends the task with an error naming why
        for run_dir in run_dirs:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / REQUEUES_FILE).write_text(f"{requeues + 1}\n")
            print(
                f"ablate: {run_dir}: preempted or timed out, requeued ({requeues + 1}/{self.max_requeues})", flush=True
            )
        return submitit.helpers.DelayedSubmission(self, run, out_root, requeues + 1)


def executor_parameters(options: dict, name: str, local: bool) -> dict:
    """submitit parameters for one task per run with G = gpus_per_run processes (one per GPU; 1 on CPU). Locally
    each task's own GPUs are set at submission (launch: visible_gpus)."""
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


def _payload(group: list[CheckedRun]) -> dict | list[dict]:
    """What a task is given: a run's config, or a stack's (a list, `--stack`)."""
    return group[0].config.to_dict() if len(group) == 1 else [r.config.to_dict() for r in group]


def launch(
    groups: list[list[CheckedRun]],
    out_root: str,
    options: dict,
    local: bool = False,
    experiment_file: str | None = None,
) -> list:
    """Submit one array task per group (a run alone, or a stack of runs of one shape: `--stack`); return
    submitit's jobs in group order (print a line per run). Each task loads the callbacks `experiment_file` defines
    (a path every task can read)."""
    runs = [run for group in groups for run in group]
    if not runs:
        return []
    if submitit is None:
        raise ConfigError("--slurm needs submitit: pip install 'ablate[slurm]'")
    options = {**DEFAULTS, **options}
    options["gpus_per_run"], why = resolve_gpus_per_run(options, runs, local)
    if why:
        print(f"{'local' if local else 'slurm'}: gpus_per_run={options['gpus_per_run']} ({why})", flush=True)
    _check_nodes(options)
    if not local and "time" not in options:  # submitit would otherwise ask SLURM for 5 minutes
        raise ConfigError("--slurm time=MINUTES: required on a cluster (the time limit of each task)")
    experiment = runs[0].config.experiment
    folder = Path(options.get("folder") or Path(out_root) / experiment / ".slurm")
    # submitit's own timeout count also bounds requeues; ours (RunTask) counts preemptions as well
    cls = submitit.LocalExecutor if local else submitit.SlurmExecutor
    try:
        executor = cls(folder=folder, max_num_timeout=options["max_requeues"])
    except RuntimeError as exc:  # no srun on this machine
        raise ConfigError(f"--slurm: {exc}") from None
    executor.update_parameters(**executor_parameters(options, f"ablate-{experiment}", local))
    threads = _threads(options, len(groups), local)
    if not local:
        task = RunTask(options["max_requeues"], threads, experiment_file)
        jobs = executor.map_array(task, [_payload(g) for g in groups], [str(out_root)] * len(groups))
    else:
        jobs = _submit_locally(executor, groups, out_root, options, threads, experiment_file)
    for job, group in zip(jobs, groups):
        for run in group:
            print(f"submitted job {job.job_id}: {run_dir_for(out_root, run.config)}", flush=True)
    return jobs


def _submit_locally(
    executor, groups: list[list[CheckedRun]], out_root, options: dict, threads, experiment_file
) -> list:
    """One local task per group, each on its own GPUs: submitit's LocalExecutor would give every task GPUs
    0..G-1."""
    from ablate.launch.sweep import visible_gpus

    gpus, sharing = options["gpus_per_run"], 1
    gpu_ids = visible_gpus() if gpus else []
    if gpus:
        sharing = local_sharing(len(groups), gpus, gpu_ids)
        if not all(g.isdigit() for g in gpu_ids):  # submitit hands GPUs out by index only
            raise ConfigError(
                f"--launcher local: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')} names GPUs by "
                f"UUID; allowed: GPU indices (e.g. 0,1) or --launcher here"
            )
    task = RunTask(options["max_requeues"], threads, experiment_file, 1 / sharing if sharing > 1 else None)
    jobs = []
    for index, group in enumerate(groups):
        mine = local_job_gpus(gpu_ids, gpus, index)  # [] on CPU: submitit's default (none with G=0)
        executor.update_parameters(visible_gpus=tuple(int(g) for g in mine))
        jobs.append(executor.submit(task, _payload(group), str(out_root)))
    return jobs


def collect(jobs: list, groups: list[list[CheckedRun]], out_root: str) -> list[str]:
    """Wait for every task; each run's state, in group order. A task that crashed outright (killed, out of memory:
    no state returned) counts as failed for each of its runs: its message is printed and, unless a live process
    holds a run, recorded in the run's status.json as sweep's workers do."""
    states = []
    for job, group in zip(jobs, groups):
        try:
            answer = job.results()[0]  # rank 0's answer: a state, or a stack's list of them
            states += answer if isinstance(answer, list) else [answer]
            continue
        except Exception as exc:
            failure = exc
        for run in group:
            folder = run_dir_for(out_root, run.config)
            print(
                f"failed job {job.job_id}: {folder}: {type(failure).__name__}: {str(failure).strip()[-2000:]}\n"
                f"  log: {job.paths.stdout}",
                flush=True,
            )
            if not rundir.RunLock(folder).held_by_live_process():
                message = f"job {job.job_id} ended without a result ({type(failure).__name__}); see {job.paths.stdout}"
                rundir.write_status(folder, "failed", message=message, log=str(job.paths.stdout))
            states.append("failed")
    counts = {s: states.count(s) for s in ("finished", "failed", "diverged")}
    others = {s: states.count(s) for s in sorted(set(states) - set(counts))}
    print("slurm: " + ", ".join(f"{n} {s}" for s, n in {**counts, **others}.items()), flush=True)
    return states


def submit(
    runs: list[CheckedRun],
    out_root: str,
    options: dict,
    local: bool = False,
    wait: bool = True,
    experiment_file: str | None = None,
    stacks: list[list[CheckedRun]] | None = None,
) -> list[str]:
    """One job-array task per run, or per stack of runs where `stacks` are given (`--stack`; they hold every run)
    (SLURM, or real local processes with local=True), each with the callbacks `experiment_file` defines. With wait,
    the runs' final states (finished, failed, diverged, locked), in the order of `stacks` where given; without,
    the job ids."""
    groups = stacks if stacks is not None else [[run] for run in runs]
    jobs = launch(groups, out_root, options, local, experiment_file)
    return collect(jobs, groups, out_root) if wait else [str(job.job_id) for job in jobs]
