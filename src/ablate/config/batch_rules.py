"""The rules of a batch schedule's fields (train.batch_*): a table that reads, batches of whole micro-batches."""

from __future__ import annotations

from ablate.config.errors import ConfigError, require


def parse_batch_stages(text: str) -> list[tuple[int, int]]:
    """'0:8,200000:16' -> [(0, 8), (200000, 16)]: (tokens seen, global batch from there on); ConfigError if bad."""
    where, allowed = "train.batch_stages", "allowed: 'tokens:batch,...' starting at 0 with increasing tokens"
    stages = []
    for part in text.split(","):
        tokens, sep, batch = part.strip().partition(":")
        try:
            stages.append((int(tokens), int(batch)))
        except ValueError:
            raise ConfigError(f"{where}: cannot read {part.strip()!r}; {allowed}, e.g. '0:8,200000:16'") from None
        require(bool(sep) and stages[-1][1] > 0, where, f"{part.strip()!r}: {allowed}, batches > 0")
    require(stages[0][0] == 0 and all(a[0] < b[0] for a, b in zip(stages, stages[1:])), where, f"{text!r}: {allowed}")
    return stages


def validate_batch_schedule(t) -> None:
    """A TrainConfig's batch schedule fields, together; ConfigError naming the first that cannot run."""
    kind = t.batch_schedule
    require(t.max_tokens >= 0, "train.max_tokens", "must be >= 0 (0: max_steps x global_batch x seq_len)")
    if kind in ("ramp", "dynamic"):
        require(
            0 < t.batch_start <= t.global_batch,
            "train.batch_start",
            f"{kind}: must be in (0, train.global_batch={t.global_batch}], got {t.batch_start}",
        )
        require(t.batch_ramp_tokens > 0, "train.batch_ramp_tokens", f"{kind}: must be > 0")
        # the schedule's batches are whole micro-batches: another start would be rounded (4 with micro_batch 16
        # trains at 16 from the first step, and the ramp is gone without a word)
        rounded = max(t.micro_batch, t.batch_start // t.micro_batch * t.micro_batch)
        require(
            t.batch_start % t.micro_batch == 0,
            "train.batch_start",
            f"{kind}: {t.batch_start} is not a multiple of train.micro_batch={t.micro_batch} (the schedule's "
            f"batches are whole micro-batches: it would start at {rounded}); allowed: multiples of "
            f"{t.micro_batch} up to {t.global_batch}, or a smaller train.micro_batch",
        )
    if kind == "stages":
        require(bool(t.batch_stages.strip()), "train.batch_stages", "stages: needs a table, e.g. '0:8,200000:16'")
        batches = [b for _, b in parse_batch_stages(t.batch_stages)]
        bad = [b for b in batches if b > t.global_batch]
        require(
            not bad,
            "train.batch_stages",
            f"batches {bad} exceed train.global_batch={t.global_batch} (the "
            f"largest batch, which data preparation and memory are checked against)",
        )
        bad = [b for b in batches if b % t.micro_batch]
        require(
            not bad,
            "train.batch_stages",
            f"batches {bad} are not multiples of train.micro_batch="
            f"{t.micro_batch}; allowed: multiples of {t.micro_batch}, or a smaller train.micro_batch",
        )
    else:
        require(
            not t.batch_stages.strip(),
            "train.batch_stages",
            f"only read when batch_schedule='stages', not {kind!r}; allowed here: ''",
        )
