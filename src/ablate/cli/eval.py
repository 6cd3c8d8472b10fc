"""`ablate eval PATH`: score a run folder or one of its checkpoints on the cloze task suite (or, with
--every-checkpoint, every kept checkpoint below PATH); `--list` prints the tasks and suites."""

from __future__ import annotations

import sys

from ablate.cli.options import (
    DEVICE,
    EVAL_FORMAT,
    METRICS,
    SAMPLES_FILE,
    WHOLE_1,
    number,
    one_line_errors,
    one_of,
    text,
)

TASK_NAMES = text("task or suite names, comma-separated", names=True)  # known once the experiment file has run


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="score a run or checkpoint on the cloze task suite")
    parser.add_argument("path", nargs="?", help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    parser.add_argument(
        "--tasks",
        type=TASK_NAMES,
        help="comma-separated task and suite names, e.g. small,boolq (default: all); with the tasks the run's "
        "experiment file registers (ablate.register_task)",
    )
    parser.add_argument(
        "--experiment",
        metavar="FILE",
        help="the experiment file whose registered tasks and components to load (default: the one each run "
        "folder's config.json records, where it still exists)",
    )
    parser.add_argument("--list", action="store_true", help="print the tasks and suites with their item counts")
    parser.add_argument(
        "--limit",
        type=number(int, 0),
        default=1000,
        help="items per task, a fixed-seed subsample (default 1000); 0: every item of each task",
    )
    parser.add_argument("--format", default="cf", type=EVAL_FORMAT, help="cf (cloze) or mcf (multiple-choice letters)")
    parser.add_argument("--batch-size", type=WHOLE_1, default=32, help="rows per forward pass")
    parser.add_argument(
        "--device", default="auto", type=DEVICE, help="auto (the GPU where one is visible, else cpu), cpu, cuda[:N]"
    )
    parser.add_argument(
        "--dtype",
        type=one_of("fp32", "bf16"),
        metavar="fp32|bf16",
        help="bf16: autocast matmuls (default: the run's train.dtype; auto: bf16 on a GPU, fp32 on CPU)",
    )
    parser.add_argument(
        "--metrics",
        metavar="NAMES",
        type=METRICS,
        help="comma-separated metrics to compute (default: all; each task's primary always); a choice task runs its "
        "unconditional pass only for acc_pmi, acc_choices_only or margin_pmi",
    )
    parser.add_argument(
        "--log-samples", metavar="FILE", type=SAMPLES_FILE, help="write one JSON line per request and per item"
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave evals.jsonl and eval_items/ alone")
    parser.add_argument(
        "--every-checkpoint",
        action="store_true",
        help="PATH is a run, an experiment or a runs root: score every kept checkpoint of every run "
        "on the tasks it was not scored on yet (one process; requests tokenized once)",
    )
    parser.add_argument("--rescore", action="store_true", help="with --every-checkpoint: score scored ones again too")
    parser.set_defaults(func=cmd_eval)


@one_line_errors
def cmd_eval(args) -> int:
    from ablate import rundir
    from ablate.eval import engine, suite  # torch: imported only when the command runs
    from ablate.eval.load import load_model

    _load_user_code(args)
    if args.list:
        print(suite.format_task_list(args.limit or None))
        return 0
    if not args.path:
        raise ValueError("ablate eval: a run folder or checkpoint to score is required (or --list)")
    # parsed here, not by argparse: the user's tasks are registered only once their file has run
    tasks = suite.parse_tasks(args.tasks) if args.tasks else list(suite.all_tasks())
    metrics = args.metrics
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
    print(suite.results_table(results))
    if not args.no_write:
        replaced = suite.write_results(loaded.run_dir, loaded.step, loaded.tokens, results)
        print(f"appended to {loaded.run_dir / rundir.EVALS}")
        for line in replaced:  # the report reads the latest evaluation of a step
            print(f"replaced an earlier evaluation's items at step {loaded.step}: {line}")
    if args.log_samples:
        suite.write_samples(args.log_samples, results)
        print(f"samples: {args.log_samples}")
    return 0


def _load_user_code(args) -> None:
    """Run the experiment file (--experiment, or each one the run folders record) so that what it registers is
    known: a recorded file that is gone is said, not silently skipped."""
    from ablate.setup.experiment import load_recorded

    for file in load_recorded(args.path, args.experiment) if args.path or args.experiment else []:
        print(
            f"note: {file} (the experiment file a run records) is gone: its tasks are unknown here; pass "
            f"--experiment FILE",
            file=sys.stderr,
        )


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
