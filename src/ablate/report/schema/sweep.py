"""Runs built by grid() on their axes (`sweep`; docs/sweeps.md): the cells, the heatmap, the optimum LR, the
critical batch size and the power law in model size."""

from __future__ import annotations

from ablate.report.schema.record import Record, Scalar, figure, record


@record
class SweepMetric(Record):
    """What the cells are scored by."""

    task: str = figure("val, or train_loss when no run validated")
    metric: str = figure("loss")
    direction: str = figure("lower")
    source: str = figure("where each cell's score is read, in words (equal tokens where runs differ)")


@record
class Cell(Record):
    """One combination of axis values, its seeds averaged."""

    values: list[Scalar] = figure("its value on each axis")
    label: str = figure("axis=value,...")
    seeds: list[int] = figure("its seeds")
    finals: list[float | None] = figure("each seed's score")
    mean: float = figure("their mean")
    std: float | None = figure("their sd (ddof 1)")
    min: float = figure("the lowest")
    max: float = figure("the highest")
    params: float | None = figure("mean parameters (summary.json)")


@record
class HeatmapBest(Record):
    """The best cell."""

    label: str = figure("its label")
    mean: float = figure("its score")


@record
class Heatmap(Record):
    """The score over two axes, the others held at the best cell's values."""

    x: str = figure("the x axis (LR when swept)")
    y: str = figure("the y axis (batch size when swept)")
    x_values: list[Scalar] = figure("its values")
    y_values: list[Scalar] = figure("its values")
    fixed: dict[str, Scalar] = figure("the other axes, at the best cell's values", keys="axis")
    mean: list[list[float | None]] = figure("the score, [y][x]; null for a missing cell")
    n_seeds: list[list[int]] = figure("the seeds, [y][x]")
    best: HeatmapBest = figure("the best cell")


@record
class LrFit(Record):
    """The optimum LR: a quadratic in log10(LR) through the best LR and its two neighbours."""

    status: str = figure("vertex, at_most, at_least, not_convex or too_few")
    lr_opt: float | None = figure("the vertex")
    value_opt: float | None = figure("the fitted score there")
    bound_lr: float | None = figure("the bound when the best LR is the grid's edge")
    best_lr: float = figure("the best LR measured")
    best_value: float = figure("its score")
    coef: list[float] | None = figure("the quadratic's coefficients (score in log10 LR)")
    window: list[float] | None = figure("the LRs fitted")
    within: list[float] | None = figure("the LRs whose fitted score is within the tolerance of the optimum's")
    within_beyond_grid: bool | None = figure("whether that range leaves the grid")
    tolerance: float = figure("the tolerance (relative)")
    ci: list[float] | None = figure("95% bootstrap interval of lr_opt (seeds resampled at each LR)")
    ci_share: float | None = figure("the share of resamples that found a vertex")
    n_boot: int = figure("the resamples")
    note: str = figure("what the fit could not do, in words")


@record
class LrView(Record):
    """The score against LR for one value of the other axes."""

    context: dict[str, Scalar] = figure("the other axes' values", keys="axis")
    label: str = figure("the same as a label")
    lrs: list[float] = figure("the LRs")
    n_seeds: list[int] = figure("the seeds at each")
    mean: list[float] = figure("the mean score at each")
    std: list[float | None] = figure("the sd at each")
    min: list[float] = figure("the lowest at each")
    max: list[float] = figure("the highest at each")
    fit: LrFit = figure("the optimum LR")


@record
class BatchCurve(Record):
    """One batch size's seed-mean loss curve at its best LR."""

    batch: Scalar = figure("the batch size")
    steps: list[float] = figure("the steps every seed logged")
    tokens: list[float] = figure("the tokens at each")
    mean: list[float] = figure("the seed-mean loss (training loss smoothed)")
    min: list[float] = figure("the lowest seed")
    max: list[float] = figure("the highest seed")


@record
class Crossing(Record):
    """Where one batch size's curve first reaches a target loss."""

    batch: Scalar = figure("the batch size")
    tokens_per_step: float = figure("E / S")
    steps: float = figure("S: the steps to the target (interpolated)")
    tokens: float = figure("E: the tokens to the target")


@record
class CriticalFit(Record):
    """(S/S_min - 1)(E/E_min - 1) = 1, B_crit = E_min / S_min [McCandlish et al.]."""

    status: str = figure("fit, no_tradeoff or too_few")
    s_min: float | None = figure("S_min")
    e_min: float | None = figure("E_min")
    b_crit: float | None = figure("B_crit in tokens per step")
    rel_rmse: float | None = figure("the fit's relative RMSE in S")
    note: str = figure("what the fit could not do")
    b_crit_sequences: float | None = figure("B_crit in sequences")
    ci: list[float] | None = figure("95% bootstrap interval of B_crit (seeds resampled)", optional=True)
    ci_sequences: list[float] | None = figure("the same in sequences", optional=True)
    ci_share: float = figure("the share of resamples that gave a fit", optional=True)


@record
class WsdLinear(Record):
    """The WSD relation's linear stage, E = a1 S + a0."""

    a1: float = figure("A1 (B_min where a1, a0 > 0)")
    a0: float = figure("A0")
    n: int = figure("the batch sizes fitted")


@record
class WsdFit(Record):
    """The WSD-revised E(S) (Zhou et al. 2026): B_opt at the vertex of its quadratic stage, B_min its linear one."""

    status: str = figure("vertex, at_least, at_most, not_convex or too_few")
    s_opt: float | None = figure("S at the vertex")
    e_min: float | None = figure("E at the vertex")
    b_opt: float | None = figure("B_opt = E_min / S_opt, tokens per step")
    bound_b: float | None = figure("the bound when the most token-efficient batch is the grid's edge")
    most_efficient_b: float = figure("the batch size that reached the loss in fewest tokens")
    coef: list[float] | None = figure("the quadratic stage's coefficients")
    window_s: list[float] | None = figure("the S range fitted")
    window_span: float | None = figure("the window's largest batch over its smallest")
    b_min: float | None = figure("B_min = A1 of the linear stage")
    linear: WsdLinear | None = figure("the linear stage's fit")
    note: str = figure("what the fit could not do")
    b_opt_sequences: float | None = figure("B_opt in sequences")
    b_min_sequences: float | None = figure("B_min in sequences")
    bound_b_sequences: float | None = figure("bound_b in sequences")
    ci: list[float] | None = figure("95% bootstrap interval of B_opt (seeds resampled)", optional=True)
    ci_sequences: list[float] | None = figure("the same in sequences", optional=True)
    ci_share: float = figure("the share of resamples that found a vertex", optional=True)


@record
class BMinObserved(Record):
    """The grid's own bound on B_min."""

    at_most: Scalar = figure("the smallest batch size that reached the loss")
    above: Scalar = figure("the largest smaller one that did not")


@record
class MiniCpm(Record):
    """MiniCPM's batch-size rule, 1.2110e9 / L^6.2393 tokens: a reference, not comparable across corpora."""

    tokens: float = figure("in tokens")
    sequences: float = figure("in sequences")


@record
class Target(Record):
    """One target loss."""

    loss: float = figure("the target loss")
    points: list[Crossing] = figure("each batch size that reached it")
    not_reached: list[Scalar] = figure("the batch sizes that did not")
    critical: CriticalFit = figure("the critical batch size")
    wsd: WsdFit = figure("B_opt and B_min")
    b_min_observed: BMinObserved = figure("the grid's own bound on B_min")
    minicpm: MiniCpm = figure("MiniCPM's rule")


@record
class BatchView(Record):
    """Steps and tokens to target losses per batch size, for one value of the other axes."""

    context: dict[str, Scalar] = figure("the other axes' values (LR aside)", keys="axis")
    label: str = figure("the same as a label")
    curve: str = figure("val_loss (every run validated >= 3 times) or train_loss")
    seq_len: float = figure("tokens per sequence")
    batches: list[Scalar] = figure("the batch sizes, each at its best LR")
    cells: list[str] = figure("the cells used")
    short_curves: list[str] = figure("cells with too few points to cross a target")
    curves: list[BatchCurve] = figure("each batch size's curve")
    targets: list[Target] = figure("each target loss")
    n_boot: int = figure("the bootstrap's resamples")
    note: str = figure("what the view could not do")


@record
class Size(Record):
    """One model size: its best cell."""

    values: dict[str, Scalar] = figure("the size axes' values", keys="axis")
    label: str = figure("the same as a label")
    params: float | None = figure("parameters (summary.json, else the axis value)")
    params_from: str = figure("summary or axis value")
    best: str = figure("its best cell")
    mean: float = figure("that cell's score")
    finals: list[float | None] = figure("that cell's seeds' scores")
    cells: dict[str, float] = figure("each cell of the other axes at this size: its score", keys="cell")


@record
class PowerLawCi(Record):
    """95% bootstrap intervals of the power law's parameters."""

    E: list[float] | None = figure("of E")
    A: list[float] | None = figure("of A")
    alpha: list[float] | None = figure("of alpha")


@record
class PowerLawFit(Record):
    """L(N) = E + A N^-alpha over parameters."""

    status: str = figure("fit, or why not")
    E: float | None = figure("E")
    A: float | None = figure("A")
    alpha: float | None = figure("alpha")
    ci: PowerLawCi | None = figure("their intervals (seeds resampled)")
    n_boot: int = figure("the resamples")
    rmse: float | None = figure("the fit's RMSE")
    note: str = figure("what the fit could not do")


@record
class SizeDecision(Record):
    """A smaller size's ranking of the other axes' cells against the largest size's."""

    label: str = figure("the size")
    params: float = figure("its parameters")
    cells: list[str] = figure("the cells both sizes have")
    decision_accuracy: float | None = figure("the share of pairs ordered as at the largest size")
    tau: float | None = figure("Kendall tau")


@record
class ScaleView(Record):
    """The model-size axis."""

    axes: list[str] = figure("the size axes")
    ranked: list[str] = figure("the other axes, whose cells are ranked")
    sizes: list[Size] = figure("each size, smallest first")
    fit: PowerLawFit | None = figure("L(N); null for a score that is not a loss")
    decision: list[SizeDecision] = figure("each smaller size's ranking against the largest's")
    note: str = figure("what the view could not do")


@record
class DriftPoint(Record):
    """One scale's optimum, as the drift reads it."""

    scale: float = figure("the scale axis's value")
    status: str = figure("its fit's status: vertex, at_most, at_least, not_convex or too_few")
    optimum: float | None = figure("the vertex")
    bound: float | None = figure("the bound when the best value is the grid's edge")
    ci: list[float] | None = figure("95% interval of the optimum over the drift's replicates (seeds resampled)")


@record
class Drift(Record):
    """How a swept hyperparameter's optimum moves along a scale axis: the slope of log2(optimum) on log2(scale)."""

    hyperparameter: str = figure("the swept hyperparameter (optim.lr)")
    scale: str = figure("the scale axis (model.d_model or a --scale field)")
    context: dict[str, Scalar] = figure("the other axes' values", keys="axis")
    label: str = figure("the same as a label")
    status: str = figure("fit, bounded (an optimum at its grid's edge), no_optimum or too_few")
    slope: float | None = figure("d log2(optimum) / d log2(scale), least squares over the scales")
    intercept: float | None = figure("the line's log2(optimum) at log2(scale) = 0")
    per_doubling: float | None = figure("2^slope: the factor the optimum moves by per doubling of the scale")
    ci: list[float] | None = figure("95% interval of the slope: seeds resampled in every cell, widened by t(df)/z")
    per_doubling_ci: list[float] | None = figure("the same as factors per doubling")
    verdict: str | None = figure("drift (the interval excludes 0), none (it holds 0), null: no interval to judge")
    bound_side: str | None = figure("bounded: at_most or at_least, where every edge pushes the slope one way")
    slope_bound: float | None = figure("bounded: the slope through the vertices and the edges' bounds")
    per_doubling_bound: float | None = figure("the same as a factor per doubling")
    rmse: float | None = figure("the line's RMSE in log2(optimum) (>= 3 scales)")
    df: float | None = figure("the seed degrees of freedom the interval rests on (Welch-Satterthwaite)")
    ci_share: float | None = figure("the share of replicates where every scale's optimum stayed a vertex")
    n_boot: int = figure("the resamples")
    points: list[DriftPoint] = figure("each scale's optimum, smallest scale first")
    note: str = figure("what the fit could not do, in words")


@record
class Sweep(Record):
    """grid() runs on their axes; the views need their axes (absent where the axes could not be read)."""

    axes: list[str] = figure("the grid's axes")
    metric: SweepMetric | None = figure("what the cells are scored by; null where the axes could not be read")
    cells: list[Cell] = figure("every cell, in axis order")
    heatmap: Heatmap | None = figure("the score over two axes; null under 2 axes", optional=True)
    lr: list[LrView] | None = figure(
        "the optimum LR per value of the other axes; null without an LR axis", optional=True
    )
    batch: list[BatchView] | None = figure(
        "steps and tokens to target losses; null without a train.global_batch axis", optional=True
    )
    scale: ScaleView | None = figure("the power law in model size; null without a size axis", optional=True)
    drift: list[Drift] | None = figure(
        "the optimum's drift along each numeric size axis; null without an LR axis and a size axis", optional=True
    )
    notes: list[str] = figure("what was left out and why")
