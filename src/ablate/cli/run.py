"""`ablate run FILE`: every run of an experiment file on this machine (one after another, or side by side in
worker processes) or through submitit (a SLURM job array, or its local executor).

Under torchrun every rank runs the same command; rank 0 prints.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ablate.cli.options import (
    BUDGET,
    DEVICE_MEMORY,
    MARGIN,
    RUNS_ROOT,
    SHARE,
    SLURM_OPTIONS,
    WHOLE_1,
    add_run_selection,
    number,
    one_of,
)
from ablate.config import ConfigError
from ablate.setup.overrides import parse_set_args


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("run", help="train every variant x seed of an experiment file")
    add_run_selection(
        parser, "variant names or globs (e.g. 'lr=0.01*'), comma-separated or repeated", "train.max_steps=20"
    )
    parser.add_argument("--out", default="runs", type=RUNS_ROOT, help="runs root (default: runs/)")
    parser.add_argument(
        "--jobs",
        type=WHOLE_1,
        metavar="N",
        help="runs at once on this machine, at most the number of runs (CPU: cores/N threads each; "
        "GPUs: default one per GPU)",
    )
    parser.add_argument(
        "--runs-per-gpu",
        type=WHOLE_1,
        default=1,
        metavar="K",
        help="K small runs share each GPU, each checked against and capped at 1/K of its memory",
    )
    parser.add_argument(
        "--gpus-per-run",
        type=number(int, 0),
        metavar="G",
        help="each run a torchrun group of G GPUs; 0: CPU (default: 1 where a CUDA GPU is visible, else CPU; "
        "with --launcher slurm/local as --slurm gpus_per_run, see docs/sweeps.md)",
    )
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        type=DEVICE_MEMORY,
        help="refuse runs whose per-rank memory "
        "estimate (ablate plan) exceeds SIZE, e.g. 80GiB (default: a visible GPU's memory; none on CPU)",
    )
    parser.add_argument(
        "--stack",
        type=WHOLE_1,
        metavar="K",
        help="train runs of one shape K at a time as one stacked model on one device (seeds, learning rates: runs "
        "that differ only in values), each still its own run folder (default: the file's `stack`, else 1)",
    )
    parser.add_argument(
        "--launcher",
        type=one_of("here", "local", "slurm"),
        default="here",
        metavar="LAUNCHER",
        help="here (default): this machine; slurm: a submitit job array; local: the same submitit "
        "path with its local executor",
    )
    parser.add_argument(
        "--slurm",
        metavar="KEY=VALUE,...",
        type=SLURM_OPTIONS,
        help="SLURM options, e.g. partition=gpu,time=120,gpus_per_run=1 (see README)",
    )
    _add_study_arguments(parser)
    parser.set_defaults(func=cmd_run)


def _add_study_arguments(parser) -> None:
    study = parser.add_argument_group("a study in rounds (docs/sweeps.md#studies-until-decided)")
    study.add_argument(
        "--until-decided",
        action="store_true",
        help="train in rounds: after the file's seeds, one more seed per round to every variant of a contrast "
        "still open, until every contrast is decided, --max-seeds or --budget (the rule: the file's `decision`)",
    )
    study.add_argument("--max-seeds", type=number(int, 3), metavar="N", help="at most N seeds per variant (rule: 8)")
    study.add_argument(
        "--budget",
        type=BUDGET,
        metavar="B",
        help="stop before a round that would exceed B: tokens (2e8, 500M) or hours (3h)",
    )
    study.add_argument(
        "--margin",
        action="append",
        type=MARGIN,
        metavar="METRIC=VALUE",
        help="equivalence margin of a metric, e.g. val_loss=0.01 (repeatable; without one no contrast ends equivalent)",
    )
    study.add_argument("--alpha", type=SHARE, metavar="A", help="error rate of the study's decisions (rule: 0.05)")
    study.add_argument(
        "--design",
        choices=("group_sequential", "anytime"),
        help="group_sequential (rule's default): alpha spent over the looks up to --max-seeds, fixed before round 1; "
        "anytime: valid under any extension (--max-seeds may be raised later), less power (docs/reports.md)",
    )
    study.add_argument(
        "--new-study",
        action="store_true",
        help="start a new study when the rule differs from the recorded one (the old study.json is kept)",
    )


def cmd_run(args) -> int:
    from ablate.setup.experiment import load_checked

    if args.until_decided:  # rounds of runs, each trained as below
        from ablate.launch.study import run_study

        return run_study(args, lambda runs: train_runs(runs, args, in_study=True))
    _refuse_study_flags(args)
    runs = load_checked(args.file, only=args.only, seeds=args.seeds, overrides=parse_set_args(args.set))
    return train_runs(runs, args)


def _refuse_study_flags(args) -> None:
    from ablate.launch.study import STUDY_FLAGS

    given = [f"--{name.replace('_', '-')}" for name in STUDY_FLAGS if getattr(args, name) not in (None, False, [])]
    if given:
        raise ConfigError(f"{'/'.join(given)}: only with --until-decided (a study in rounds)")


def train_runs(runs, args, in_study: bool = False) -> int:
    """Train `runs` (CheckedRuns) as `ablate run` does: here (one after another or side by side) or through
    submitit. In a study (a round of it) submitted jobs are waited for, and the closing lines leave out what to run
    next."""
    from ablate.launch.sweep import file_callbacks

    out = args.out  # checked by its rule (RUNS_ROOT): a folder, or nothing yet
    _check_cpu_runs(runs, args.gpus_per_run)
    if args.slurm and args.launcher == "here":
        raise ConfigError("--slurm: only with --launcher slurm (or local)")
    runs, finished = _split_finished(runs, out)  # before any data work, and without writing in their folders
    if not runs:
        return _closing(["finished"] * len(finished), finished, out, not in_study)

    callbacks = file_callbacks(args.file, runs)  # the file's `callbacks = [...]`, for each of its runs
    stacks = _stacks(runs, args)  # None: every run alone (--stack 1)
    if args.launcher != "here":
        return _run_submitit(runs, out, args, callbacks, in_study, finished, stacks)
    from ablate.launch import sweep

    gpu_ids = sweep.visible_gpus()  # counted without initialising CUDA here
    if "RANK" in os.environ:  # under torchrun every rank trains each run together, one after another
        if args.jobs not in (None, 1) or args.runs_per_gpu > 1 or args.gpus_per_run not in (None, 1):
            raise ConfigError(
                "--jobs/--runs-per-gpu/--gpus-per-run: not under torchrun (ablate starts the "
                "torchrun groups itself with --gpus-per-run G)"
            )
        slots = None
        _check_memory(runs, args, int(os.environ.get("WORLD_SIZE", 1)), sharing=1, on_gpu=bool(gpu_ids))
    else:
        at_most = len(stacks or runs)  # more at once than there are runs would only split the threads finer
        gpus_per_run = 1 if args.gpus_per_run is None else args.gpus_per_run  # auto: a GPU each where visible
        slots = sweep.machine_slots(
            args.jobs and min(args.jobs, at_most), min(args.runs_per_gpu, at_most), gpus_per_run, gpu_ids
        )
        on_gpu = bool(slots[0].gpus)
        sharing = max(s.sharing for s in slots)
        if stacks is not None:
            _check_stack_memory(runs, args, max(map(len, stacks)), on_gpu, sharing)
        else:
            _check_memory(runs, args, max(len(slots[0].gpus), 1), sharing, on_gpu)
    return _run_here(runs, out, slots, args.file, callbacks, gpu_ids, in_study, finished, stacks)


def _stacks(runs, args) -> list[list] | None:
    """--stack K (else the file's `stack`): the runs in stacks of runs of one shape (ablate.training.stack), told
    with why any run trains alone; None without stacking."""
    from ablate.launch.slurm import parse_slurm_options
    from ablate.setup.experiment import experiment_stack
    from ablate.training.stack import plan_stacks

    size = args.stack or experiment_stack(args.file)
    if size == 1:
        return None
    if "RANK" in os.environ:
        raise NotImplementedError("--stack: not under torchrun (a stack trains on one device); drop --stack there")
    gpus = parse_slurm_options(args.slurm or "").get("gpus_per_run", args.gpus_per_run)
    if gpus not in (None, 0, 1):
        raise ConfigError(f"--stack: a stack trains on one device; got gpus_per_run {gpus}")
    stacks, alone = plan_stacks(runs, size)
    print(f"{len(runs)} runs in {len(stacks)} stacks of at most {size}", flush=True)
    for line in alone:
        print(f"  {line}", flush=True)
    return stacks


def _check_cpu_runs(runs, gpus_per_run: int | None) -> None:
    """--gpus-per-run 0 trains on CPU: a run that insists on CUDA contradicts it."""
    if gpus_per_run == 0:
        for run in (checked.config for checked in runs):
            if run.train.device == "cuda":
                raise ConfigError(
                    f"--gpus-per-run 0: trains on CPU, but {run.name} sets train.device='cuda'; allowed with "
                    f"--gpus-per-run 0: train.device 'auto' or 'cpu'"
                )


def _check_memory(runs, args, world: int, sharing: int, on_gpu: bool) -> None:
    """Refuse, before any compute, runs whose per-rank memory (ablate plan's estimate) exceeds their share of the
    device memory: --device-memory or the visible GPU's memory, divided by the `sharing` runs that use each GPU at
    once (--runs-per-gpu K). On CPU without --device-memory nothing is checked."""
    from ablate.cost.memory import check_fits

    memory = _device_memory(args, on_gpu)
    if memory is None:
        return
    for run in runs:
        check_fits(run, world, memory // sharing, None if on_gpu else "cpu")


def _device_memory(args, on_gpu: bool) -> int | None:
    """--device-memory, else a visible GPU's memory; None on CPU without --device-memory (nothing is checked)."""
    from ablate.cost.memory import device_memory_default, parse_size

    if args.device_memory:
        return parse_size(args.device_memory)
    return device_memory_default() if on_gpu else None  # read in a child process: this one never initialises CUDA


def _check_stack_memory(runs, args, size: int, on_gpu: bool, sharing: int = 1) -> None:
    """Refuse, before any compute, stacks whose peak (ablate plan --stack's estimate: every member's parameters,
    gradients, optimizer state and activations) exceeds their share of the device memory (`sharing` stacks a GPU,
    --runs-per-gpu), naming the largest stack that fits."""
    from ablate.cost import plan

    memory = _device_memory(args, on_gpu)
    if memory is None:
        return
    memory //= sharing
    stacks, _ = plan.plan_stacks(runs, size, memory)
    unfit = plan.unfit_stacks(stacks, memory)
    if unfit:
        raise ConfigError(plan.stack_refusal(unfit, memory))


def _split_finished(runs, out: str) -> tuple[list, list]:
    """(runs to train, runs found finished): a finished run of the same config is told as such, from its files
    alone (no data is read, hashed or tokenized for it, and nothing in its folder is written)."""
    from ablate import rundir
    from ablate.launch.sweep import finished_message, run_label

    to_train, finished = [], []
    for k, checked in enumerate(runs, 1):
        run = checked.config
        run_dir = rundir.run_dir_for(out, run)
        summary = rundir.finished_summary(run_dir, run.identity())
        if summary is None:
            to_train.append(checked)
            continue
        finished.append(checked)
        if int(os.environ.get("RANK", 0)) == 0:  # as the sweep's console tells a run's end
            print(
                f"run {k}/{len(runs)} finished {run_label(run)}: {finished_message(run, run_dir, summary)}", flush=True
            )
    return to_train, finished


def _run_here(
    runs, out: str, slots, file: str, callbacks: list, gpu_ids: list[str], in_study: bool, finished: list, stacks=None
) -> int:
    """All runs on this machine: in this process one after another, or side by side in worker processes (which
    load the experiment file's callbacks themselves); each stack (`stacks`, --stack) as one. The parent of workers
    makes no process group and touches no GPU: each worker's CUDA context, and all of its memory, stay the
    worker's."""
    from ablate.launch import sweep
    from ablate.training.parallel import init_distributed, shutdown_distributed

    serial = sweep.in_this_process(slots, gpu_ids)
    d = init_distributed(runs[0].config.train.device) if serial else None
    is_main = d is None or d.is_main
    states: list[str] = []
    progress = _Progress(len(runs), is_main)
    groups = stacks if stacks is not None else [[run] for run in runs]
    try:
        sweep.prepare_all(runs, d)  # bad data stops everything here, before any run starts
        if is_main:
            _mark_pending(runs, out)
        if serial:
            states = _one_after_another(groups, out, callbacks, progress)
        else:
            what = f"{len(groups)} stacks" if stacks is not None else f"{len(runs)} runs"
            print(f"{what}, {len(slots)} at a time ({_describe(slots)})", flush=True)
            states = sweep.run_side_by_side(runs, out, slots, progress, _file_for_workers(file), stacks)
    except KeyboardInterrupt:
        if is_main:
            _tell_interrupted(runs, out)
        return 130
    finally:
        shutdown_distributed()
    if not is_main:
        return int("failed" in states)
    return _closing(states + ["finished"] * len(finished), runs + finished, out, not in_study)


def _one_after_another(groups: list[list], out: str, callbacks: list, progress) -> list[str]:
    """Each group in this process: a run alone (sweep.attempt) or a stack (sweep.attempt_stack); the states."""
    from ablate import rundir
    from ablate.launch import sweep

    states: list[str] = []
    for group in groups:
        first = len(states) + 1
        if len(group) > 1:
            print(f"stack of {len(group)}: {', '.join(sweep.run_label(r.config) for r in group)}", flush=True)
        for k, run in enumerate(group, first):
            progress(k, run, "started", str(rundir.run_dir_for(out, run.config)))
        with sweep.survivors_frozen():  # the collection after each run walks only that run's objects
            outcomes = (
                sweep.attempt_stack(group, out, callbacks)
                if len(group) > 1
                else [sweep.attempt(group[0], out, callbacks)]
            )
        for k, (run, (state, message)) in enumerate(zip(group, outcomes), first):
            progress(k, run, state, message)
            states.append(state)
    return states


def _tell_interrupted(runs, out: str) -> None:
    """After Ctrl-C: each interrupted run's status line (where it resumes)."""
    from ablate import rundir
    from ablate.launch.sweep import run_label

    for run in (checked.config for checked in runs):
        status = rundir.read_status(rundir.run_dir_for(out, run)) or {}
        if status.get("state") == "interrupted":
            print(f"{run_label(run)}: {status['message']}", file=sys.stderr, flush=True)


class _Progress:
    """The sweep's console: run k/N as each starts and ends."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled

    def __call__(self, index, checked, state, message) -> None:
        from ablate.launch.sweep import run_label

        if self.enabled:
            print(f"run {index}/{self.total} {state} {run_label(checked.config)}: {message}", flush=True)


def _describe(slots) -> str:
    if not slots[0].gpus:
        return f"{slots[0].threads} torch thread{'s' if slots[0].threads > 1 else ''} each"
    share = f"; {slots[0].sharing} runs per GPU, each capped at 1/{slots[0].sharing} of its memory"
    listed = "; ".join(f"GPU {','.join(s.gpus)}" for s in slots[:8]) + (" ..." if len(slots) > 8 else "")
    return listed + (share if slots[0].sharing > 1 else "")


def _mark_pending(runs, out: str) -> None:
    """`ablate status` lists queued runs too; a folder that already has a status keeps it."""
    from ablate import rundir

    for run in (checked.config for checked in runs):
        run_dir = rundir.run_dir_for(out, run)
        if not (run_dir / rundir.STATUS).exists() and not (run_dir / rundir.SUMMARY).exists():
            rundir.write_status(run_dir, "pending", step=0, max_steps=run.train.max_steps, message="")


def _closing(states: list[str], runs, out: str, say_next: bool = True) -> int:
    """How many finished, failed, diverged; what to run next. Exit 1 when any run failed."""
    counts = {s: states.count(s) for s in ("finished", "failed", "diverged", "locked", "interrupted") if s in states}
    text = ", ".join(f"{n} {'skipped (locked by another process)' if s == 'locked' else s}" for s, n in counts.items())
    print(f"{len(states)} run{'s' if len(states) != 1 else ''}: {text}", flush=True)
    for experiment in sorted({r.config.experiment for r in runs} if say_next else ()):
        print(f"next: ablate status {out}/{experiment}   ablate report {out}/{experiment}", flush=True)
    return 1 if counts.get("failed") else 0


def _file_for_workers(file: str) -> str:
    """The experiment file, which every worker process loads (always: what it registers, an optimizer, a
    component or a task, must be known there too, not only its callbacks)."""
    return str(Path(file).resolve())


def _run_submitit(runs, out: str, args, callbacks: list, in_study: bool, finished: list, stacks=None) -> int:
    """Through submitit: one task per run, or per stack of runs (`stacks`, --stack)."""
    from ablate.launch import slurm

    if args.jobs not in (None, 1) or args.runs_per_gpu > 1:
        raise ConfigError(
            "--jobs/--runs-per-gpu: not with --launcher slurm/local; use --slurm array_parallelism=N,gpus_per_run=G"
        )
    options = slurm.parse_slurm_options(args.slurm or "")
    if args.gpus_per_run is not None:  # --gpus-per-run G (0 included: CPU) means the same as --slurm gpus_per_run=G
        given = options.get("gpus_per_run", args.gpus_per_run)
        if given != args.gpus_per_run:
            raise ConfigError(
                f"--gpus-per-run {args.gpus_per_run} and --slurm gpus_per_run={given}: they disagree; give one"
            )
        options["gpus_per_run"] = args.gpus_per_run
    options["gpus_per_run"], why = slurm.resolve_gpus_per_run(options, runs, local=args.launcher == "local")
    if why:
        print(f"{args.launcher}: gpus_per_run={options['gpus_per_run']} ({why})", flush=True)
    tasks = len(stacks) if stacks is not None else len(runs)
    sharing = slurm.local_sharing(tasks, options["gpus_per_run"]) if args.launcher == "local" else 1
    if stacks is not None:  # one device a stack (the size given back by the stacks: they regroup the same)
        _check_stack_memory(runs, args, max(map(len, stacks)), on_gpu=options["gpus_per_run"] > 0)
    else:
        _check_memory(runs, args, max(options["gpus_per_run"], 1), sharing, on_gpu=options["gpus_per_run"] > 0)
    from ablate.launch.sweep import prepare_all

    if args.launcher == "local":
        prepare_all(runs)  # on a cluster each task builds (or finds) the shared cache itself
    _mark_pending(runs, out)
    if args.launcher == "slurm" and not in_study:  # a sweep outlives a login shell: submit, then follow it
        slurm.submit(runs, out, options, wait=False, experiment_file=_file_for_workers(args.file), stacks=stacks)
        for experiment in sorted({r.config.experiment for r in runs}):
            print(
                f"submitted {len(runs)} runs; follow them: ablate status {out}/{experiment} --watch; then ablate "
                f"report {out}/{experiment}",
                flush=True,
            )
        return 0
    # local jobs, and a study's rounds on SLURM (the next round depends on this one): wait for them
    local = args.launcher == "local"
    states = slurm.submit(runs, out, options, local=local, experiment_file=_file_for_workers(args.file), stacks=stacks)
    return _closing(states + ["finished"] * len(finished), runs + finished, out, not in_study)
