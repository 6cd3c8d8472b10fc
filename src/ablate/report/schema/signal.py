"""Which signal to trust: every task x metric across scales (`across_scales`), the groups left out below an SNR
floor (`subject_floor`), and each task's chosen metric (`recommendation`)."""

from __future__ import annotations

from ablate.report.schema.record import Record, ScaleValue, figure, record


@record
class MetricRef(Record):
    """A task x metric."""

    task: str = figure("the task")
    metric: str = figure("the metric")


@record
class ScaleRow(Record):
    """One smaller scale's ranking against the largest's [DataDecide, Magnusson et al. 2025]."""

    scale: ScaleValue = figure("the smaller scale")
    variants: list[str] = figure("the variants both scales have")
    seeds: int = figure("the fewest seeds of a variant on either side")
    snr: float | None = figure("the metric's SNR at this scale")
    decision_accuracy: float | None = figure("against the task's target (primary metric) at the largest scale")
    decision_accuracy_val: float | None = figure("against validation loss at the largest scale")
    self_agreement: float | None = figure("against the same metric at the largest scale")
    tau: float | None = figure("Kendall tau against the target")
    ci: list[float] | None = figure("the bootstrap interval of decision_accuracy (seeds and items), where shown")
    ci_note: str | None = figure("why the interval is not shown")
    paired: bool | None = figure("whether every variant holds the same seeds on both sides (resampled together)")
    coverage: float | None = figure("the interval's measured coverage at these seeds on constructed ladders")
    item_noise: str | None = figure("how the item set's share entered: per-item files or logged standard errors")

    def key_order(self) -> tuple[str, ...] | None:
        """da.shown_interval's orders: the interval (ci_note null), hidden with a note, or not computed (all null)."""
        head = ("scale", "variants", "seeds", "snr", "decision_accuracy", "decision_accuracy_val", "self_agreement")
        if self.ci_note is not None:
            return (*head, "tau", "ci", "paired", "coverage", "item_noise", "ci_note")
        if self.paired is not None:
            return (*head, "tau", "ci", "paired", "item_noise", "ci_note", "coverage")
        return None


@record
class AcrossScales(Record):
    """Every task x metric of the largest scale: its SNR and decision accuracy at each smaller scale."""

    task: str = figure("the task")
    metric: str = figure("the metric")
    direction: str = figure("higher or lower")
    primary: bool = figure("whether it is the task's primary metric")
    snr: float | None = figure("its SNR at the largest scale")
    target: MetricRef | None = figure("the task's target at the largest scale (its primary metric)")
    target_valid: bool = figure("false where the target is an accuracy at chance: no ranking to validate against")
    by_scale: list[ScaleRow] = figure("each smaller scale")
    mean_decision_accuracy: float | None = figure("mean over the smaller scales")
    mean_decision_accuracy_val: float | None = figure("mean over the smaller scales, against validation loss")
    mean_self_agreement: float | None = figure("mean over the smaller scales, against itself")


@record
class SubjectFloor(Record):
    """A grouped task's metric (MMLU's subjects) with groups below --subject-snr-floor left out of its average."""

    task: str = figure("the task")
    metric: str = figure("the metric")
    floor: float = figure("the floor (--subject-snr-floor)")
    dropped: list[str] = figure("the groups left out")
    groups: int = figure("the task's groups")
    kept: int = figure("the groups kept")
    snr: dict[str, float | None] = figure("each group's mean SNR over the choosing scales", keys="group")
    chosen_at: list[ScaleValue] = figure("the scales the groups were chosen on (the smaller ones, with a scale axis)")
    in_sample: bool = figure("chosen on the runs compared (one scale): the report says so")
    note: str = figure("when every group is below the floor: all kept")


@record
class Thresholds(Record):
    """The gates' thresholds (the options)."""

    min_monotonicity: float = figure("--min-monotonicity")
    min_z: float = figure("--min-z")
    min_tau: float = figure("--min-tau")
    min_snr: float | None = figure("--min-snr")


@record
class TracksTask(Record):
    """Whether a continuous metric follows its task (sections/signal/tracking.py)."""

    against: str = figure("the evidence: target_da, val_da, or at equal training against the accuracy")
    value: float | None = figure("its decision accuracy or tau")
    passes: bool = figure("whether it tracks the task")
    weaker: str | None = figure("why the evidence is validation loss, the weaker one")


@record
class Figures(Record):
    """A chosen metric's figures."""

    monotonicity: float | None = figure("Spearman rho")
    snr: float | None = figure("SNR")
    tau: float | None = figure("tau over the second half of training")
    decision_accuracy: float | None = figure("mean DA against the evidence's target; null without a scale axis")
    tracks_task: TracksTask | None = figure("for a continuous metric: whether it tracks its task")


@record
class OtherMetric(Record):
    """A metric the choice did not take."""

    metric: str = figure("the metric")
    why: str = figure("why it lost")


@record
class Choice(Record):
    """One task's metric: the one it enters the decisions through, or none."""

    task: str = figure("the task")
    metric: str | None = figure("the chosen metric; null when none passes")
    status: str = figure("chosen, no_signal or not_assessable")
    evidence: str = figure("what ranked the metrics: target_da, val_da or consistency")
    figures: Figures | None = figure("the chosen metric's figures")
    others: list[OtherMetric] = figure("why each other metric lost")
    text: str = figure("the choice in words")
    direction: str | None = figure("the chosen metric's direction")
    passing_metrics: list[str] = figure("the metrics that pass the gates")


@record
class SuiteEntry(Record):
    """A task with a chosen metric."""

    task: str = figure("the task")
    metric: str = figure("its chosen metric")
    direction: str = figure("higher or lower")
    passing_metrics: list[str] = figure("the metrics that pass the gates")


@record
class Rejected(Record):
    """A task without a chosen metric."""

    task: str = figure("the task")
    status: str = figure("no_signal or not_assessable")
    reasons: dict[str, str] = figure("why each metric fails", keys="metric")


@record
class Aggregate(Record):
    """One variant over the decision metrics."""

    mean_z: float | None = figure("mean z-score over the decision metrics (oriented)")
    mean_rank: float | None = figure("mean rank (1 = best)")
    tasks: int = figure("the decision metrics averaged")


@record
class Recommendation(Record):
    """Each task's metric, its evidence and figures, and why each other metric lost."""

    thresholds: Thresholds = figure("the gates' thresholds")
    choices: list[Choice] = figure("each task's choice (validation's too)")
    suite: list[SuiteEntry] = figure("the tasks with a chosen metric")
    rejected: list[Rejected] = figure("the tasks without one")
    aggregate: dict[str, Aggregate] = figure("each variant over the decision metrics", keys="variant")
    aggregate_over: list[list[str]] = figure("the [task, metric] pairs the aggregate is over")


@record
class ScaleCompute(Record):
    """One scale's compute per run: the mean training FLOPs of its finished runs."""

    scale: ScaleValue = figure("the scale")
    flops: float | None = figure("mean FLOPs per run (summary.json flops, else FLOPs per token x tokens)")
    runs: int = figure("the runs counted")
    note: str = figure("why there is no figure, in words")


@record
class PairDA(Record):
    """One pair of scales: the smaller's ranking of the variants against the larger's [DataDecide, Magnusson et
    al. 2025]."""

    small: ScaleValue = figure("the smaller scale (the proxy)")
    large: ScaleValue = figure("the larger scale (the target)")
    compute_ratio: float | None = figure("the smaller's FLOPs per run over the larger's")
    variants: list[str] = figure("the variants both scales have")
    pairs: int = figure("the variant pairs ranked")
    seeds: int = figure("the fewest seeds of a variant on either side")
    decision_accuracy: float | None = figure("the share of variant pairs the smaller orders as the larger does")
    target_valid: bool = figure("false where the larger scale's metric is an accuracy at chance")
    ci: list[float] | None = figure("the interval of decision_accuracy (stats/da.py: seeds and items), where shown")
    ci_note: str | None = figure("why the interval is not shown")
    paired: bool | None = figure("whether every variant holds the same seeds on both sides (resampled together)")
    coverage: float | None = figure("the interval's measured coverage at these seeds on constructed ladders")
    item_noise: str | None = figure("how the item set's share entered: per-item files or logged standard errors")


@record
class MetricPairs(Record):
    """A task's primary metric: its decision accuracy for every pair of scales."""

    task: str = figure("the task")
    metric: str = figure("its primary metric, the same on both sides")
    direction: str = figure("higher or lower")
    pairs: list[PairDA] = figure("each pair of scales, by compute ratio")
    text: str = figure("the pairs in words")


@record
class MixedTuning(Record):
    """A hyperparameter whose optimum drifts with the scale (the sweep's drift) that the compared variants hold
    fixed across the scales: a comparison across them mixes the choice with tuning."""

    hyperparameter: str = figure("the hyperparameter (optim.lr)")
    scale: str = figure("the scale axis it drifts along")
    per_doubling: float = figure("the drift: the optimum's factor per doubling of the scale")
    per_doubling_ci: list[float] = figure("its 95% interval (excludes 1)")
    variants: list[str] = figure("the variants that hold it at one value across the scales")
    text: str = figure("the caution in words")


@record
class ScalePairs(Record):
    """Decision accuracy for every pair of scales against their compute ratio (DataDecide, arXiv 2504.11393)."""

    compute: list[ScaleCompute] = figure("each scale's compute per run, the smallest first")
    metrics: list[MetricPairs] = figure("each task's primary metric (validation loss first)")
    mixed_tuning: list[MixedTuning] = figure("drifting hyperparameters the variants hold fixed across the scales")
    note: str = figure("what could not be computed, in words")
