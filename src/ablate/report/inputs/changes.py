"""What each variant changes: the config fields (config.json's "config", dotted: model.n_kv_heads) where a variant's
runs differ from the base variant's, so a reader sees what each comparison is of.

The base is the variant named as the baseline (--baseline, or the experiment file's multiplier_baseline) where it
is one of the compared variants, else the first in natural order. Bookkeeping that differs from run to run or
repeats other fields is left out (the name, the experiment, grid() axes, train.seed, a branch's parent identity);
so are the digests of user code (user_code, eval.task_code): a field whose value names a component the experiment
file registered is shown by that name, marked, and its source is not compared.
"""

from __future__ import annotations

from ablate.report.inputs.runs import Run, flatten
from ablate.report.schema import Change, Changes

LEFT_OUT = {"experiment", "name", "train.seed", "branch.parent_identity"}
LEFT_OUT_UNDER = ("axes.", "user_code.", "eval.task_code.")


def compared_fields(config: dict) -> dict:
    """A config's fields, dotted, without the bookkeeping."""
    return {k: v for k, v in flatten(config).items() if k not in LEFT_OUT and not k.startswith(LEFT_OUT_UNDER)}


def user_components(config: dict) -> set[str]:
    """The names of the user components a run trains or is scored with: user_code's keys ("ffn:relu2" -> relu2)
    and its user tasks'; none for a config.json from before they were recorded."""
    digests = [config.get("user_code"), (config.get("eval") or {}).get("task_code")]
    return {str(key).split(":")[-1] for d in digests if isinstance(d, dict) for key in d}


def _names_user_code(value, names: set[str]) -> bool:
    """A text value naming one of `names` (a comma-separated list, such as eval.tasks, naming one among them)."""
    return isinstance(value, str) and any(part.strip() in names for part in value.split(","))


def field_changes(base: dict, config: dict) -> list[Change]:
    """The fields where `config` differs from `base` (both config.json's "config"), in the variant's field order,
    then those only the base holds."""
    mine, theirs = compared_fields(config), compared_fields(base)
    names = user_components(config)
    order = [*mine, *(k for k in theirs if k not in mine)]
    return [
        Change(field=k, base=theirs.get(k), value=mine.get(k), user_code=_names_user_code(mine.get(k), names))
        for k in order
        if mine.get(k) != theirs.get(k)
    ]


def variant_changes(runs_by_variant: dict[str, list[Run]], baseline: str | None) -> Changes:
    """Each variant's changes from the base variant, read from its first run's config (runs in seed order)."""
    if not runs_by_variant:
        return Changes(base=None, by_variant={})
    base = baseline if baseline in runs_by_variant else next(iter(runs_by_variant))
    first = {v: min(rs, key=lambda r: r.seed).config for v, rs in runs_by_variant.items()}
    return Changes(base=base, by_variant={v: field_changes(first[base], c) for v, c in first.items() if v != base})
