"""report.json -> report.md and report.html. Every figure shown is read from the report's record as read back from
report.json (schema.Report.from_json), so what a reader sees is what report.json holds.

The content is built once as neutral sections (titles, paragraphs, tables of plain strings, images): the page
assembles them in reading order, the sections' own (sections/) and the few that are the page's (the overview, the
curves, what could not be computed); the markdown and HTML writers only escape and lay out.
"""

from __future__ import annotations

import html
import json
import math

from ablate.report.schema import Changes, Group, Report
from ablate.report.sections.decisions import opening
from ablate.report.sections.decisions import render as decisions
from ablate.report.sections.multipliers import render as multipliers
from ablate.report.sections.sequential import render as sequential
from ablate.report.sections.signal import render as signal
from ablate.report.sections.sweep import render as sweep
from ablate.report.sections.tokenizers import render as tokenizers
from ablate.report.text import plots
from ablate.report.text.fmt import Section, fmt, fmt_seconds, md_escape, md_line


def _group_title(group: Group, groups: list[Group]) -> str:
    return "" if len(groups) == 1 and group.scale is None else f" (scale {group.scale})"


def _constant_columns(header: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]], list]:
    """The columns after the first (the run) that read the same on every row of two or more, dropped: (header, rows,
    [(column, value)] of those to state once; an empty column is dropped unsaid)."""
    if len(rows) < 2:
        return header, rows, []
    same = [i for i in range(1, len(header)) if len({row[i] for row in rows}) == 1]
    keep = [i for i in range(len(header)) if i not in same]
    stated = [(header[i], rows[0][i]) for i in same if rows[0][i]]
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows], stated


def _overview_section(report: Report) -> Section:
    o = report.overview
    finished = sum(r.status == "finished" for r in o.runs)
    sec = Section(
        "Overview",
        [
            f"Experiment {report.experiment}: variants {', '.join(o.variants)}; seeds "
            f"{', '.join(str(s) for s in o.seeds)}; {len(o.runs)} runs, {finished} finished; "
            f"total training time {fmt_seconds(o.total_wall_seconds)}."
        ],
    )
    rows = [
        [
            r.run,
            r.status,
            f"{fmt(r.steps)}/{fmt(r.max_steps)}",
            fmt(r.tokens),
            fmt(r.params) + (f" ({fmt(r.params_active)} active)" if r.params_active != r.params else ""),
            fmt_seconds(r.wall_seconds),
            fmt(r.final_val_loss),
            r.note,
        ]
        for r in o.runs
    ]
    header, extra = tokenizers.runs_table(o.runs)  # val bpb, fertility, bytes/token: beside the losses
    rows = [row[:-1] + more + row[-1:] for row, more in zip(rows, extra)]
    header = ["run", "status", "steps", "tokens", "params", "wall time", "final val loss", *header, "note"]
    if len({r.kv_bytes_per_token for r in o.runs} - {None}) > 1:  # attention choices: KV memory vs loss
        header.insert(7, "KV cache B/token")
        rows = [row[:7] + [fmt(r.kv_bytes_per_token)] + row[7:] for row, r in zip(rows, o.runs)]
    header, rows, same = _constant_columns(header, rows)
    if same:
        sec.paragraphs.append(", ".join(f"{h} {v}" for h, v in same) + " for every run.")
    sec.tables.append(("Runs", header, rows))
    if o.not_analyzed:
        sec.paragraphs.append("Left out of every comparison (unfinished or failed): " + ", ".join(o.not_analyzed))
    if o.diverged:
        sec.paragraphs.append(
            "Diverged (a result, not a failure: listed apart, never compared): " + ", ".join(o.diverged)
        )
    if o.skipped_folders:
        sec.paragraphs.append("Folders that could not be read: " + "; ".join(o.skipped_folders))
    sec.tables += _changes_tables(report.groups)
    axes = o.axes
    if axes:
        sec.tables.append(
            (
                "Variants on the grid's axes",
                ["variant"] + axes.fields,
                [[v] + [str(a.get(f, "")) for f in axes.fields] for v, a in axes.by_variant.items()],
            )
        )
    return sec


def _config_value(value) -> str:
    """A config value as text: a word as it is, an empty string as "" (not a blank), anything else as JSON."""
    return value if isinstance(value, str) and value else json.dumps(value)


def _changes_tables(groups: list[Group]) -> list[tuple[str, list[str], list[list[str]]]]:
    """What each variant changes, a table per scale group, or one where every scale's changes are the same."""
    if len(groups) > 1 and all(g.changes == groups[0].changes for g in groups):
        return [t for t in [_changes_table(groups[0].changes, " (at every scale)")] if t]
    return [t for g in groups if (t := _changes_table(g.changes, _group_title(g, groups)))]


def _changes_table(c: Changes, suffix: str) -> tuple[str, list[str], list[list[str]]] | None:
    """What each variant changes from the base variant: a row per variant, its differing fields (config.json);
    None with fewer than two variants."""
    if not c.by_variant:
        return None
    rows = [
        [
            v,
            "; ".join(
                f"{x.field}: {_config_value(x.base)} -> {_config_value(x.value)}"
                + (" (user code)" if x.user_code else "")
                for x in changes
            )
            or "nothing (the same config)",
        ]
        for v, changes in c.by_variant.items()
    ]
    return (f"What each variant changes from {c.base}{suffix}", ["variant", "config fields (config.json)"], rows)


def _curves(group: Group, suffix: str, with_images: bool) -> Section:
    sec = Section(
        f"Curves{suffix}",
        [
            "Mean per variant against tokens; the band spans the lowest to the highest "
            "seed. The curve data is in report.json (groups[].series[].curve)."
        ],
    )
    far = [
        f"{s.task} [{s.metric}] (chance {fmt(s.chance)})"
        for s in group.series
        if s.primary and s.chance is not None and not plots.chance_on_axis(s.curve, s.chance)
    ]
    if far:
        sec.paragraphs.append(
            "Chance level far from the curves, not drawn so it does not flatten them: " + ", ".join(far) + "."
        )
    if not with_images:
        sec.paragraphs.append("Plots are embedded in report.html.")
        return sec
    images = [("training loss", plots.curves_png("training loss", "loss", group.train_loss))]
    for s in group.series:
        if s.primary:
            caption = f"{s.task} [{s.metric}]"
            if s.chance is not None and not plots.chance_on_axis(s.curve, s.chance):
                caption += f" (chance {fmt(s.chance)} is far from the curves and not drawn)"
            compared = None if s.compared_at.at_last else s.compared_at.tokens
            if compared is not None:
                caption += f"; dashed: {fmt(compared)} tokens, where finals are compared"
            images.append(
                (
                    caption,
                    plots.curves_png(f"{s.task} [{s.metric}]", s.metric, s.curve, s.chance, compared),
                )
            )
    images.append(("ranking consistency", plots.ranking_png([s for s in group.series if s.primary])))
    sec.images = [(caption, png) for caption, png in images if png]
    return sec


def sections(report: Report, with_images: bool) -> list[Section]:
    """The report in reading order: the verdict and decisions first, the method folded, then the evidence."""
    groups = report.groups
    adaptive = sequential.section(report.sequential)  # an adaptive study's decisions, beside the headline
    out = [
        opening.headline_section(report),
        *([adaptive] if adaptive else []),
        opening.method_section(report),
        _overview_section(report),
    ]
    floor = signal.subject_floor_section(report.subject_floor)
    if floor:
        out.append(floor)
    for group in reversed(groups):  # largest scale first
        suffix = _group_title(group, groups)
        out += [
            decisions.final_scores_section(group, suffix, report, group is groups[-1]),
            _curves(group, suffix, with_images),
            signal.quality_section(group, suffix, report),
        ]
    scales = [g.scale for g in groups]
    pairs = report.scale_pairs or None  # absent from a report.json written before it
    tuning = [t.text for t in pairs.mixed_tuning] if pairs else []
    trust = signal.across_section(report.across_scales, scales, report.options["bootstrap"], tuning)
    if trust:
        out.append(trust)
    ladder = signal.pairs_section(pairs, report.options.get("scale") or [], with_images)
    if ladder:
        out.append(ladder)
    out.append(signal.recommendation_section(report.recommendation))
    out += sweep.sections(report, with_images)  # grid runs on their axes; none without a grid
    compute = multipliers.section(report, with_images)  # effects in compute, on a ladder's compute points
    if compute:
        out.append(compute)
    out.append(
        Section(
            "Cannot compute",
            [] if report.cannot_compute else ["Nothing: every figure was computed."],
            bullets=report.cannot_compute,
        )
    )
    return out


def to_markdown(report: Report) -> str:
    lines = [f"# Ablation report: {md_escape(report.experiment)}", ""]
    for sec in sections(report, with_images=False):
        lines += [f"## {md_escape(sec.title)}", ""]
        if sec.folded:  # folded where markdown renders HTML (GitHub), plain text elsewhere
            lines += [f"<details><summary>{html.escape(sec.folded)}</summary>", ""]
        for p in sec.paragraphs:
            lines += [md_line(p), ""]
        if sec.bullets:
            lines += [f"- {md_line(b)}" for b in sec.bullets] + [""]
        for caption, header, rows in sec.tables:
            lines += [
                f"**{md_escape(caption)}**",
                "",
                "| " + " | ".join(md_escape(h) for h in header) + " |",
                "|" + "---|" * len(header),
            ]
            lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
            lines.append("")
        for p in sec.after:
            lines += [md_line(p), ""]
        if sec.folded:
            lines += ["</details>", ""]
    lines.append(
        f"_Analysis took {report.seconds:.1f}s over {md_escape(report.runs_dir)}; every figure is in report.json._"
    )
    return "\n".join(lines) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px}
th{background:#f2f2f2}caption{text-align:left;font-weight:600;padding:4px 0}.headline{font-size:17px;
background:#eef5ff;padding:10px;border-left:4px solid #36c}img{border:1px solid #ddd}
figure{display:inline-block;margin:4px;vertical-align:top;max-width:560px}figcaption{font-size:12px;color:#555}
.note{font-size:14px;color:#444;margin:.3em 0}summary{cursor:pointer;color:#36c}"""


def to_html(report: Report) -> str:
    e = html.escape
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>ablate report: {e(report.experiment)}"
        f"</title><style>{_CSS}</style></head><body><h1>Ablation report: {e(report.experiment)}</h1>"
    ]
    with plots.as_written():  # the plots of every section (sections/sweep/figures.py's too) show names as written
        content = sections(report, with_images=True)
    for sec in content:
        parts.append(f"<h2>{e(sec.title)}</h2>")
        if sec.folded:
            parts.append(f"<details><summary>{e(sec.folded)}</summary>")
        for p in sec.paragraphs:
            first = sec.title == "Headline" and p is sec.paragraphs[0]
            parts.append(f"<p class='headline'>{e(p)}</p>" if first else f"<p>{e(p)}</p>")
        if sec.bullets:
            parts.append("<ul>" + "".join(f"<li>{e(b)}</li>" for b in sec.bullets) + "</ul>")
        for caption, header, rows in sec.tables:
            parts.append(
                f"<table><caption>{e(caption)}</caption><tr>"
                + "".join(f"<th>{e(h)}</th>" for h in header)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
                + "</table>"
            )
        parts += [f"<p class='note'>{e(p)}</p>" for p in sec.after]
        for caption, png in sec.images:
            parts.append(
                f"<figure><img alt='{e(caption, quote=True)}' src='data:image/png;base64,{png}'>"
                f"<figcaption>{e(caption)}</figcaption></figure>"
            )
        if sec.folded:
            parts.append("</details>")
    parts.append(
        f"<p><em>Analysis took {report.seconds:.1f}s over {e(report.runs_dir)}; every figure is in "
        f"report.json.</em></p></body></html>"
    )
    return "\n".join(parts) + "\n"


def to_json(report: dict) -> str:
    """Strict JSON: non-finite floats become null (the report says "n/a" for them)."""

    def clean(x):
        if isinstance(x, float):
            return x if math.isfinite(x) else None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(report), indent=1, allow_nan=False)
