"""The runs table (report.json's "overview"): each run's status, steps, tokens, size, time and tokenizer, the
variants and seeds, the variants' grid axes, and which runs the analysis leaves out."""

from __future__ import annotations

from ablate.report.inputs import tokenizers
from ablate.report.inputs.runs import Run
from ablate.report.schema import Overview, RunRow
from ablate.report.schema.runs import Axes
from ablate.text import natural_key


def overview(runs: list[Run], skipped: list[str], compute_points: list[str]) -> Overview:
    """One row a run, then the study's variants, seeds and axes; skipped: the folders load_runs skipped;
    compute_points: the labels of the runs only the multipliers read."""
    rows = []
    for r in runs:
        s = r.summary or {}
        rows.append(
            RunRow(
                run=r.label,
                variant=r.variant,
                seed=r.seed,
                status=r.status,
                note=r.note,
                steps=r.last_step,
                max_steps=r.planned_steps,
                tokens=s.get("tokens", r.train_loss[-1].tokens if r.train_loss else None),
                params=s.get("params"),
                params_active=s.get("params_active", s.get("params")),  # with experts: those a token uses
                kv_bytes_per_token=s.get("kv_cache_bytes_per_token"),
                wall_seconds=s.get("wall_seconds"),
                final_val_loss=s.get("final_val_loss"),
                **tokenizers.overview_fields(r),
            )
        )
    return Overview(
        variants=sorted({r.variant for r in runs}, key=natural_key),
        seeds=sorted({r.seed for r in runs}),
        axes=axes(runs),
        runs=rows,
        not_analyzed=[r.label for r in runs if r.status not in ("finished", "diverged")],
        diverged=[r.label for r in runs if r.status == "diverged"],
        skipped_folders=skipped,
        total_wall_seconds=sum(r.wall_seconds or 0 for r in rows),
        compute_points=compute_points,  # runs at a budget the comparisons do not share (inputs/compute_points.py)
    )


def axes(runs: list[Run]) -> Axes | None:
    """Variants laid out on grid axes: from config["axes"] (recorded by grid()), else from names of the form
    "lr=0.001,global_batch=16". None when the variants are not a grid."""
    by_variant = {}
    for run in runs:
        axes = run.config.get("axes")
        if isinstance(axes, dict) and axes:
            by_variant[run.variant] = {k.split(".")[-1]: v for k, v in axes.items()}
        else:
            parts = [p.split("=", 1) for p in run.variant.split(",")]
            if not all(len(p) == 2 and p[0] for p in parts):
                return None
            by_variant[run.variant] = dict(parts)
    fields = list(dict.fromkeys(k for axes in by_variant.values() for k in axes))
    if not fields:
        return None
    return Axes(fields=fields, by_variant={v: by_variant[v] for v in sorted(by_variant, key=natural_key)})
