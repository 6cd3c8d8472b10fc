"""A series' signal: does it rise with training, is its ranking consistent, is it past chance, its SNR, and the
gates a metric passes to be a candidate (series[].quality)."""

from __future__ import annotations

from ablate.report.schema.record import Record, figure, record


@record
class ChanceCheckpoint(Record):
    """Distance from chance at one checkpoint, pooled over runs."""

    step: int = figure("the step")
    tokens: int = figure("its tokens")
    mean: float = figure("the mean score over runs")
    z: float | None = figure("standard errors past chance (oriented)")


@record
class Chance(Record):
    """Distance from chance in standard errors, gain over the choices-only baseline: pooled over runs (mean
    stderr)."""

    chance: float | None = figure("the chance level; null where none is defined (then every figure here is null)")
    z_final: float | None = figure("standard errors past chance at the compared point")
    first_significant_step: int | None = figure("the first checkpoint at least --min-z past chance")
    first_significant_tokens: int | None = figure("its tokens")
    by_checkpoint: list[ChanceCheckpoint] = figure("every checkpoint all runs share")
    gain_over_choices_only: float | None = figure("the mean gain over the choices-only baseline (acc_ metrics)")
    gain_z: float | None = figure("that gain in standard errors (unpaired: conservative)")


@record
class RankingCheckpoint(Record):
    """One checkpoint's ranking of the variants against the final one."""

    step: int = figure("the step")
    tokens: int = figure("its tokens")
    tau: float | None = figure("Kendall tau against the final ranking")
    decision_accuracy: float | None = figure("the share of pairs ordered as the final ranking orders them")


@record
class Ranking(Record):
    """Kendall tau and decision accuracy of each checkpoint's ranking vs the final one, at equal tokens
    [DataDecide]."""

    by_checkpoint: list[RankingCheckpoint] = figure("the checkpoints of the run that reached the fewest tokens")
    tau_second_half: float | None = figure("mean tau over the second half of training")
    consistent_from_step: int | None = figure("the earliest checkpoint from which every later tau clears --min-tau")
    consistent_from_fraction: float | None = figure("that checkpoint as a share of training")
    early_step: int | None = figure("the first checkpoint past --early-fraction of training")
    early_decision_accuracy: float | None = figure("its decision accuracy")


@record
class Criteria(Record):
    """The gates a metric passes to be a candidate: true, false, or null (not computable, never a pass)
    [FineTasks, OLMES]."""

    monotone: bool | None = figure("monotonicity >= --min-monotonicity")
    consistent: bool | None = figure("tau_second_half >= --min-tau")
    above_chance: bool | None = figure(
        "z_final >= --min-z and past the choices-only baseline; only metrics with a chance level", optional=True
    )
    snr: bool | None = figure("snr >= --min-snr; only with --min-snr", optional=True)

    def applied(self) -> dict[str, bool | None]:
        """The gates that apply to this series, in order (an absent one does not apply): true, false or None."""
        return self.to_json()


@record
class Quality(Record):
    """A series' signal criteria."""

    monotonicity: float | None = figure(
        "does the score rise with training: Spearman rho of score vs step, mean over runs [FineTasks]"
    )
    monotonicity_per_run: dict[str, float | None] = figure("each run's Spearman rho", keys="run")
    seed_spread: float | None = figure("mean over variants of the seed sd at the compared point")
    checkpoint_spread: float | None = figure("mean over runs of the sd of its last --last-k checkpoints")
    signal: float | None = figure(
        "SNR's signal at the comparison point: range of variant scores / their mean [Signal and Noise (Heineman et "
        "al. 2025)]"
    )
    noise: float | None = figure("SNR's noise: mean within-run sd (ddof 1) of the last n checkpoints up to it")
    snr: float | None = figure("signal / noise")
    noise_checkpoints: int | None = figure("n: the checkpoints the noise is measured over")
    chance: Chance = figure("distance from chance in standard errors, gain over the choices-only baseline")
    ranking: Ranking = figure("Kendall tau and decision accuracy of each checkpoint's ranking vs the final one")
    criteria: Criteria = figure("the gates a metric passes to be a candidate")
    passes: bool = figure(
        "every criterion true: monotone, consistent, above chance (accuracies); never for baselines and answer-blind "
        "diagnostics"
    )
