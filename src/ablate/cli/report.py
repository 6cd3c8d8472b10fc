"""`ablate report RUNS_DIR`: compare the runs of one experiment and write report.html, report.md and report.json
(no torch: the report reads run folders alone)."""

from __future__ import annotations

import sys
import time
from dataclasses import MISSING, Field

from ablate.cli.options import PATH, RUNS_ROOT, number, text


def _accepts(f: Field):
    """The argparse rule of an Options field's flag, from what its metadata says it accepts."""
    accepts = f.metadata["accepts"]
    if isinstance(accepts, str):  # text: a list field takes comma-separated names, or one value per use
        if f.default is MISSING and not f.metadata["repeat"]:
            return text(accepts, lambda value: [name for name in value.split(",") if name], names=True)
        return text(accepts, f.metadata.get("check"))
    return number(accepts.kind, accepts.low, accepts.high, accepts.open_low, accepts.open_high)


def _help(f: Field) -> str:
    default = f.default_factory() if f.default is MISSING else f.default
    shown = f.metadata["shown"] or ("off" if default is None else default)
    return f"{f.metadata['help']} ({shown})"


def add_command(subparsers) -> None:
    from ablate.report.options import flags  # the options declared once; light (no numpy)

    parser = subparsers.add_parser(
        "report", help="compare the runs of one experiment: report.html, report.md, report.json"
    )
    parser.add_argument("runs_dir", type=PATH, help="runs/<experiment>/ holding <variant>/seed<k>/ run folders")
    parser.add_argument("--out", type=RUNS_ROOT, help="folder for the report files (default: RUNS_DIR)")
    for f in flags():
        default = f.default_factory() if f.default is MISSING else f.default
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=_accepts(f),
            default=default,
            metavar=f.metadata["metavar"],
            help=_help(f),
            **({"action": "append"} if f.metadata["repeat"] else {}),
        )
    parser.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from ablate.report import Options, ReportError, write_report  # numpy and scipy: only when the command runs
    from ablate.report.options import flags

    start = time.perf_counter()
    opts = Options(**{f.name: getattr(args, f.name) for f in flags()})
    out = args.out or args.runs_dir
    try:
        report = write_report(args.runs_dir, out, opts)
    except ReportError as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2
    print(console_text(report))
    print(f"wrote {out}/report.html, report.md, report.json in {time.perf_counter() - start:.1f}s")
    return 0


def console_text(report: dict) -> str:
    """What the terminal shows, read in ten seconds as the report opens: the verdict, an adaptive study's decisions
    in words, the decisions table and its notes (the whole headline is report.json's `headline.text`)."""
    from ablate.report.schema import Headline
    from ablate.report.sections.decisions import verdict
    from ablate.text import aligned

    head = Headline.from_json(report["headline"])
    lines = [f"{report['experiment']}: {head.verdict}"]
    if head.sequential and head.sequential not in head.verdict:
        lines.append(f"adaptive study: {head.sequential}")
    _, header, rows = verdict.table(head, report["options"]["power"])
    if rows:
        lines.append(aligned([header, *rows], text_columns=tuple(range(len(header)))))
    lines += head.notes  # what the decisions leave out: no-signal tasks, runs left out, refusals
    if head.compute:  # compute multipliers on a ladder, or how to ask for them
        lines.append(head.compute)
    return "\n".join(lines)
