"""`ablate status RUNS_DIR`: one line per run folder below RUNS_DIR, from its files alone (no torch import).

States: pending (queued by a sweep), running (a live process holds the run's lock), finished, failed, diverged,
interrupted (Ctrl-C), stopped (status says running but no process holds the lock: killed; rerun to resume).
With --watch it redraws until nothing runs. An adaptive study's folder also gets its contrasts (study.json).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from ablate import rundir
from ablate.cli.options import PATH, number
from ablate.report.sections.sequential.words import contrast_line


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("status", help="one line per run: state, step, loss, tokens/s, ETA, failures")
    parser.add_argument("runs_dir", type=PATH, help="runs/ or runs/<experiment>/")
    parser.add_argument(
        "--watch",
        type=number(float, 0, 86400, open_low=True, noun="seconds"),
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help="refresh every SECONDS (5; at most a day) until nothing runs",
    )
    parser.set_defaults(func=cmd_status)


def cmd_status(args) -> int:
    try:
        return show(args.runs_dir, watch=args.watch)
    except KeyboardInterrupt:  # Ctrl-C is how --watch is left
        return 0


def _last_train_record(path: Path) -> dict | None:
    """The newest metrics.jsonl line with a training loss, read from the file's tail."""
    if not path.is_file():
        return None
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - 65536))
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line, or the cut first line of the tail
        if "loss" in record:
            return record
    return None


def run_state(run_dir: Path) -> dict:
    """State, progress and message of one run folder."""
    status = rundir.read_status(run_dir) or {}
    state = status.get("state", "pending")
    held = rundir.RunLock(run_dir).held_by_live_process()
    if (run_dir / rundir.SUMMARY).is_file():
        state = "finished"
    elif held:  # the lock is the truth: a queue's "pending" may have been written over a start
        state = "running"
    elif state == "running":
        state = "stopped"
    elif state == "pending" and (run_dir / rundir.METRICS).is_file():
        state = "stopped"  # a folder from before status files: progress but nobody on it
    record = _last_train_record(run_dir / rundir.METRICS) or {}
    max_steps = status.get("max_steps")
    if max_steps is None and (run_dir / rundir.CONFIG).is_file():
        try:
            held = rundir.read_json(run_dir / rundir.CONFIG)  # "steps": a scheduled batch's plan, since schedules
            max_steps = held.get("steps") or held["config"]["train"]["max_steps"]
        except (rundir.RunFolderError, KeyError):
            max_steps = None
    step = record.get("step", status.get("step", 0))
    speed = record.get("tokens_per_second")
    eta = None
    if state == "running" and speed and max_steps and step:
        eta = (max_steps - step) * (record["tokens"] / step) / speed
    message = (status.get("message") or "").splitlines()[0] if status.get("message") else ""
    if state == "stopped":
        resume = (rundir.checkpoint_steps(run_dir) or [0])[-1]
        message = f"no process on it (killed?); rerun to resume from step {resume}"
    log = status.get("log") or (status.get("error_file") if state == "failed" else None)
    return {
        "run": run_dir,
        "state": state,
        "step": step,
        "max_steps": max_steps,
        "loss": record.get("loss"),
        "tokens_per_second": speed,
        "eta_seconds": eta,
        "message": message,
        "log": log,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def table(root: Path) -> tuple[str, dict]:
    """The status table as text, and the count of runs per state."""
    rows, counts = [], {}
    for run_dir in rundir.find_run_dirs(root):
        s = run_state(run_dir)
        counts[s["state"]] = counts.get(s["state"], 0) + 1
        note = s["message"] + (f"  log: {s['log']}" if s["log"] and s["state"] in ("failed", "diverged") else "")
        rows.append(
            [
                str(run_dir.relative_to(root)) or ".",
                s["state"],
                f"{s['step']}/{_fmt(s['max_steps'], '')}",
                _fmt(s["loss"], ".4f"),
                _fmt(s["tokens_per_second"], ".0f"),
                _duration(s["eta_seconds"]),
                note,
            ]
        )
    header = ["run", "state", "step", "loss", "tok/s", "eta", "message"]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in [header] + rows]
    total = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    lines.append(f"{len(rows)} runs: {total}" if rows else f"no run folders under {root}")
    return "\n".join(line.rstrip() for line in lines), counts


def study_block(folder: Path) -> str | None:
    """An adaptive study's state from its study.json: each contrast of the latest round, and why it stopped."""
    path = folder / rundir.STUDY
    if not path.is_file():
        return None
    study = rundir.read_json(path)
    rounds = study.get("rounds") or []
    done = [r for r in rounds if r.get("contrasts") is not None]
    head = f"study {folder.name} ({path}): {len(done)} round{'s' if len(done) != 1 else ''} done"
    if rounds and rounds[-1].get("contrasts") is None:
        head += f"; round {rounds[-1]['round']} not finished (running, or rerun the command to continue)"
    lines = [head]
    if done:
        lines.append(f"after round {done[-1]['round']}:")
        futility = (study.get("rule") or {}).get("futility")
        lines += [f"  {contrast_line(c, futility)}" for c in done[-1]["contrasts"]]
    stopped = study.get("stopped")
    lines.append(f"stopped: {stopped}" if stopped else "stopped: not yet")
    return "\n".join(lines)


def _study_blocks(root: Path) -> list[str]:
    """The study of an experiment folder, or of each experiment under a runs folder."""
    folders = [root, *sorted(p for p in root.iterdir() if p.is_dir())] if root.is_dir() else []
    return [block for block in map(study_block, folders) if block]


def show(root: str | Path, watch: float | None = None) -> int:
    root = Path(root)
    if watch is not None and not watch > 0:
        raise rundir.RunFolderError(f"--watch {watch:g}: allowed: seconds > 0")
    if not root.is_dir():
        raise rundir.RunFolderError(
            f"{root}: no such folder; allowed: a runs folder such as runs/ or runs/<experiment>"
        )
    while True:
        text, counts = table(root)
        text = "\n\n".join([text, *_study_blocks(root)])
        if watch is None:
            print(text)
            return 0
        print(
            "\033[2J\033[H" + time.strftime("%H:%M:%S ") + f"ablate status {root} (every {watch:g}s, Ctrl-C "
            f"to stop)\n" + text,
            flush=True,
        )
        if not counts.get("running") and not counts.get("pending"):
            return 0
        time.sleep(watch)
