"""Each variant's effect in the currency of compute, from the compute points of a ladder (`multipliers`; docs:
Effects in compute)."""

from __future__ import annotations

from ablate.report.schema.record import Record, Scalar, ScaleValue, figure, record


@record
class Floor(Record):
    """The E (irreducible loss) the baseline's curves use."""

    option: str | float = figure("--multiplier-floor: auto, shared or a loss")
    used: str | float | None = figure("the E used: shared, a pinned value, or null (fitted per rung)")
    E: float | None = figure("the shared E's value")
    E_carried: bool = figure("whether the shared E's uncertainty is in each interval")
    text: str = figure("the floor in words")


@record
class CurveFit(Record):
    """One rung's baseline fit, L = E + A C^-alpha."""

    E: float = figure("E")
    A: float = figure("A")
    alpha: float = figure("alpha")
    E_pinned: bool = figure("whether E was pinned (given or shared)")


@record
class Band(Record):
    """The fitted curve and its pointwise interval on a grid of FLOPs."""

    flops: list[float] = figure("the grid")
    loss: list[float] = figure("the fitted loss")
    low: list[float] | None = figure("the band's low end; null under 2 seeds")
    high: list[float] | None = figure("its high end")


@record
class RungCurve(Record):
    """The baseline's curve at one rung."""

    fit: CurveFit | None = figure("the fit; null where none could be made")
    band: Band = figure("the fit's 90% band (absent without a fit)", optional=True)
    note: str = figure("why there is no fit")


@record
class Rung(Record):
    """One rung of the ladder."""

    rung: ScaleValue = figure("its scale value")
    baseline: RungCurve = figure("the baseline's fit there")


@record
class Sensitivity(Record):
    """How M moves with a pinned E."""

    E_range: list[float] = figure("the E range tried")
    multipliers: list[float | None] = figure("M at its two ends")
    spread: list[float] | None = figure("the lowest and highest M over the range")
    flagged: bool = figure("whether M moves more than its interval")


@record
class LackOfFit(Record):
    """Does E + A C^-alpha follow the rung's points (Hotelling's T^2 over seeds, or pooled t^2)?"""

    p: float | None = figure("its p")
    stat: float | None = figure("the statistic")
    df: list[float] | None = figure("its F degrees of freedom")
    directions: int = figure("the residual directions tested")
    pooled: bool = figure("whether the seed variance was pooled over the rungs")
    note: str = figure("why the form is not tested", optional=True)


@record
class BudgetRatio(Record):
    """M at another budget of the arm over this row's M."""

    flops: float = figure("the other budget")
    ratio: float = figure("the ratio")
    interval: list[float] | None = figure("its interval")
    established: bool = figure("whether the interval excludes 1")


@record
class BudgetEntry(Record):
    """M at one of the arm's budgets."""

    flops: float = figure("the budget's FLOPs")
    loss: float = figure("the variant's loss there")
    multiplier: float | None = figure("M")
    interval: list[float] | None = figure("its interval")
    extrapolated: bool = figure("whether the loss lies beyond the baseline's points")
    seeds: int = figure("the seeds")
    note: str = figure("why no M, in words")


@record
class MultiplierRow(Record):
    """One variant, rung and kind at the variant's main budget."""

    variant: str = figure("the variant")
    baseline: str = figure("the baseline")
    rung: ScaleValue = figure("the rung")
    flops: float = figure("the variant's FLOPs")
    loss: float = figure("its loss (seed mean)")
    multiplier: float | None = figure(
        "M: the baseline's compute for that loss over the variant's (null where not identifiable)"
    )
    interval: list[float] | None = figure("M's interval at level")
    level: float = figure("the interval's level")
    kind: str = figure("data (against the rung's baseline) or frontier (the baseline's envelope over rungs)")
    extrapolated: bool = figure("whether the loss lies beyond the baseline's points")
    seeds: int = figure("the variant's seeds")
    wall_clock_multiplier: float | None = figure(
        "M times the variant's measured FLOP/s over the baseline's (this machine)"
    )
    log_multiplier: float | None = figure("log M")
    log_se: float | None = figure("its standard error")
    df: float | None = figure("its degrees of freedom")
    E: float | None = figure("the E of the curve it was read from")
    E_pinned: bool | None = figure("whether that E was pinned")
    sensitivity: Sensitivity | None = figure("how M moves with a pinned E")
    item_var: float | None = figure("the persistent item term of Var(log M); null without per-item files")
    read_from: str | None = figure("power law, or local quadratic where the fit fails")
    lack_of_fit: LackOfFit | None = figure("the baseline fit's lack-of-fit test")
    budget_ratios: list[BudgetRatio] = figure("M at each other budget over this one")
    note: str = figure("why no M, and warnings, in words")
    frontier_rung: ScaleValue = figure("frontier rows: the rung whose baseline attains the envelope", optional=True)
    rung_key: list[Scalar] = figure("the rung as its scale fields' values")
    params: int | None = figure("the variant's parameters")
    by_budget: list[BudgetEntry] = figure("M at the arm's budgets: does M depend on the budget?")


@record
class Trend(Record):
    """How a variant's M changes across rungs."""

    slope: float | None = figure("slope of log M per unit log compute (>= 3 rungs)")
    ratio: float | None = figure("M at the larger rung over the smaller (2 rungs)")
    interval: list[float] | None = figure("its interval")
    established: bool = figure("whether the interval excludes no change")
    rungs: int = figure("the rungs with a multiplier and its interval")
    note: str = figure("how it was read, in words")


@record
class Projection(Record):
    """M carried along its trend to --multiplier-target: an extrapolation."""

    target_flops: float = figure("the target")
    multiplier: float | None = figure("M there")
    interval: list[float] | None = figure("its interval")
    extrapolation: bool = figure("always true: no measurement at the target")
    note: str = figure("in words")


@record
class BootstrapCheck(Record):
    """The seed bootstrap beside a row's interval (>= 5 seeds): a check, not the interval."""

    interval: list[float] | None = figure("the percentile interval")
    n_boot: int = figure("the resamples")
    used: int = figure("the resamples that gave a multiplier")
    note: str = figure("in words")


@record
class ComputePointRow(Record):
    """One compute point: an arm at one budget."""

    method: str = figure("its method")
    rung: ScaleValue = figure("its rung")
    seed: int = figure("its seed")
    run: str = figure("its run")
    budget: list[Scalar] = figure("its budget")
    main: bool = figure("whether it is the arm's main budget")
    flops: float | None = figure("its FLOPs")
    loss: float | None = figure("its loss")
    counts: bool = figure("whether it counts (annealed, finished)")
    why: str = figure("why not")


@record
class Multipliers(Record):
    """Compute multipliers on a ladder. Without --baseline: baseline null, no rows and a note saying how to ask (the
    keys marked optional absent)."""

    baseline: str | None = figure("the method M is measured against")
    baseline_from: str = figure("where its name came from: --baseline or the experiment file", optional=True)
    level: float = figure("the intervals' level", optional=True)
    floor: Floor = figure("the E the curves use", optional=True)
    rungs: list[Rung] = figure("each rung's baseline fit and band", optional=True)
    rows: list[MultiplierRow] = figure("one per variant, rung and kind")
    trends: dict[str, Trend] = figure("each variant's trend across rungs", optional=True, keys="variant")
    projections: dict[str, Projection] | None = figure(
        "each variant's projection to --multiplier-target (null without it)", optional=True, keys="variant"
    )
    bootstrap: dict[str, BootstrapCheck] = figure(
        "the seed bootstrap, per 'variant at rung'", optional=True, keys="variant at rung"
    )
    points: list[ComputePointRow] = figure("every compute point, whether it counts and why not", optional=True)
    left_out: list[str] = figure("the points that do not count, with why", optional=True)
    notes: list[str] = figure("notes on the points read", optional=True)
    note: str = figure("without --baseline: how to ask")
