"""What was read: the runs (`overview`), the tasks they were scored on, and their tokenizers."""

from __future__ import annotations

from ablate.report.schema.record import ConfigValue, Record, Scalar, figure, record


@record
class RunRow(Record):
    """One run folder, as the runs table shows it."""

    run: str = figure("the run's label, variant/seedK")
    variant: str = figure("its variant folder")
    seed: int = figure("its training seed")
    status: str = figure("finished, diverged, failed, interrupted, running or pending")
    note: str = figure("why it stopped where it did (a failure's message, a divergence's step), or empty")
    steps: int = figure("the last step it logged")
    max_steps: int = figure("the steps it was planned to train")
    tokens: int | None = figure("training tokens seen (summary.json, else its last logged point)")
    params: int | None = figure("parameters (summary.json)")
    params_active: int | None = figure("parameters a token uses (with experts: fewer than params)")
    kv_bytes_per_token: int | None = figure("KV-cache bytes per token at inference (summary.json)")
    wall_seconds: float | None = figure("its training's wall time")
    final_val_loss: float | None = figure("its last validation loss (summary.json)")
    tokenizer: str = figure("its tokenizer, as the runs table names it")
    final_val_bpb: float | None = figure("its last validation bits per byte (summary.json)")
    fertility: float | None = figure("tokens per word of its validation documents under its tokenizer")
    bytes_per_token: float | None = figure("UTF-8 bytes per token of its validation documents")
    continued_word_rate: float | None = figure("share of tokens that continue a word")
    vocab_use: float | None = figure("share of the vocabulary its validation documents use")


@record
class Axes(Record):
    """Variants laid out on grid axes: from config.json's `axes` (grid()), else from names of the form
    lr=0.001,global_batch=16."""

    fields: list[str] = figure("the axes' short names, in order")
    by_variant: dict[str, dict[str, Scalar]] = figure("each variant's value on each axis", keys="variant")


@record
class Overview(Record):
    """Every run folder read, before any comparison."""

    variants: list[str] = figure("every variant, in natural order")
    seeds: list[int] = figure("every seed")
    axes: Axes | None = figure("the variants on grid axes; null when they are not a grid")
    runs: list[RunRow] = figure("one row per run folder")
    not_analyzed: list[str] = figure("runs neither finished nor diverged: left out of every figure")
    diverged: list[str] = figure("runs that diverged: listed apart, their variant never named winner")
    skipped_folders: list[str] = figure("folders that are not run folders, each with why")
    total_wall_seconds: float = figure("the runs' wall time, summed")
    compute_points: list[str] = figure(
        "runs that are compute points (an arm at another budget): out of the comparisons, read by the multipliers"
    )


@record
class TaskRow(Record):
    """One task the runs were scored on (val: validation)."""

    task: str = figure("the task's key (val for validation; :cf the cloze form)")
    primary: str = figure("its primary metric")
    metrics: list[str] = figure("every metric it logged")
    chance: float | None = figure("chance accuracy (accuracies); ln(vocab) for validation loss")
    n: int | None = figure("its items")
    groups: int = figure("groups it averages over (MMLU's subjects); 0 for none")


@record
class Tokenizers(Record):
    """The runs' tokenizers and what validation is compared by (docs: Runs of different tokenizers)."""

    differ: bool = figure("whether the finished runs use more than one tokenizer")
    tokenizers: list[str] = figure("each tokenizer, as the runs table names it")
    compared_by: str | None = figure("loss, bpb (bits per byte, across tokenizers), or null: validation left out")
    text: str = figure("the sentence the headline ends with (empty when one tokenizer)")


@record
class Change(Record):
    """One config field a variant sets apart from the base variant (config.json, dotted)."""

    field: str = figure("the field, dotted (model.n_kv_heads)")
    base: ConfigValue = figure("the base variant's value (null where its config.json lacks the field)")
    value: ConfigValue = figure("this variant's value (null where its config.json lacks the field)")
    user_code: bool = figure(
        "whether the value names a component the experiment file registered (config.json's user_code): named, its "
        "source not compared"
    )


@record
class Changes(Record):
    """What each variant changes: the config fields where its first run's config.json differs from the base
    variant's, bookkeeping left out (name, experiment, axes, train.seed, a branch's parent identity, the digests of
    user code)."""

    base: str | None = figure(
        "the variant compared against: --baseline (or the file's multiplier_baseline) where it names one, else the "
        "first in natural order; null without a finished variant"
    )
    by_variant: dict[str, list[Change]] = figure(
        "each other variant's differing fields, in field order ([] where it differs in none)", keys="variant"
    )
