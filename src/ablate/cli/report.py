"""`ablate report RUNS_DIR`: compare the runs of one experiment and write report.html, report.md and report.json
(no torch: the report reads run folders alone)."""

from __future__ import annotations

import sys
import time

from ablate.cli.options import CORRELATION, NON_NEGATIVE, PATH, RUNS_ROOT, SHARE, number, text


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="compare the runs of one experiment: report.html, report.md, report.json"
    )
    parser.add_argument("runs_dir", type=PATH, help="runs/<experiment>/ holding <variant>/seed<k>/ run folders")
    parser.add_argument("--out", type=RUNS_ROOT, help="folder for the report files (default: RUNS_DIR)")
    parser.add_argument(
        "--scale",
        type=text("config fields, comma-separated, e.g. model.d_model", names=True),
        help="config field(s) forming a scale axis, e.g. model.d_model (comma-separated)",
    )
    parser.add_argument(
        "--alpha",
        type=SHARE,
        default=0.05,
        help="the study's error rate: A/A any-claim rate over the primary and task families (0.05)",
    )
    parser.add_argument(
        "--primary",
        type=text("a task, or task/metric, e.g. arc_easy:cf or arc_easy:cf/acc_raw"),
        help="the primary metric, tested as its own family (default: validation loss, or its bpb across tokenizers)",
    )
    parser.add_argument(
        "--primary-share",
        type=number(float, 0, 1, open_low=True),
        default=0.8,
        help="share of alpha the primary metric's family is tested at; the task metrics get the rest (0.8)",
    )
    parser.add_argument(
        "--max-token-gap",
        type=NON_NEGATIVE,
        default=0.05,
        help="pairs whose compared points are further apart in tokens (relative) are not tested (0.05)",
    )
    parser.add_argument(
        "--min-seeds", type=number(int, 2), default=3, help="seeds per variant needed to test a difference (3)"
    )
    parser.add_argument("--power", type=SHARE, default=0.8, help="the power 'seeds needed' is estimated for (0.8)")
    parser.add_argument(
        "--min-shared-items",
        type=number(float, 0, 1, open_low=True),
        default=0.5,
        help="runs scored different items: compare over shared ids when they are >= this share (0.5)",
    )
    parser.add_argument(
        "--min-monotonicity", type=CORRELATION, default=0.5, help="early-signal threshold on Spearman rho"
    )
    parser.add_argument(
        "--min-tau", type=CORRELATION, default=0.6, help="threshold on Kendall tau over the second half"
    )
    parser.add_argument(
        "--min-z", type=NON_NEGATIVE, default=2.0, help="standard errors past chance to count as above it"
    )
    parser.add_argument("--min-snr", type=NON_NEGATIVE, help="optional threshold on the signal-to-noise ratio (off)")
    parser.add_argument(
        "--last-k", type=number(int, 2), default=3, help="last checkpoints whose spread is a run's noise (3)"
    )
    parser.add_argument(
        "--early-fraction",
        type=SHARE,
        default=0.25,
        help="share of training of the 'early' checkpoint for decision accuracy (0.25)",
    )
    parser.add_argument(
        "--bootstrap", type=number(int, 100, 1_000_000), default=2000, help="bootstrap replicates for CIs (2000)"
    )
    parser.add_argument(
        "--average-last",
        type=number(int, 1),
        default=1,
        metavar="K",
        help="a run's score: the mean of its last K evaluations, less checkpoint noise (1: the last)",
    )
    parser.add_argument(
        "--subject-snr-floor",
        type=number(float, 0, open_low=True),
        metavar="X",
        help="leave a grouped task's subjects (MMLU) of SNR below X out of its average (off)",
    )
    parser.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from ablate.report import Options, ReportError, write_report  # numpy and scipy: only when the command runs

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
