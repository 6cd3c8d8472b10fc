"""`ablate` command line: thin wrappers over library calls.

Under torchrun every rank runs the same command; rank 0 prints.
"""
from __future__ import annotations

import argparse
import sys

from ablate.config import ConfigError, parse_set_args


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,2; got {text!r}") from None


def cmd_run(args) -> int:
    from ablate.experiment import load_experiment
    from ablate.parallel import shutdown_distributed
    from ablate.train import run_dir_for, train

    only = [x.strip() for x in args.only.split(",")] if args.only else None
    runs = load_experiment(args.file, only=only, seeds=args.seeds, overrides=parse_set_args(args.set))
    import torch.distributed as dist

    results = []
    try:
        for run in runs:
            summary = train(run, args.out)
            results.append((run, summary))
            if dist.get_rank() == 0:
                print(f"done {run.name} seed{run.train.seed}: {run_dir_for(args.out, run)}  "
                      f"final_loss {summary['final_loss']:.4f}  final_val_loss {summary['final_val_loss']:.4f}  "
                      f"{summary['tokens_per_second']:.0f} tok/s  {summary['wall_seconds']:.1f}s", flush=True)
    finally:
        shutdown_distributed()
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

    from ablate.eval import engine, suite
    from ablate.load import load_model

    tasks = suite.parse_tasks(args.tasks) if args.tasks else list(suite.all_tasks())
    suite.check_format(args.format)
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
        print(f"appended to {loaded.run_dir / 'evals.jsonl'}")
        for line in replaced:  # the report reads the latest evaluation of a step
            print(f"replaced an earlier evaluation's items at step {loaded.step}: {line}")
    if args.log_samples:
        suite.write_samples(args.log_samples, results)
        print(f"samples: {args.log_samples}")
    return 0


@_bad_input
def cmd_export(args) -> int:
    from ablate.export import export_hf

    out = export_hf(args.checkpoint, args.hf)
    print(f"wrote a transformers model to {out}")
    return 0


def cmd_report(args) -> int:
    import time

    from ablate.report import Options, ReportError, write_report

    start = time.perf_counter()
    opts = Options(alpha=args.alpha, min_monotonicity=args.min_monotonicity, min_tau=args.min_tau, min_z=args.min_z,
                   min_snr=args.min_snr, last_k=args.last_k, early_fraction=args.early_fraction,
                   bootstrap=args.bootstrap, scale=[f for f in (args.scale or "").split(",") if f])
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
    parser = argparse.ArgumentParser(prog="ablate", description="Pre-training ablations: train variants, compare them.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every variant x seed of an experiment file")
    run.add_argument("file", help="experiment file (Python) defining `runs`")
    run.add_argument("--only", help="comma-separated variant names to run")
    run.add_argument("--seeds", type=_int_list, help="comma-separated seeds, overriding the file's `seeds`")
    run.add_argument("--out", default="runs", help="runs root (default: runs/)")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                     help="override a config field, e.g. --set train.max_steps=20 (repeatable)")
    run.set_defaults(func=cmd_run)
    ev = sub.add_parser("eval", help="score a run or checkpoint on the cloze task suite")
    ev.add_argument("path", help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    ev.add_argument("--tasks", help="comma-separated task names (default: all)")
    ev.add_argument("--limit", type=int, default=1000, help="items per task, a fixed-seed subsample; 0: all")
    ev.add_argument("--format", default="cf", help="cf (cloze) or mcf (multiple-choice letters)")
    ev.add_argument("--batch-size", type=int, default=32, help="rows per forward pass")
    ev.add_argument("--device", default="cpu", help="cpu or cuda")
    ev.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16: autocast matmuls (default fp32)")
    ev.add_argument("--log-samples", metavar="FILE", help="write one JSON line per request and per item")
    ev.add_argument("--no-write", action="store_true", help="print only; leave evals.jsonl and eval_items/ alone")
    ev.set_defaults(func=cmd_eval)
    ex = sub.add_parser("export", help="write a checkpoint as a transformers model (safetensors + config + tokenizer)")
    ex.add_argument("checkpoint", help="a run folder (its newest checkpoint) or its checkpoints/step_N")
    ex.add_argument("--hf", required=True, metavar="DIR", help="output folder")
    ex.set_defaults(func=cmd_export)
    rep = sub.add_parser("report", help="compare the runs of one experiment: report.html, report.md, report.json")
    rep.add_argument("runs_dir", help="runs/<experiment>/ holding <variant>/seed<k>/ run folders")
    rep.add_argument("--out", help="folder for the report files (default: RUNS_DIR)")
    rep.add_argument("--scale", help="config field(s) forming a scale axis, e.g. model.d_model (comma-separated)")
    rep.add_argument("--alpha", type=float, default=0.05, help="significance level of pairwise tests (0.05)")
    rep.add_argument("--min-monotonicity", type=float, default=0.5, help="early-signal threshold on Spearman rho")
    rep.add_argument("--min-tau", type=float, default=0.6, help="threshold on Kendall tau over the second half")
    rep.add_argument("--min-z", type=float, default=2.0, help="standard errors past chance to count as above it")
    rep.add_argument("--min-snr", type=float, help="optional threshold on the signal-to-noise ratio (off)")
    rep.add_argument("--last-k", type=int, default=3, help="last checkpoints whose spread is a run's noise (3)")
    rep.add_argument("--early-fraction", type=float, default=0.25,
                     help="share of training of the 'early' checkpoint for decision accuracy (0.25)")
    rep.add_argument("--bootstrap", type=int, default=2000, help="bootstrap replicates for CIs (2000)")
    rep.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ablate.experiment import ExperimentError

    try:
        return args.func(args)
    except (ConfigError, ExperimentError) as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
