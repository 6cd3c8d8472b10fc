"""`ablate` command line: thin wrappers over library calls. The values each option accepts are in cli_options,
`ablate run` in cli_run.

Under torchrun every rank runs the same command; rank 0 prints.
"""

from __future__ import annotations

import argparse
import sys

from ablate.cli.options import (
    CORRELATION,
    DEVICE,
    DEVICE_MEMORY,
    EVAL_FORMAT,
    NON_NEGATIVE,
    ONLY,
    PATH,
    RUNS_ROOT,
    BUDGET,
    MARGIN,
    SAMPLES_FILE,
    SEEDS,
    SET,
    SHARE,
    SLURM_OPTIONS,
    TASKS,
    WHOLE_1,
    Parser,
    number,
    one_of,
    text,
)
from ablate.cli.run import cmd_run
from ablate.config import ConfigError
from ablate.setup.overrides import parse_set_args


def cmd_plan(args) -> int:
    """Parameters, FLOPs, tokens, per-rank memory and time of every run, before any compute; runs that cannot fit
    the device memory are refused (exit 2)."""
    from ablate.cost import memory
    from ablate.cost import plan
    from ablate.setup.experiment import load_experiment

    overrides = parse_set_args(args.set)
    if args.dtype:
        overrides["train.dtype"] = args.dtype
    runs = load_experiment(args.file, only=args.only, seeds=args.seeds, overrides=overrides)
    device_memory = memory.parse_size(args.device_memory) if args.device_memory else memory.device_memory_default()
    plans = [plan.plan_run(run, args.world_size) for run in runs]
    mfu, mfu_source = plan.earlier_mfu(args.out, runs[0].experiment)
    print(plan.format_report(plans, args.world_size, device_memory, mfu, mfu_source), flush=True)
    unfit = plan.unfit(plans, device_memory)
    if unfit:
        raise ConfigError(memory.refusal(unfit, args.world_size, device_memory))
    return 0


def cmd_status(args) -> int:
    from ablate.cli.status import show

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


def _metrics(text: str) -> None:
    from ablate.eval.suite import parse_metrics

    parse_metrics(text)


@_bad_input
def cmd_eval(args) -> int:
    from ablate import rundir
    from ablate.eval import engine, suite
    from ablate.eval.load import load_model

    if args.list:
        print(suite.format_task_list(args.limit or None))
        return 0
    if not args.path:
        raise ValueError("ablate eval: a run folder or checkpoint to score is required (or --list)")
    tasks = suite.parse_tasks(args.tasks) if args.tasks else list(suite.all_tasks())
    metrics = suite.parse_metrics(args.metrics)
    if args.every_checkpoint:
        return _score_every_checkpoint(args, tasks, metrics)
    loaded = load_model(args.path, device=args.device)
    # bf16: matmuls in bf16 under autocast, log-likelihoods still summed in fp32 (as in-training evals of bf16 runs)
    lm, dtype = engine.for_loaded(loaded, args.device, args.dtype)
    results = suite.evaluate(
        lm,
        loaded.tokenizer(),
        tasks,
        args.format,
        args.limit or None,
        args.batch_size,
        log_samples=bool(args.log_samples),
        metrics=metrics,
    )
    print(f"{loaded.checkpoint} (step {loaded.step}, {loaded.tokens} tokens, {dtype})")
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


def _score_every_checkpoint(args, tasks: list[str], metrics) -> int:
    from ablate.eval.checkpoints import score_checkpoints

    if args.log_samples or args.no_write:
        raise ValueError(
            "--every-checkpoint: writes each evaluation to its run folder; not with --log-samples "
            "or --no-write (score one checkpoint for those)"
        )
    done = score_checkpoints(
        args.path,
        tasks,
        args.format,
        args.limit or None,
        args.batch_size,
        args.device,
        args.dtype,
        rescore=args.rescore,
        metrics=metrics,
    )
    for line in done.skipped:
        print(f"skipped {line}")
    print(f"scored {len(done.written)} checkpoint(s) in {done.seconds:.1f}s", flush=True)
    return 0


@_bad_input
def cmd_export(args) -> int:
    from ablate.eval.export import export_hf

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
    opts = Options(
        alpha=args.alpha,
        min_seeds=args.min_seeds,
        power=args.power,
        min_shared_items=args.min_shared_items,
        min_monotonicity=args.min_monotonicity,
        min_tau=args.min_tau,
        min_z=args.min_z,
        min_snr=args.min_snr,
        last_k=args.last_k,
        early_fraction=args.early_fraction,
        bootstrap=args.bootstrap,
        scale=[f for f in (args.scale or "").split(",") if f],
        average_last=args.average_last,
        subject_snr_floor=args.subject_snr_floor,
        primary=args.primary,
        primary_share=args.primary_share,
        max_token_gap=args.max_token_gap,
    )
    out = args.out or args.runs_dir
    try:
        report = write_report(args.runs_dir, out, opts)
    except ReportError as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2
    print(report["headline"]["text"])
    print(f"wrote {out}/report.html, report.md, report.json in {time.perf_counter() - start:.1f}s")
    return 0


def cmd_tokenizer(args) -> int:
    """Fertility, continued-word rate, bytes per token and vocabulary use of each tokenizer on each corpus."""
    import json

    from ablate.data import tokenizer_stats

    specs = tokenizer_stats.parse_specs(args.tokenizers)  # every entry checked before any compute
    corpora = tokenizer_stats.corpora(args.files, args.text_field, args.max_documents)
    rows = tokenizer_stats.study(specs, corpora)
    print(json.dumps(rows, indent=1) if args.json else tokenizer_stats.format_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ablate", description="Pre-training ablations: train variants, compare them.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every variant x seed of an experiment file")
    run.add_argument("file", type=PATH, help="experiment file (Python) defining `runs`")
    run.add_argument(
        "--only",
        action="append",
        type=ONLY,
        help="variant names or globs (e.g. 'lr=0.01*'), comma-separated or repeated",
    )
    run.add_argument("--seeds", type=SEEDS, help="comma-separated seeds, overriding the file's `seeds`")
    run.add_argument("--out", default="runs", type=RUNS_ROOT, help="runs root (default: runs/)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        type=SET,
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set train.max_steps=20 (repeatable)",
    )
    run.add_argument(
        "--jobs",
        type=WHOLE_1,
        metavar="N",
        help="runs at once on this machine, at most the number of runs (CPU: cores/N threads each; "
        "GPUs: default one per GPU)",
    )
    run.add_argument(
        "--runs-per-gpu",
        type=WHOLE_1,
        default=1,
        metavar="K",
        help="K small runs share each GPU, each checked against and capped at 1/K of its memory",
    )
    run.add_argument(
        "--gpus-per-run",
        type=number(int, 0),
        metavar="G",
        help="each run a torchrun group of G GPUs; 0: CPU (default: 1 where a CUDA GPU is visible, else CPU; "
        "with --launcher slurm/local as --slurm gpus_per_run, see docs/sweeps.md)",
    )
    run.add_argument(
        "--device-memory",
        metavar="SIZE",
        type=DEVICE_MEMORY,
        help="refuse runs whose per-rank memory "
        "estimate (ablate plan) exceeds SIZE, e.g. 80GiB (default: a visible GPU's memory; none on CPU)",
    )
    run.add_argument(
        "--launcher",
        type=one_of("here", "local", "slurm"),
        default="here",
        metavar="LAUNCHER",
        help="here (default): this machine; slurm: a submitit job array; local: the same submitit "
        "path with its local executor",
    )
    run.add_argument(
        "--slurm",
        metavar="KEY=VALUE,...",
        type=SLURM_OPTIONS,
        help="SLURM options, e.g. partition=gpu,time=120,gpus_per_run=1 (see README)",
    )
    study = run.add_argument_group("a study in rounds (docs/sweeps.md#studies-until-decided)")
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
        "--new-study",
        action="store_true",
        help="start a new study when the rule differs from the recorded one (the old study.json is kept)",
    )
    run.set_defaults(func=cmd_run)
    pl = sub.add_parser(
        "plan",
        help="what each run costs (parameters, FLOPs, tokens, per-rank memory, time) before "
        "any compute; refuses runs that cannot fit the device memory",
    )
    pl.add_argument("file", type=PATH, help="experiment file (Python) defining `runs`")
    pl.add_argument("--only", action="append", type=ONLY, help="variant names or globs, comma-separated or repeated")
    pl.add_argument("--seeds", type=SEEDS, help="comma-separated seeds, overriding the file's `seeds`")
    pl.add_argument(
        "--set",
        action="append",
        default=[],
        type=SET,
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set train.micro_batch=8 (repeatable)",
    )
    pl.add_argument("--world-size", type=WHOLE_1, default=1, metavar="N", help="ranks FSDP2 shards over (default 1)")
    pl.add_argument(
        "--device-memory",
        metavar="SIZE",
        type=DEVICE_MEMORY,
        help="memory per device, e.g. 24GiB or 80GB (default: the visible GPU's, else no check)",
    )
    pl.add_argument(
        "--dtype", type=one_of("auto", "fp32", "bf16"), metavar="auto|fp32|bf16", help="override train.dtype"
    )
    pl.add_argument(
        "--out", default="runs", type=RUNS_ROOT, help="runs root whose finished runs give the MFU (default: runs/)"
    )
    pl.set_defaults(func=cmd_plan)
    st = sub.add_parser("status", help="one line per run: state, step, loss, tokens/s, ETA, failures")
    st.add_argument("runs_dir", type=PATH, help="runs/ or runs/<experiment>/")
    st.add_argument(
        "--watch",
        type=number(float, 0, 86400, open_low=True, noun="seconds"),
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help="refresh every SECONDS (5; at most a day) until nothing runs",
    )
    st.set_defaults(func=cmd_status)
    ev = sub.add_parser("eval", help="score a run or checkpoint on the cloze task suite")
    ev.add_argument("path", nargs="?", help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    ev.add_argument("--tasks", type=TASKS, help="comma-separated task and suite names, e.g. small,boolq (default: all)")
    ev.add_argument("--list", action="store_true", help="print the tasks and suites with their item counts")
    ev.add_argument(
        "--limit",
        type=number(int, 0),
        default=1000,
        help="items per task, a fixed-seed subsample (default 1000); 0: every item of each task",
    )
    ev.add_argument("--format", default="cf", type=EVAL_FORMAT, help="cf (cloze) or mcf (multiple-choice letters)")
    ev.add_argument("--batch-size", type=WHOLE_1, default=32, help="rows per forward pass")
    ev.add_argument(
        "--device", default="auto", type=DEVICE, help="auto (the GPU where one is visible, else cpu), cpu, cuda[:N]"
    )
    ev.add_argument(
        "--dtype",
        type=one_of("fp32", "bf16"),
        metavar="fp32|bf16",
        help="bf16: autocast matmuls (default: the run's train.dtype; auto: bf16 on a GPU, fp32 on CPU)",
    )
    ev.add_argument(
        "--metrics",
        metavar="NAMES",
        type=text("metric names, comma-separated, or all", _metrics, names=True),
        help="comma-separated metrics to compute (default: all; each task's primary always); a choice task runs its "
        "unconditional pass only for acc_pmi, acc_choices_only or margin_pmi",
    )
    ev.add_argument(
        "--log-samples", metavar="FILE", type=SAMPLES_FILE, help="write one JSON line per request and per item"
    )
    ev.add_argument("--no-write", action="store_true", help="print only; leave evals.jsonl and eval_items/ alone")
    ev.add_argument(
        "--every-checkpoint",
        action="store_true",
        help="PATH is a run, an experiment or a runs root: score every kept checkpoint of every run "
        "on the tasks it was not scored on yet (one process; requests tokenized once)",
    )
    ev.add_argument("--rescore", action="store_true", help="with --every-checkpoint: score scored ones again too")
    ev.set_defaults(func=cmd_eval)
    ex = sub.add_parser("export", help="write a checkpoint as a transformers model (safetensors + config + tokenizer)")
    ex.add_argument("checkpoint", type=PATH, help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    ex.add_argument(
        "--hf", required=True, metavar="DIR", type=text("a folder, new or empty"), help="output folder, new or empty"
    )
    ex.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty DIR, replacing the files the export writes (says which)",
    )
    ex.set_defaults(func=cmd_export)
    rep = sub.add_parser("report", help="compare the runs of one experiment: report.html, report.md, report.json")
    rep.add_argument("runs_dir", type=PATH, help="runs/<experiment>/ holding <variant>/seed<k>/ run folders")
    rep.add_argument("--out", type=RUNS_ROOT, help="folder for the report files (default: RUNS_DIR)")
    rep.add_argument(
        "--scale",
        type=text("config fields, comma-separated, e.g. model.d_model", names=True),
        help="config field(s) forming a scale axis, e.g. model.d_model (comma-separated)",
    )
    rep.add_argument(
        "--alpha",
        type=SHARE,
        default=0.05,
        help="the study's error rate: A/A any-claim rate over the primary and task families (0.05)",
    )
    rep.add_argument(
        "--primary",
        type=text("a task, or task/metric, e.g. arc_easy:cf or arc_easy:cf/acc_raw"),
        help="the primary metric, tested as its own family (default: validation loss, or its bpb across tokenizers)",
    )
    rep.add_argument(
        "--primary-share",
        type=number(float, 0, 1, open_low=True),
        default=0.8,
        help="share of alpha the primary metric's family is tested at; the task metrics get the rest (0.8)",
    )
    rep.add_argument(
        "--max-token-gap",
        type=NON_NEGATIVE,
        default=0.05,
        help="pairs whose compared points are further apart in tokens (relative) are not tested (0.05)",
    )
    rep.add_argument(
        "--min-seeds", type=number(int, 2), default=3, help="seeds per variant needed to test a difference (3)"
    )
    rep.add_argument("--power", type=SHARE, default=0.8, help="the power 'seeds needed' is estimated for (0.8)")
    rep.add_argument(
        "--min-shared-items",
        type=number(float, 0, 1, open_low=True),
        default=0.5,
        help="runs scored different items: compare over shared ids when they are >= this share (0.5)",
    )
    rep.add_argument("--min-monotonicity", type=CORRELATION, default=0.5, help="early-signal threshold on Spearman rho")
    rep.add_argument("--min-tau", type=CORRELATION, default=0.6, help="threshold on Kendall tau over the second half")
    rep.add_argument("--min-z", type=NON_NEGATIVE, default=2.0, help="standard errors past chance to count as above it")
    rep.add_argument("--min-snr", type=NON_NEGATIVE, help="optional threshold on the signal-to-noise ratio (off)")
    rep.add_argument(
        "--last-k", type=number(int, 2), default=3, help="last checkpoints whose spread is a run's noise (3)"
    )
    rep.add_argument(
        "--early-fraction",
        type=SHARE,
        default=0.25,
        help="share of training of the 'early' checkpoint for decision accuracy (0.25)",
    )
    rep.add_argument(
        "--bootstrap", type=number(int, 100, 1_000_000), default=2000, help="bootstrap replicates for CIs (2000)"
    )
    rep.add_argument(
        "--average-last",
        type=number(int, 1),
        default=1,
        metavar="K",
        help="a run's score: the mean of its last K evaluations, less checkpoint noise (1: the last)",
    )
    rep.add_argument(
        "--subject-snr-floor",
        type=number(float, 0, open_low=True),
        metavar="X",
        help="leave a grouped task's subjects (MMLU) of SNR below X out of its average (off)",
    )
    rep.set_defaults(func=cmd_report)
    tk = sub.add_parser(
        "tokenizer",
        help="fertility, continued-word rate, bytes per token, vocabulary use of tokenizers, per corpus or language",
    )
    tk.add_argument(
        "files",
        nargs="+",
        type=PATH,
        metavar="FILES",
        help="'default' (the embedded corpus: en, es, fr, a row each), default/<lang>, or data sources as "
        "data.source takes them (jsonl/jsonl.gz/json/parquet/txt files, folders, globs)",
    )
    tk.add_argument(
        "--tokenizers",
        default="bpe:8192",
        type=text("bpe:N, a tokenizer.json or a run folder, comma-separated"),
        help="comma-separated: bpe:N (a byte-level BPE of N tokens trained on FILES, as data.tokenizer='bpe' "
        "trains one), a tokenizer.json, or a run folder (its tokenizer.json) (default: bpe:8192). A word is a run "
        "of letters, digits and underscores, or one punctuation or symbol character",
    )
    tk.add_argument("--text-field", default="text", type=text("a column name"), help="text column (default: text)")
    tk.add_argument("--max-documents", type=number(int, 1), help="read only the first N documents of each corpus")
    tk.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    tk.set_defaults(func=cmd_tokenizer)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ablate.setup.experiment import ExperimentError
    from ablate.rundir import RunFolderError

    try:
        return args.func(args)
    except (ConfigError, ExperimentError, RunFolderError) as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
