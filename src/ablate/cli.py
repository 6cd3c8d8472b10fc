"""`ablate` command line: thin wrappers over library calls.

Under torchrun every rank runs the same command; rank 0 prints.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path

from ablate.config import ConfigError, parse_set_args


# ---------------------------------------------------------------------------------------------------------------
# option values: each option's argparse type is a rule below, so a wrong value stops the command in one line,
# `ablate: error: --option VALUE: allowed: ...`, exit 2, before anything is read, computed or written


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line without the usage block (--help still prints it)."""

    def error(self, message):
        head, sep, rest = message.partition(": ")
        if sep and head.startswith("argument "):  # argparse's "argument --limit: <what the rule said>"
            option = head.removeprefix("argument ").split("/")[-1]
            if rest.startswith(option):  # a library check that names the option itself
                message = rest
            else:
                message = f"{option} {rest}" if "allowed: " in rest else f"{option}: {rest}"
        else:
            message = f"{message} (see {self.prog} --help)"
        self.exit(2, f"ablate: error: {message}\n")


class _Why(ValueError):
    """A value refused for a reason the rule's allowed values do not say (e.g. no GPU here)."""


def _rule(convert, allowed: str):
    """An argparse type: convert(text) returns the value or raises ValueError; the refusal reads
    `VALUE: [why; ]allowed: ALLOWED` and the parser puts the option in front of it."""
    def check(text: str):
        try:
            return convert(text)
        except _Why as exc:
            why = f"{exc}; "
        except ValueError:
            why = ""
        raise argparse.ArgumentTypeError(f"{text if text.strip() else repr(text)}: {why}allowed: {allowed}")
    return check


def _number(kind: type, low: float, high: float | None = None, open_low: bool = False, open_high: bool = False,
            noun: str | None = None):
    """A finite int or float within bounds: _number(float, 0, 1, True, True) is the open interval (0, 1)."""
    def convert(text: str):
        value = kind(text)
        if not (math.isfinite(value) and (value > low if open_low else value >= low)
                and (high is None or (value < high if open_high else value <= high))):
            raise ValueError(text)
        return value
    noun = noun or ("a whole number" if kind is int else "a number")
    if high is None:
        return _rule(convert, f"{noun} {'>' if open_low else '>='} {low}")
    span = f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    return _rule(convert, span if noun == "a number" else f"{noun} {span}")  # "in (0, 1)" says it is a number


def _one_of(*names: str):
    def convert(text: str) -> str:
        if text not in names:
            raise ValueError(text)
        return text
    return _rule(convert, ", ".join(names))


def _text(allowed: str, check=None, names: bool = False):
    """Non-blank text (names: at least one comma-separated name) as typed, or what `check` returns. `check` is a
    library function whose ValueError names the option itself (an unknown task, a file for a folder): its line
    is passed through."""
    def convert(text: str):
        if not any(part.strip() for part in (text.split(",") if names else [text])):
            raise ValueError(text)
        try:
            checked = check(text) if check else None
        except _Why:
            raise
        except (ValueError, NotImplementedError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text if checked is None else checked
    return _rule(convert, allowed)


def _seed_list(text: str) -> list[int]:
    seeds = [int(x) for x in text.split(",") if x.strip()]  # negative or repeated: load_experiment says so
    if not seeds:
        raise ValueError(text)
    return seeds


def _size(text: str) -> str:
    from ablate.plan import parse_size

    if parse_size(text) <= 0:
        raise ValueError(text)
    return text


def _set_pair(text: str) -> str:
    parse_set_args([text])  # ConfigError (a ValueError) when there is no section.field=
    return text


def _runs_root(text: str) -> str:
    """--out: a folder, made if missing (experiment.check_out_dir says why not in its own line)."""
    from ablate.experiment import check_out_dir

    return str(check_out_dir(text))


def _samples_file(text: str) -> str:
    path = Path(text).expanduser()
    if path.is_dir():
        raise _Why("is a folder")
    if not path.parent.is_dir():
        raise _Why(f"{path.parent} is not a folder")
    return text


def _device(text: str) -> str:
    if text == "cpu":
        return text
    if not re.fullmatch(r"cuda(:[0-9]+)?", text):
        raise ValueError(text)
    import torch

    if not torch.cuda.is_available():
        raise _Why("no CUDA device is visible here")
    if int(text.partition(":")[2] or 0) >= torch.cuda.device_count():
        raise _Why(f"{torch.cuda.device_count()} CUDA devices are visible here")
    return text


def _tasks(text: str) -> None:
    from ablate.eval.suite import parse_tasks

    parse_tasks(text)


def _format(text: str) -> None:
    from ablate.eval.suite import check_format

    check_format(text)


def _slurm(text: str) -> None:
    from ablate.slurm import parse_slurm_options

    parse_slurm_options(text)


# the rules several options share
WHOLE_1 = _number(int, 1)
SHARE = _number(float, 0, 1, open_low=True, open_high=True)
CORRELATION = _number(float, -1, 1)
NON_NEGATIVE = _number(float, 0)
ONLY = _text("variant names or globs, comma-separated, e.g. 'lr=0.01*'", names=True)
SEEDS = _rule(_seed_list, "comma-separated whole numbers >= 0, e.g. 0,1,2")
SET = _rule(_set_pair, "SECTION.FIELD=VALUE, e.g. train.max_steps=20")
DEVICE_MEMORY = _rule(_size, "a size > 0 such as 24GiB, 80GB or 512MiB")
RUNS_ROOT = _text("a folder (created if missing)", _runs_root)
PATH = _text("a path")  # positionals: '' would silently mean the current folder


def cmd_run(args) -> int:
    from ablate.experiment import load_experiment

    out = args.out  # checked by its rule (RUNS_ROOT): a folder, or nothing yet
    runs = load_experiment(args.file, only=args.only, seeds=args.seeds, overrides=parse_set_args(args.set))
    _check_memory(runs, args)
    if args.launcher != "here":
        return _run_submitit(runs, out, args)
    if args.slurm:
        raise ConfigError("--slurm: only with --launcher slurm (or local)")
    from ablate import sweep

    if "RANK" in os.environ:  # under torchrun every rank trains each run together, one after another
        if args.jobs not in (None, 1) or args.runs_per_gpu > 1 or args.gpus_per_run > 1:
            raise ConfigError("--jobs/--runs-per-gpu/--gpus-per-run: not under torchrun (ablate starts the "
                              "torchrun groups itself with --gpus-per-run G)")
        slots = None
    else:
        at_most = len(runs)  # more runs at once than there are runs would only split the threads finer
        slots = sweep.machine_slots(args.jobs and min(args.jobs, at_most), min(args.runs_per_gpu, at_most),
                                    args.gpus_per_run)
    return _run_here(runs, out, slots)


def _check_memory(runs, args) -> None:
    """Refuse, before any compute, runs whose per-rank memory (ablate plan's estimate) exceeds --device-memory or
    the visible GPU's memory; on CPU without --device-memory nothing is checked."""
    from ablate.plan import check_fits, device_memory_default, parse_size

    memory = parse_size(args.device_memory) if args.device_memory else device_memory_default()
    if memory is None:
        return
    world = int(os.environ.get("WORLD_SIZE", 1)) * max(args.gpus_per_run, 1)
    for run in runs:
        check_fits(run, world, memory)


def _run_here(runs, out: str, slots) -> int:
    """All runs on this machine: in this process one after another, or side by side in worker processes."""
    from ablate import rundir, sweep
    from ablate.parallel import init_distributed, shutdown_distributed

    d = init_distributed(runs[0].train.device)
    states: list[str] = []
    progress = _Progress(len(runs), d.is_main)
    try:
        sweep.prepare_all(runs, d)  # bad data stops everything here, before any run starts
        if d.is_main:
            _mark_pending(runs, out)
        if slots is None or (len(slots) == 1 and len(slots[0].gpus) <= 1):
            for k, run in enumerate(runs, 1):
                progress(k, run, "started", str(rundir.run_dir_for(out, run)))
                state, message = sweep.attempt(run, out)
                progress(k, run, state, message)
                states.append(state)
        else:
            shutdown_distributed()  # the workers make their own process groups
            if d.is_main:
                print(f"{len(runs)} runs, {len(slots)} at a time ({_describe(slots)})", flush=True)
            states = sweep.run_side_by_side(runs, out, slots, progress)
    except KeyboardInterrupt:
        for run in runs:
            status = rundir.read_status(rundir.run_dir_for(out, run)) or {}
            if status.get("state") == "interrupted" and d.is_main:
                print(f"{sweep.label(run)}: {status['message']}", file=sys.stderr, flush=True)
        return 130
    finally:
        shutdown_distributed()
    return _closing(states, runs, out) if d.is_main else int("failed" in states)


class _Progress:
    """The sweep's console: run k/N as each starts and ends."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled

    def __call__(self, index, run, state, message) -> None:
        from ablate.sweep import label

        if self.enabled:
            print(f"run {index}/{self.total} {state} {label(run)}: {message}", flush=True)


def _describe(slots) -> str:
    if not slots[0].gpus:
        return f"{slots[0].threads} torch thread{'s' if slots[0].threads > 1 else ''} each"
    return "; ".join(f"GPU {','.join(s.gpus)}" for s in slots[:8]) + (" ..." if len(slots) > 8 else "")


def _mark_pending(runs, out: str) -> None:
    """`ablate status` lists queued runs too; a folder that already has a status keeps it."""
    from ablate import rundir

    for run in runs:
        run_dir = rundir.run_dir_for(out, run)
        if not (run_dir / rundir.STATUS).exists() and not (run_dir / rundir.SUMMARY).exists():
            rundir.write_status(run_dir, "pending", step=0, max_steps=run.train.max_steps, message="")


def _closing(states: list[str], runs, out: str) -> int:
    """How many finished, failed, diverged; what to run next. Exit 1 when any run failed."""
    counts = {s: states.count(s) for s in ("finished", "failed", "diverged", "locked", "interrupted") if s in states}
    text = ", ".join(f"{n} {'skipped (locked by another process)' if s == 'locked' else s}" for s, n in counts.items())
    print(f"{len(states)} run{'s' if len(states) != 1 else ''}: {text}", flush=True)
    for experiment in sorted({r.experiment for r in runs}):
        print(f"next: ablate status {out}/{experiment}   ablate report {out}/{experiment}", flush=True)
    return 1 if counts.get("failed") else 0


def _run_submitit(runs, out: str, args) -> int:
    from ablate import slurm

    if args.jobs not in (None, 1) or args.runs_per_gpu > 1:
        raise ConfigError("--jobs/--runs-per-gpu: not with --launcher slurm/local; use --slurm "
                          "array_parallelism=N,gpus_per_run=G")
    options = slurm.parse_slurm_options(args.slurm or "")
    if args.gpus_per_run > 1:  # --gpus-per-run G means the same as --slurm gpus_per_run=G
        options["gpus_per_run"] = args.gpus_per_run
    from ablate.sweep import prepare_all

    if args.launcher == "local":
        prepare_all(runs)  # on a cluster each task builds (or finds) the shared cache itself
    _mark_pending(runs, out)
    if args.launcher == "slurm":  # a sweep outlives a login shell: submit, then follow it with ablate status
        slurm.submit(runs, out, options, wait=False)
        for experiment in sorted({r.experiment for r in runs}):
            print(f"submitted {len(runs)} runs; follow them: ablate status {out}/{experiment} --watch; then ablate "
                  f"report {out}/{experiment}", flush=True)
        return 0
    return _closing(slurm.submit(runs, out, options, local=True), runs, out)


def cmd_plan(args) -> int:
    """Parameters, FLOPs, tokens, per-rank memory and time of every run, before any compute; runs that cannot fit
    the device memory are refused (exit 2)."""
    from ablate import plan
    from ablate.experiment import load_experiment

    overrides = parse_set_args(args.set)
    if args.dtype:
        overrides["train.dtype"] = args.dtype
    runs = load_experiment(args.file, only=args.only, seeds=args.seeds, overrides=overrides)
    device_memory = plan.parse_size(args.device_memory) if args.device_memory else plan.device_memory_default()
    plans = [plan.plan_run(run, args.world_size) for run in runs]
    mfu, mfu_source = plan.earlier_mfu(args.out, runs[0].experiment)
    print(plan.format_report(plans, args.world_size, device_memory, mfu, mfu_source), flush=True)
    unfit = plan.unfit(plans, device_memory)
    if unfit:
        raise ConfigError(plan.refusal(unfit, args.world_size, device_memory))
    return 0


def cmd_status(args) -> int:
    from ablate.status import show

    try:
        return show(args.runs_dir, watch=args.watch)
    except KeyboardInterrupt:
        return 0


def _bad_input(fn):
    """Eval/export mistakes (unknown task, bad format, not a run, unexportable model) as one-line errors."""
    def wrapped(args) -> int:
        try:
            return fn(args)
        except (ValueError, FileNotFoundError, ModuleNotFoundError, NotImplementedError) as exc:
            raise ConfigError(str(exc)) from exc
    return wrapped


@_bad_input
def cmd_eval(args) -> int:
    import torch

    from ablate import rundir
    from ablate.eval import engine, suite
    from ablate.load import load_model

    if args.list:
        print(suite.format_task_list(args.limit or None))
        return 0
    if not args.path:
        raise ValueError("ablate eval: a run folder or checkpoint to score is required (or --list)")
    tasks = suite.parse_tasks(args.tasks) if args.tasks else list(suite.all_tasks())
    if args.every_checkpoint:
        return _score_every_checkpoint(args, tasks)
    loaded = load_model(args.path, device=args.device)
    # bf16: matmuls in bf16 under autocast, log-likelihoods still summed in fp32 (as in-training evals of bf16 runs)
    autocast = torch.autocast(torch.device(args.device).type, dtype=torch.bfloat16) if args.dtype == "bf16" else None
    lm = engine.for_transformer(loaded.model, max_len=loaded.run.data.seq_len, device=args.device, autocast=autocast)
    results = suite.evaluate(lm, loaded.tokenizer(), tasks, args.format, args.limit or None, args.batch_size,
                             log_samples=bool(args.log_samples))
    print(f"{loaded.checkpoint} (step {loaded.step}, {loaded.tokens} tokens, {args.dtype})")
    print(suite.format_table(results))
    if not args.no_write:
        replaced = suite.write_results(loaded.run_dir, loaded.step, loaded.tokens, results)
        print(f"appended to {loaded.run_dir / rundir.EVALS}")
        for line in replaced:  # the report reads the latest evaluation of a step
            print(f"replaced an earlier evaluation's items at step {loaded.step}: {line}")
    if args.log_samples:
        suite.write_samples(args.log_samples, results)
        print(f"samples: {args.log_samples}")
    return 0


def _score_every_checkpoint(args, tasks: list[str]) -> int:
    from ablate.score import score_checkpoints

    if args.log_samples or args.no_write:
        raise ValueError("--every-checkpoint: writes each evaluation to its run folder; not with --log-samples "
                         "or --no-write (score one checkpoint for those)")
    done = score_checkpoints(args.path, tasks, args.format, args.limit or None, args.batch_size, args.device,
                             args.dtype, rescore=args.rescore)
    for line in done.skipped:
        print(f"skipped {line}")
    print(f"scored {len(done.written)} checkpoint(s) in {done.seconds:.1f}s", flush=True)
    return 0


@_bad_input
def cmd_export(args) -> int:
    from ablate.export import export_hf

    replaced, kept = export_hf(args.checkpoint, args.hf, force=args.force)
    print(f"wrote a transformers model to {args.hf}")
    if replaced:
        print(f"--force: replaced {len(replaced)} existing file(s): {', '.join(replaced)}")
    if kept:
        print(f"--force: left {len(kept)} other entr{'ies' if len(kept) > 1 else 'y'} as they were: {', '.join(kept)}")
    return 0


def cmd_report(args) -> int:
    import time

    from ablate.report import Options, ReportError, write_report

    start = time.perf_counter()
    opts = Options(alpha=args.alpha, min_seeds=args.min_seeds, power=args.power,
                   min_shared_items=args.min_shared_items, min_monotonicity=args.min_monotonicity,
                   min_tau=args.min_tau, min_z=args.min_z, min_snr=args.min_snr, last_k=args.last_k,
                   early_fraction=args.early_fraction, bootstrap=args.bootstrap, scale=[f for f in (args.scale or "").split(",") if f],
                   average_last=args.average_last, subject_snr_floor=args.subject_snr_floor)
    out = args.out or args.runs_dir
    try:
        report = write_report(args.runs_dir, out, opts)
    except ReportError as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2
    print(report["headline"]["text"])
    print(f"wrote {out}/report.html, report.md, report.json in {time.perf_counter() - start:.1f}s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ablate", description="Pre-training ablations: train variants, compare them.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every variant x seed of an experiment file")
    run.add_argument("file", type=PATH, help="experiment file (Python) defining `runs`")
    run.add_argument("--only", action="append", type=ONLY,
                     help="variant names or globs (e.g. 'lr=0.01*'), comma-separated or repeated")
    run.add_argument("--seeds", type=SEEDS, help="comma-separated seeds, overriding the file's `seeds`")
    run.add_argument("--out", default="runs", type=RUNS_ROOT, help="runs root (default: runs/)")
    run.add_argument("--set", action="append", default=[], type=SET, metavar="SECTION.FIELD=VALUE",
                     help="override a config field, e.g. --set train.max_steps=20 (repeatable)")
    run.add_argument("--jobs", type=WHOLE_1, metavar="N",
                     help="runs at once on this machine, at most the number of runs (CPU: cores/N threads each; "
                          "GPUs: default one per GPU)")
    run.add_argument("--runs-per-gpu", type=WHOLE_1, default=1, metavar="K", help="several small runs share each GPU")
    run.add_argument("--gpus-per-run", type=WHOLE_1, default=1, metavar="G", help="each run a torchrun group of G GPUs")
    run.add_argument("--device-memory", metavar="SIZE", type=DEVICE_MEMORY, help="refuse runs whose per-rank memory "
                     "estimate (ablate plan) exceeds SIZE, e.g. 80GiB (default: a visible GPU's memory; none on CPU)")
    run.add_argument("--launcher", type=_one_of("here", "local", "slurm"), default="here", metavar="LAUNCHER",
                     help="here (default): this machine; slurm: a submitit job array; local: the same submitit "
                          "path with its local executor")
    run.add_argument("--slurm", metavar="KEY=VALUE,...", type=_text("KEY=VALUE,... (see README)", _slurm),
                     help="SLURM options, e.g. partition=gpu,time=120,gpus_per_run=1 (see README)")
    run.set_defaults(func=cmd_run)
    pl = sub.add_parser("plan", help="what each run costs (parameters, FLOPs, tokens, per-rank memory, time) before "
                                     "any compute; refuses runs that cannot fit the device memory")
    pl.add_argument("file", type=PATH, help="experiment file (Python) defining `runs`")
    pl.add_argument("--only", action="append", type=ONLY, help="variant names or globs, comma-separated or repeated")
    pl.add_argument("--seeds", type=SEEDS, help="comma-separated seeds, overriding the file's `seeds`")
    pl.add_argument("--set", action="append", default=[], type=SET, metavar="SECTION.FIELD=VALUE",
                    help="override a config field, e.g. --set train.micro_batch=8 (repeatable)")
    pl.add_argument("--world-size", type=WHOLE_1, default=1, metavar="N", help="ranks FSDP2 shards over (default 1)")
    pl.add_argument("--device-memory", metavar="SIZE", type=DEVICE_MEMORY,
                    help="memory per device, e.g. 24GiB or 80GB (default: the visible GPU's, else no check)")
    pl.add_argument("--dtype", type=_one_of("auto", "fp32", "bf16"), metavar="auto|fp32|bf16",
                    help="override train.dtype")
    pl.add_argument("--out", default="runs", type=RUNS_ROOT,
                    help="runs root whose finished runs give the MFU (default: runs/)")
    pl.set_defaults(func=cmd_plan)
    st = sub.add_parser("status", help="one line per run: state, step, loss, tokens/s, ETA, failures")
    st.add_argument("runs_dir", type=PATH, help="runs/ or runs/<experiment>/")
    st.add_argument("--watch", type=_number(float, 0, 86400, open_low=True, noun="seconds"), nargs="?", const=5.0,
                    metavar="SECONDS", help="refresh every SECONDS (5; at most a day) until nothing runs")
    st.set_defaults(func=cmd_status)
    ev = sub.add_parser("eval", help="score a run or checkpoint on the cloze task suite")
    ev.add_argument("path", nargs="?", help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    ev.add_argument("--tasks", type=_text("task or suite names, comma-separated", _tasks, names=True),
                    help="comma-separated task and suite names, e.g. small,boolq (default: all)")
    ev.add_argument("--list", action="store_true", help="print the tasks and suites with their item counts")
    ev.add_argument("--limit", type=_number(int, 0), default=1000,
                    help="items per task, a fixed-seed subsample (default 1000); 0: every item of each task")
    ev.add_argument("--format", default="cf", type=_text("cf, mcf", _format),
                    help="cf (cloze) or mcf (multiple-choice letters)")
    ev.add_argument("--batch-size", type=WHOLE_1, default=32, help="rows per forward pass")
    ev.add_argument("--device", default="cpu", type=_rule(_device, "cpu, cuda, cuda:N"), help="cpu or cuda")
    ev.add_argument("--dtype", default="fp32", type=_one_of("fp32", "bf16"), metavar="fp32|bf16",
                    help="bf16: autocast matmuls (default fp32)")
    ev.add_argument("--log-samples", metavar="FILE", type=_text("a file in an existing folder", _samples_file),
                    help="write one JSON line per request and per item")
    ev.add_argument("--no-write", action="store_true", help="print only; leave evals.jsonl and eval_items/ alone")
    ev.add_argument("--every-checkpoint", action="store_true",
                    help="PATH is a run, an experiment or a runs root: score every kept checkpoint of every run "
                         "on the tasks it was not scored on yet (one process; requests tokenized once)")
    ev.add_argument("--rescore", action="store_true", help="with --every-checkpoint: score scored ones again too")
    ev.set_defaults(func=cmd_eval)
    ex = sub.add_parser("export", help="write a checkpoint as a transformers model (safetensors + config + tokenizer)")
    ex.add_argument("checkpoint", type=PATH, help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    ex.add_argument("--hf", required=True, metavar="DIR", type=_text("a folder, new or empty"),
                    help="output folder, new or empty")
    ex.add_argument("--force", action="store_true",
                    help="write into a non-empty DIR, replacing the files the export writes (says which)")
    ex.set_defaults(func=cmd_export)
    rep = sub.add_parser("report", help="compare the runs of one experiment: report.html, report.md, report.json")
    rep.add_argument("runs_dir", type=PATH, help="runs/<experiment>/ holding <variant>/seed<k>/ run folders")
    rep.add_argument("--out", type=RUNS_ROOT, help="folder for the report files (default: RUNS_DIR)")
    rep.add_argument("--scale", type=_text("config fields, comma-separated, e.g. model.d_model", names=True),
                     help="config field(s) forming a scale axis, e.g. model.d_model (comma-separated)")
    rep.add_argument("--alpha", type=SHARE, default=0.05,
                     help="significance level of seed-level tests after Benjamini-Hochberg (0.05)")
    rep.add_argument("--min-seeds", type=_number(int, 2), default=3,
                     help="seeds per variant needed to test a difference (3)")
    rep.add_argument("--power", type=SHARE, default=0.8, help="the power 'seeds needed' is estimated for (0.8)")
    rep.add_argument("--min-shared-items", type=_number(float, 0, 1, open_low=True), default=0.5,
                     help="runs scored different items: compare over shared ids when they are >= this share (0.5)")
    rep.add_argument("--min-monotonicity", type=CORRELATION, default=0.5, help="early-signal threshold on Spearman rho")
    rep.add_argument("--min-tau", type=CORRELATION, default=0.6, help="threshold on Kendall tau over the second half")
    rep.add_argument("--min-z", type=NON_NEGATIVE, default=2.0, help="standard errors past chance to count as above it")
    rep.add_argument("--min-snr", type=NON_NEGATIVE, help="optional threshold on the signal-to-noise ratio (off)")
    rep.add_argument("--last-k", type=_number(int, 2), default=3,
                     help="last checkpoints whose spread is a run's noise (3)")
    rep.add_argument("--early-fraction", type=SHARE, default=0.25,
                     help="share of training of the 'early' checkpoint for decision accuracy (0.25)")
    rep.add_argument("--bootstrap", type=_number(int, 100, 1_000_000), default=2000,
                     help="bootstrap replicates for CIs (2000)")
    rep.add_argument("--average-last", type=_number(int, 1), default=1, metavar="K",
                     help="a run's score: the mean of its last K evaluations, less checkpoint noise (1: the last)")
    rep.add_argument("--subject-snr-floor", type=_number(float, 0, open_low=True), metavar="X",
                     help="leave a grouped task's subjects (MMLU) of SNR below X out of its average (off)")
    rep.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ablate.experiment import ExperimentError
    from ablate.rundir import RunFolderError

    try:
        return args.func(args)
    except (ConfigError, ExperimentError, RunFolderError) as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
