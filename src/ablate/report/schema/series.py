"""Per scale group (`groups[]`, the largest last), per task x metric (`series[]`): the final scores, the pairwise
tests and the curves. A series' signal figures are quality.py's."""

from __future__ import annotations

from ablate.report.schema.quality import Quality
from ablate.report.schema.record import Record, ScaleValue, figure, record
from ablate.report.schema.runs import Changes


@record
class ComparedAt(Record):
    """Where a series' finals are read: like with like."""

    tokens: int | None = figure("the largest token count every run reached; each run's evaluation at or before it")
    at_last: bool = figure("whether that is every run's last evaluation")
    text: str = figure("the same in words, for the report")


@record
class SeriesRun(Record):
    """One run's logged evaluations of the series' metric."""

    variant: str = figure("its variant")
    seed: int = figure("its seed")
    steps: list[int] = figure("the steps it was evaluated at")
    tokens: list[int] = figure("the tokens at each")
    values: list[float] = figure("the score at each")
    stderr: list[float | None] = figure("the logged standard error of each score")


@record
class Final(Record):
    """One variant's score at the comparison point."""

    mean: float = figure(
        "variant v's score at the comparison point: mean over seeds of each run's mean over the compared items"
    )
    seed_std: float | None = figure("sd over seeds (ddof 1); null under 2 seeds")
    values: list[float] = figure("each run's score, in seed order")
    seeds: list[int] = figure("the seeds, in order")
    steps: list[int] = figure("each run's compared step")
    tokens: list[int] = figure("each run's compared token count")
    ci: list[float] | None = figure(
        "95% t interval under the tests' noise model (max(s^2, fresh) / k + the item set's sampling variance of the "
        "mean, Satterthwaite df; without per-item files the logged standard errors; none under 2 seeds) [Student]"
    )
    n_items: int | None = figure("the items compared (null without per-item files)")
    averaged: list[int] = figure("each run's evaluations averaged into its score (--average-last)")


@record
class Curve(Record):
    """A variant's curve over its runs, at the steps every run logged."""

    steps: list[int] = figure("the steps every run has")
    tokens: list[int] = figure("the tokens at each (the first run's)")
    mean: list[float] = figure("mean over runs")
    std: list[float] | None = figure("sd over runs (ddof 1); null under 2 runs")
    min: list[float] = figure("the lowest run")
    max: list[float] = figure("the highest run")


@record
class Pairwise(Record):
    """One pair of variants tested at the level of the training seed (a before b in variant order)."""

    a: str = figure("the first variant")
    b: str = figure("the second variant")
    diff: float = figure("a - b: the mean per-seed difference over the seeds both ran (Welch: of the means)")
    better: str | None = figure("the variant ahead by the estimate, oriented by the metric's direction; null at 0")
    test: str | None = figure("the test run: paired t or Welch")
    paired: bool = figure("whether the test paired the seeds both variants ran (>= 2 shared)")
    p_seeds: float | None = figure(
        "seed-level p: paired t over the seeds both ran (Welch under 2 shared), Var = seed_var / k + item_var, "
        "Satterthwaite df [Student / Welch]"
    )
    n_seeds: int | None = figure("the paired seeds (null for Welch)")
    n_seeds_a: int = figure("a's seeds")
    n_seeds_b: int = figure("b's seeds")
    sd_diff: float | None = figure("the seed sd the test used: the larger of sd_seeds and noise_floor_sd")
    sd_seeds: float | None = figure("the per-seed differences' sd (ddof 1)")
    noise_floor_sd: float | None = figure(
        "the fresh answer-noise sd of one difference: residual mean square of seeds x items / items"
    )
    item_sd: float | None = figure(
        "the persistent item-set sd of the mean difference (not divided by seeds): (between-item variance of "
        "seed-averaged differences - residual / k) / items [Satterthwaite]"
    )
    item_df: float | None = figure("item_sd's degrees of freedom")
    noise_source: str | None = figure("where the item noise came from: per-item files or logged standard errors")
    noise_assumption: str | None = figure("the assumption made without per-item files")
    df: float | None = figure("the test's degrees of freedom (Satterthwaite)")
    seeds_agree: int | None = figure("paired seeds whose difference has the sign of diff")
    testable: bool = figure("whether the pair was tested")
    token_gap: float | None = figure("how far apart the compared points are in tokens (relative)")
    untested: str | None = figure(
        "why not tested: seeds (fewer than --min-seeds shared), tokens (points > --max-token-gap apart or a token "
        "count missing), no_spread (no spread and no item noise)"
    )
    seeds_needed: int | None = figure(
        "seeds per variant for 80% power at the family's first BH step: noncentral t, averaged over the chi-square "
        "of the sd"
    )
    seeds_needed_range: list[int] | None = figure("seeds_needed over an 80% interval of the sd")
    more_items: bool | None = figure(
        "whether only more items can resolve the difference (the item set's own noise hides it at any seed count)"
    )
    ci: list[float] | None = figure(
        "the test's 95% interval of the difference: diff +- t(df) se with the test's se and df; excludes 0 exactly "
        "when p_seeds < alpha; none for an untested pair"
    )
    p_items: float | None = figure("item-level p (evaluation noise only): paired t over items with seeds fixed")
    n_items: int | None = figure("the items both scored")
    family: str | None = figure("the pair's error-control family: primary or tasks (inference.families)")
    p_bh: float | None = figure(
        "Benjamini-Hochberg adjusted p within the family, at its alpha [Benjamini & Hochberg 1995; fallback: Wiens "
        "2003]"
    )
    significant: bool | None = figure("p_bh < the family's alpha; null for a pair not tested")
    note: str = figure("why not tested, and how it was paired, in words")


@record
class Series(Record):
    """One task x metric in one scale group."""

    task: str = figure("the task's key")
    metric: str = figure("the metric")
    primary: bool = figure("whether it is the task's primary metric")
    direction: str = figure("higher or lower (is better)")
    chance: float | None = figure("the score of a model that knows nothing, where one is defined")
    baseline: bool = figure("a choices-only baseline (answer priors): never a signal")
    diagnostic: bool = figure("answer-blind: the same whichever choice is gold, never a decision metric")
    has_items: bool = figure("whether per-item files (eval_items/) were compared")
    compared_at: ComparedAt = figure(
        "where the finals are read: the largest token count every run reached, each run's evaluation at or before it"
    )
    runs: dict[str, SeriesRun] = figure("each run's logged scores", keys="run")
    final: dict[str, Final] = figure("each variant's score at the comparison point", keys="variant")
    best: str | None = figure("the leader from the paired estimates, none of its pairs significantly behind")
    pairwise: list[Pairwise] = figure("every pair of variants")
    curve: dict[str, Curve] = figure("each variant's curve over its runs", keys="variant")
    quality: Quality = figure("the signal criteria")


@record
class Failure(Record):
    """A variant with a failed or diverged seed: never the winner on its surviving seeds."""

    seeds: int = figure("its runs")
    by_state: dict[str, list[int]] = figure("the seeds in each state (diverged, failed)", keys="state")


@record
class ItemMismatch(Record):
    """A task whose runs scored different items."""

    task: str = figure("the task")
    runs: dict[str, int] = figure("each run's items", keys="run")
    shared: int | None = figure("the items every run scored (null without per-item files)")
    kept: bool = figure("whether the task is compared over the shared items (else left out)")
    text: str = figure("the same in words")


@record
class LoggedCurve(Record):
    """A metrics.jsonl key's curves: every numeric key a run logged but the training loss (train_loss) and
    validation's (the series): a callback's figures, loss terms, the learning rate, throughput."""

    key: str = figure("the metrics.jsonl key")
    curve: dict[str, Curve] = figure("each variant's curve over its runs that logged the key", keys="variant")


@record
class Group(Record):
    """One scale group (one without a scale axis): its finished runs, per task x metric."""

    scale: ScaleValue = figure("the scale field's value (a list for several fields; null without --scale)")
    failures: dict[str, Failure] = figure("variants with a failed or diverged seed", keys="variant")
    variants: list[str] = figure("the variants with a finished run, in natural order")
    seeds: dict[str, list[int]] = figure("each variant's finished seeds", keys="variant")
    changes: Changes = figure("what each variant changes: its config fields that differ from the base variant's")
    shape_differences: dict[str, dict[str, list[str]]] = figure(
        "config fields that change a step's tokens and differ between runs: each value's runs", keys="field"
    )
    item_mismatch: list[ItemMismatch] = figure("tasks whose runs scored different items, one per task")
    train_loss: dict[str, Curve] = figure("each variant's training loss curve", keys="variant")
    logged: list[LoggedCurve] = figure(
        "every other numeric metrics.jsonl key's curves (decided on with --metric); left out where none is logged",
        optional=True,
    )
    series: list[Series] = figure("every task x metric")
