"""The report's `sequential` section: an adaptive study's contrasts recomputed from its run folders (study.json's
own copies are not trusted), its rule and the rule's history, its rounds, the compute it used against the fixed
design's, and the method in words. The decisions themselves are decide.py's, the contrasts contrasts.py's."""

from __future__ import annotations

from ablate.report.inputs import study as study_file
from ablate.report.schema.sequential import Contrast, Rule, Sequential, StudyCompute
from ablate.report.stats.anytime import MIXTURE_G
from ablate.report.sections.sequential.contrasts import study_contrasts, trained_order
from ablate.report.sections.sequential.decide import open_variants
from ablate.report.sections.sequential.rule import DecisionRule, voids_guarantee


def read_study(runs_dir) -> dict | None:
    """The adaptive study under runs_dir (inputs/study.py reads study.json), or None where there is none. Raises
    ValueError naming the file when it is not a study record (its rule among what is checked)."""
    study = study_file.read_study(runs_dir)
    if study is None:
        return None
    try:
        DecisionRule.from_dict(study["rule"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{study_file.study_path(runs_dir)}: not a study record ({exc})") from None
    return study


def _study_variants(study: dict) -> list[str] | None:
    named = [v for r in study.get("rounds") or [] for v in (r.get("seeds") or {})]
    return list(dict.fromkeys(named)) or None


def _run_compute(run) -> tuple[float, float | None]:
    """(training tokens, device-seconds: wall time x devices) of one run, from its summary (else its last logged
    tokens, and no time)."""
    summary = run.summary or {}
    tokens = summary.get("tokens", run.train_loss[-1].tokens if run.train_loss else 0) or 0
    wall = summary.get("wall_seconds")
    if wall is None:
        return float(tokens), None
    return float(tokens), float(wall) * run.world_size


def study_compute(runs, variants: list[str], max_seeds: int) -> StudyCompute:
    """Tokens and device-seconds of the study's runs, and their share of a fixed design of max_seeds seeds for every
    variant (each variant's runs costing what its runs cost on average)."""
    used_tokens, used_seconds, fixed_tokens, fixed_seconds = 0.0, 0.0, 0.0, 0.0
    timed = True
    for v in variants:
        costs = [_run_compute(r) for r in runs if r.variant == v]
        if not costs:
            continue
        tokens = [c[0] for c in costs]
        used_tokens += sum(tokens)
        fixed_tokens += max_seeds * sum(tokens) / len(tokens)
        seconds = [c[1] for c in costs if c[1] is not None]
        timed = timed and len(seconds) == len(costs)
        used_seconds += sum(seconds)
        fixed_seconds += max_seeds * sum(seconds) / len(seconds) if seconds else 0.0
    return StudyCompute(
        tokens=int(used_tokens),
        device_seconds=used_seconds if timed else None,
        fixed_design_seeds=max_seeds,
        fixed_design_tokens=int(fixed_tokens),
        fixed_design_share=used_tokens / fixed_tokens if fixed_tokens else None,
        fixed_design_share_time=used_seconds / fixed_seconds if timed and fixed_seconds else None,
    )


def study_section(runs, study: dict, max_token_gap: float | None = None) -> Sequential:
    """report.json's `sequential`: the contrasts recomputed from the run folders (study.json's own copies are not
    trusted) in the order the study trained its seeds, the rule and its history, the rounds, the compute used, and
    how the study stopped. max_token_gap: the report's --max-token-gap."""
    rule = DecisionRule.from_dict(study["rule"])
    variants = _study_variants(study)
    contrasts = study_contrasts(runs, rule, variants, trained_order(study), max_token_gap)
    names = variants or sorted({r.variant for r in runs})
    history = study.get("rule_history") or []
    after = [i for i, h in enumerate(history) if h.get("set_after_results")]
    changed = [(i, history[i]) for i in after if voids_guarantee(_changed_fields(history, i), _design(history, i))]
    return Sequential(
        design=rule.design,
        method=method_text(rule, len(contrasts)),
        rule=Rule(**rule.to_dict()),
        rule_history=history,
        rule_changed_after_results=bool(changed),
        rule_changes=[_change_text(history, i) for i, _ in changed],
        stopping_changes=[_change_text(history, i) for i in after if (i, history[i]) not in changed],
        alpha=rule.alpha,
        alpha_per_contrast=rule.alpha / max(1, len(contrasts)),
        rounds=len(study.get("rounds") or []),
        stopped=study.get("stopped"),
        contrasts=[Contrast(**c.to_dict()) for c in contrasts],  # JSON's values: an unbounded end is null
        open=sorted(open_variants(contrasts)),
        compute=study_compute(runs, names, rule.max_seeds),
    )


def folder_contrasts(runs_dir, rule: DecisionRule, variants=None, trained=None, max_token_gap=None) -> list:
    """contrasts.study_contrasts over the runs under runs_dir, read as the report reads them (inputs/runs.py): what
    the study's driver (launch/study.py) decides after each round."""
    from ablate.report.inputs.runs import load_runs

    return study_contrasts(load_runs(runs_dir)[0], rule, variants, trained, max_token_gap)


def method_text(rule: DecisionRule, contrasts: int) -> str:
    if rule.design == "anytime":
        g = ", ".join(f"{g:g}" for g in MIXTURE_G)
        return (
            f"anytime-valid t-test from e-values (group-invariant safe t-test, mixture over g {g}), Bonferroni over "
            f"{contrasts} contrast(s)"
        )
    futility = f", futility below {rule.futility:g} (non-binding)" if rule.futility else ""
    return (
        f"group-sequential t-test over looks up to {rule.max_seeds} seeds ({rule.spending} alpha spending on the "
        f"information fraction, boundaries calibrated for the t by simulation; repeated confidence intervals"
        f"{futility}), Holm's recycling over {contrasts} contrast(s) (alpha / {contrasts} each, alpha / (K - r) once "
        f"r are decided on a side)"
    )


def _design(history: list[dict], i: int) -> str:
    """The design the study ran under before history entry i changed its rule."""
    return DecisionRule.from_dict(history[max(i - 1, 0)]["rule"]).design


def _changed_fields(history: list[dict], i: int) -> set[str] | None:
    """The rule fields history entry i changed from entry i - 1 (None for the first entry: the rule set)."""
    if not i:
        return None
    new, old = (DecisionRule.from_dict(history[k]["rule"]) for k in (i, i - 1))
    return set(new.changes_from(old, fields_only=True))


def _change_text(history: list[dict], i: int) -> str:
    """'after round 2: alpha: 0.05 -> 0.1' for the rule history's entry i (set after results were seen)."""
    new = DecisionRule.from_dict(history[i]["rule"])
    what = "; ".join(new.changes_from(DecisionRule.from_dict(history[i - 1]["rule"]))) if i else "set"
    return f"after round {history[i].get('round')}: {what or 'unchanged'}"
