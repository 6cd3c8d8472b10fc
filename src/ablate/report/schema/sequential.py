"""An adaptive study (ablate run --until-decided): its rule, its contrasts recomputed from the run folders, and the
compute it used against a fixed design's (`sequential`; docs: Adaptive studies)."""

from __future__ import annotations

from ablate.report.schema.record import Record, figure, record


@record
class Rule(Record):
    """The study's decision rule (sections/sequential/rule.DecisionRule)."""

    metrics: list[str] = figure("the decision metrics: val_loss, val_bpb or task/metric")
    margins: dict[str, float] = figure("each metric's equivalence margin", keys="metric")
    alpha: float = figure("the chance of any wrong decision over the whole study")
    max_seeds: int = figure("seeds per variant at most")
    budget: str = figure("tokens or hours of compute at most; empty for none")
    design: str = figure("group_sequential or anytime")
    spending: str = figure("the group-sequential design's alpha spending")
    futility: float = figure("the estimated chance of a decision below which a contrast closes (0: never)")


@record
class Contrast(Record):
    """One pair of variants on one decision metric, recomputed from the run folders."""

    a: str = figure("the first variant")
    b: str = figure("the second")
    metric: str = figure("the decision metric")
    decision: str = figure(
        "a, b (the better side), equivalent, futile (closed for futility; study.json files before 2026-11-27 say "
        "undecidable) or open"
    )
    seeds: int = figure("the paired seeds")
    interval: list[float | None] | None = figure(
        "[low, high] for mean(a - b): the anytime sequence or the repeated interval; null ends where unbounded"
    )
    estimate: float | None = figure("mean(a - b)")
    margin: float | None = figure("the metric's equivalence margin")
    decided_at: int | None = figure("the paired seeds at which it was first decided")
    note: str = figure("unfinished or failed runs not paired, a metric missing, no item-noise floor")
    boundary: float | None = figure("group-sequential: the critical |t| of its last look")
    looks: list[int] = figure("group-sequential: the paired seeds at each look")
    level: float | None = figure("the alpha it was judged at (Holm's recycling)")
    chance: float | None = figure("closed for futility: its estimated chance of a decision")
    fixed_power: float | None = figure(
        "closed for futility: the fixed max_seeds-seed design's power at the difference seen"
    )


@record
class StudyCompute(Record):
    """The compute the study used against a fixed design's."""

    tokens: int = figure("training tokens of the study's runs")
    device_seconds: float | None = figure("wall time x devices; null where a run has no time")
    fixed_design_seeds: int = figure("the fixed design's seeds per variant (max_seeds)")
    fixed_design_tokens: int = figure("the fixed design's tokens")
    fixed_design_share: float | None = figure("tokens used over the fixed design's")
    fixed_design_share_time: float | None = figure("device time used over the fixed design's")


@record
class Sequential(Record):
    """The adaptive study, whose decisions lead the headline."""

    design: str = figure("group_sequential or anytime")
    method: str = figure("the method in words")
    rule: Rule = figure("the rule")
    # study.json's own record, copied as the study driver wrote it (launch/study.py): a study recorded by an older
    # ablate holds that version's rule fields, so a record here would refuse the reports of older studies
    rule_history: list[dict] = figure("each rule set or changed: rule, set_after_results, round (study.json's)")
    rule_changed_after_results: bool = figure(
        "whether the rule changed after results in a way that voids the guarantee"
    )
    rule_changes: list[str] = figure("those changes in words")
    stopping_changes: list[str] = figure("changes of where the study stops only, in words")
    alpha: float = figure("the study's alpha")
    alpha_per_contrast: float = figure("alpha over the contrasts")
    rounds: int = figure("the rounds run")
    stopped: str | None = figure("decided (every contrast decided or closed), max_seeds, budget, or null")
    contrasts: list[Contrast] = figure("every contrast, in the order the study trained its seeds")
    open: list[str] = figure("variants in an open contrast")
    compute: StudyCompute = figure("the compute used")
