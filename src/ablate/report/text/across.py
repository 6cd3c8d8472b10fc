"""report.json's `across_scales` (signal/across.py) -> the report's "Which signal to trust at which scale": SNR at
each scale, and decision accuracy to the largest against the task's target, against validation loss, and against
itself."""

from __future__ import annotations

import json

from ablate.report.text.fmt import Section, fmt, fmt_ci


def _da_cell(r: dict) -> str:
    """Target DA with its interval where one is shown (the note under the table says why one is not)."""
    return f"{fmt(r['decision_accuracy'], 3)} {fmt_ci(r['ci'])}" if r["ci"] else fmt(r["decision_accuracy"], 3)


def _cells(a: dict, smaller: list) -> list[str]:
    """One table row: per smaller scale SNR, DA (with its interval where shown), DA vs val loss, self-agreement;
    then SNR at the largest and the three means."""
    by = {json.dumps(r["scale"]): r for r in a["by_scale"]}
    cells = []
    for sc in smaller:
        r = by.get(json.dumps(sc))
        if r is None:
            cells += ["", "", "", ""]
            continue
        cells += [fmt(r["snr"], 3), _da_cell(r), fmt(r["decision_accuracy_val"], 3), fmt(r["self_agreement"], 3)]
    means = [a["mean_decision_accuracy"], a["mean_decision_accuracy_val"], a["mean_self_agreement"]]
    note = " (primary)" if a["primary"] else " (baseline)" if a["metric"] == "acc_choices_only" else ""
    return [a["task"], a["metric"] + note] + cells + [fmt(a["snr"], 3)] + [fmt(m, 3) for m in means]


def _notes(across: list[dict]) -> list[str]:
    """Why intervals are not shown, where seeds were not paired, and which targets are at chance."""
    out = [n[0].upper() + n[1:] for n in sorted({r["ci_note"] for a in across for r in a["by_scale"] if r["ci_note"]})]
    unpaired = sorted({a["task"] for a in across for r in a["by_scale"] if r["paired"] is False})
    if unpaired:
        out.append("Variants ran different seed lists, so their seeds were resampled apart: " + ", ".join(unpaired))
    at_chance = sorted(
        {f"{a['task']} ({a['target']['metric']})" for a in across if a["target"] and not a["target_valid"]}
    )
    if at_chance:
        out.append(
            "Targets at chance at the largest scale (no ranking to validate a metric against: read DA vs val loss): "
            + ", ".join(at_chance)
        )
    return out


def section(report: dict) -> Section | None:
    """The report's "Which signal to trust at which scale" (render.py lays it out): SNR at each scale, and decision
    accuracy to the largest against the task's target, against validation loss, and against itself."""
    across = report["across_scales"]
    if not across:
        return None
    largest = report["groups"][-1]["scale"]
    smaller = [g["scale"] for g in report["groups"][:-1]]
    per_scale = ("SNR @{}", "DA {}->" + str(largest), "DA vs val loss {}->" + str(largest), "self {}->" + str(largest))
    header = (
        ["task", "metric"]
        + [h.format(sc) for sc in smaller for h in per_scale]
        + [f"SNR @{largest}", "mean DA", "mean DA vs val loss", "mean self"]
    )
    paragraphs = [
        "Decision accuracy (DA, as DataDecide defines it): the share of variant pairs a metric at a smaller scale "
        f"orders as the target orders them at the largest ({largest}); each side oriented by its own direction, a "
        "pair tied at the smaller scale counts one half. DA: against the task's primary metric at the largest "
        "scale (validation loss: its own loss). DA vs val loss: against validation loss at the largest scale. "
        "Self: against the same metric at the largest scale (whether it agrees with itself, not whether it "
        "predicts the task). With few variants DA moves in coarse steps (2 variants: 0, 1/2 or 1). Kendall tau "
        "against the target is in report.json (across_scales).",
        f"95% interval of DA: a bootstrap ({report['options']['bootstrap']} replicates) that resamples seed indices "
        "once for every variant of a scale (seed k shares data order and init), each scale apart, and the eval "
        "items once per replicate for every seed (the same items on every seed: the noise model's persistent part; "
        "without per-item files, each variant's logged standard error); shown only where it covered the true DA in "
        ">= 90% of constructed ladders at that number of seeds (docs/reports.md).",
    ]
    return Section(
        "Which signal to trust at which scale",
        paragraphs + _notes(across),
        tables=[("SNR and decision accuracy by scale", header, [_cells(a, smaller) for a in across])],
    )
