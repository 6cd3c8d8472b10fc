"""What the report decides: the error control over the whole study (`inference`) and the decisions in words
(`headline`)."""

from __future__ import annotations

from ablate.report.schema.record import Record, figure, record


@record
class Family(Record):
    """One error-control family: Benjamini-Hochberg within it, at its alpha."""

    name: str = figure("primary (the primary metric's pairs) or tasks (every other candidate metric's)")
    alpha: float = figure("its level: alpha x primary_share, or the rest of alpha (all of it when carried forward)")
    comparisons: int = figure("its pairs")
    tests: int = figure("the pairs tested")
    rejected: int = figure("the pairs significant")
    first_step_alpha: float = figure("alpha over its size: where a lone real effect must pass")
    metrics: list[list[str]] = figure("its [task, metric] pairs")
    carried_forward: bool = figure(
        "the tasks family only: the primary family rejected every pair it tested, its alpha carried forward",
        optional=True,
    )


@record
class Inference(Record):
    """The study's error control, in two families (a fallback procedure)."""

    method: str = figure("the procedure, in words")
    alpha: float = figure("the study's error rate (--alpha): A/A any-claim rate")
    level: str = figure("the level of replication tested: the training seed")
    min_seeds: int = figure("seeds per variant needed to test (--min-seeds)")
    power: float = figure("the power seeds needed is estimated for (--power)")
    family: str = figure("the families in words")
    families: list[Family] = figure("the two families")
    tests: int = figure("the comparisons tested")
    comparisons: int = figure("the comparisons")
    metrics: list[list[str]] = figure("the decision metrics, [task, metric]")
    family_metrics: list[list[str]] = figure("every metric in a family, [task, metric]")
    valid_under_optional_stopping: bool = figure(
        "false in an adaptive study: these fixed-n tests looked after every round", optional=True
    )
    optional_stopping_note: str = figure("the same in words (adaptive studies)", optional=True)


@record
class OpenPair(Record):
    """The leader's closest pair not decided, as the decisions table shows it."""

    a: str = figure("the leader")
    b: str = figure("the other variant")
    p_bh: float | None = figure("its adjusted p")
    testable: bool = figure("whether it was tested")
    untested: str | None = figure("why not: seeds, tokens or no_spread")
    note: str = figure("the same in words")
    seeds_needed: int | None = figure("seeds per variant it would need")
    seeds_needed_range: list[int] | None = figure("over an 80% interval of the sd")
    more_items: bool | None = figure("whether only more items can resolve it")


@record
class Decision(Record):
    """The decision on one decision metric."""

    task: str = figure("the task")
    metric: str = figure("the metric")
    name: str = figure("its short name")
    direction: str = figure("higher or lower")
    leader: str = figure("the variant ahead (a tie: either)")
    ahead_of: list[str] = figure("the variants it is significantly ahead of")
    not_separated_from: list[str] = figure("the others")
    seeds: int = figure("the fewest seeds of a variant")
    seeds_needed: int | None = figure("seeds needed for the closest pair")
    seeds_needed_range: list[int] | None = figure("over an 80% interval of the sd")
    p_bh: dict[str, float | None] = figure("the leader's pair with each other variant: its adjusted p", keys="variant")
    decided: list[list[str]] = figure("the significant pairs as [better, worse]")
    closest_open: OpenPair | None = figure("the leader's closest pair not decided; null when every pair is")
    status: str = figure("best, ahead, no_difference, too_few_seeds, not_tested or tie")
    text: str = figure("the sentence")


@record
class Headline(Record):
    """The report in words: the sentence, the short verdict, the notes, each decision."""

    winner: str | None = figure(
        "the variant significantly best on some decision metric and behind on none, with no failed or diverged seed"
    )
    decisions: list[Decision] = figure("each decision metric's decision")
    no_signal: list[str] = figure("tasks with no signal here")
    not_assessable: list[str] = figure("tasks whose signal these runs cannot assess")
    left_out: list[str] = figure("tasks left out: runs scored different items")
    failures: dict[str, str] = figure(
        "variants with failed or diverged seeds, in words (absent with fewer than 2 variants)",
        optional=True,
        keys="variant",
    )
    text: str = figure("the sentence")
    verdict: str = figure("the short verdict")
    notes: list[str] = figure("the notes shown after the decisions table")
    sequential: str = figure("an adaptive study's decisions in words (adaptive studies)", optional=True)
    rule_changed_after_results: bool = figure(
        "the study's rule changed after results were seen (adaptive studies)", optional=True
    )
    compute: str = figure("what each variant is worth in compute, in words (compute multipliers)", optional=True)
