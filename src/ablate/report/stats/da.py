"""Decision accuracy (DataDecide, Magnusson et al. 2025) with a bootstrap interval that keeps the design and the
noise model (noise.paired_noise), and the measured coverage that decides whether the interval is shown.

Decision accuracy: the share of variant pairs a smaller scale's metric orders as the target orders them at the
largest scale (oriented scores: larger is better on each side; a pair tied at the smaller scale counts one half,
pairs tied in the target are left out).

Interval: two sources of noise, as in every test of the report. Seeds: seed k of every variant at one scale shares
data order and init, so a replicate resamples seed indices once for all variants of a scale (paired),
independently per scale (different scales are different runs); where the variants of a scale ran different seed
lists, each variant's seeds are resampled apart (paired False). Items: every seed and every variant scored the same
eval items, so a variant's lead that rests on a few items is there on every seed and no seed resample sees it
vary; a replicate resamples the items once and every run of the replicate is scored over them (both scales, where
they compared the same item ids). Without per-item files, each variant's mean gets a draw of its logged item
variance (mean stderr^2 over seeds, counted in full as persistent: the noise model's upper bound); without either,
no interval is shown.

Coverage: the interval is a percentile bootstrap of a discrete statistic from a few seeds; whether its 95% holds
was measured on constructed ladders with a known DA (COVERAGE_DESIGN, da_coverage) and is tabulated by seed count
in COVERAGE, recomputed by `python -m ablate.report.stats.da` and checked by tests/test_report_da.py. The report
shows an interval only where the tabulated coverage at its seed count is >= MIN_COVERAGE.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ablate.report.stats.describe import pair_signs

MIN_COVERAGE = 0.90  # the least measured coverage of a nominal 95% interval for it to be shown
# The constructed ladder: 4 variants scored on 40 items; at the largest scale true oriented means 0, 1, 2, 3 (seed
# sd 0.5 of the gap: a target the largest scale resolves); at the smaller scale the first two swapped (true DA 5/6),
# seed sd from half the gap between neighbours to 4 gaps; a seed effect shared by a scale's variants (sd 3 gaps) on
# both. Item quirks: each variant answers some items better and others worse on every seed (zero mean over the
# population of items), at both scales; item_set_sds is the sd this gives the variant's mean over the 40 items.
COVERAGE_DESIGN = {
    "large_means": (0.0, 1.0, 2.0, 3.0),
    "small_means": (1.0, 0.0, 2.0, 3.0),
    "large_seed_sd": 0.5,
    "small_seed_sds": (0.5, 1.0, 2.0, 4.0),
    "shared_seed_sd": 3.0,
    "items": 40,
    "item_set_sds": (0.0, 1.0),
}
# Measured coverage of the 95% paired interval: {seeds: {item set sd: coverage at each of small_seed_sds}};
# `python -m ablate.report.stats.da 1000 500` (1000 ladders per cell, 500 replicates each, RNG seed 0) prints
# this table.
COVERAGE_BY_NOISE = {
    2: {0.0: (1.0, 1.0, 0.993, 0.969), 1.0: (0.988, 0.988, 0.988, 0.977)},
    3: {0.0: (1.0, 1.0, 0.997, 0.985), 1.0: (0.982, 0.984, 0.987, 0.982)},
    4: {0.0: (1.0, 1.0, 0.999, 0.984), 1.0: (0.99, 0.988, 0.989, 0.992)},
    5: {0.0: (1.0, 1.0, 0.999, 0.986), 1.0: (0.984, 0.982, 0.986, 0.989)},
    6: {0.0: (1.0, 1.0, 0.998, 0.993), 1.0: (0.99, 0.991, 0.994, 0.996)},
    8: {0.0: (1.0, 1.0, 1.0, 0.999), 1.0: (0.986, 0.988, 0.987, 0.99)},
    10: {0.0: (1.0, 1.0, 1.0, 0.999), 1.0: (0.981, 0.985, 0.988, 0.993)},
}  # 152 s on one core
# The figure the report uses: the lowest over the noise levels tried (the interval must hold at each).
COVERAGE = {n: min(min(c) for c in by_items.values()) for n, by_items in COVERAGE_BY_NOISE.items()}
ITEM_SOURCES = ("per-item files", "logged standard errors")  # how a scale's item noise enters, best first


@dataclass
class Scale:
    """One scale's oriented scores, per variant k: scores[k] {seed: run score}; items[k] {seed: per-item values
    over the same ids for every run of the scale} where the runs have per-item files (a run score is their mean);
    else item_var[k], the variant's mean logged stderr^2 (None where it logged none)."""

    scores: list[dict]
    items: list[dict] | None = None
    ids: list[str] | None = None
    item_var: list[float | None] | None = None

    @property
    def item_source(self) -> str | None:
        if self.items is not None:
            return ITEM_SOURCES[0]
        if self.item_var is not None and all(v is not None for v in self.item_var):
            return ITEM_SOURCES[1]
        return None


def decision_accuracy(guess: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """DA of oriented means `guess` against `truth` along the last axis (any leading axes): NaN where every pair
    of the truth is tied."""
    g, t = pair_signs(np.asarray(guess, float)), pair_signs(np.asarray(truth, float))
    counted = t != 0
    score = np.where(g == 0, 0.5, (g == t).astype(float)) * counted
    n = counted.sum(axis=-1)
    return np.where(n > 0, score.sum(axis=-1) / np.maximum(n, 1), np.nan)


def item_weights(n_items: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(items, n_boot): each replicate's item resample as weights (how often each item was drawn / items), so a
    run's mean over the resampled items is its per-item values times these."""
    return rng.multinomial(n_items, np.full(n_items, 1 / n_items), size=n_boot).T / n_items


def _seed_means(per_seed: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, rows) means over a seed resample drawn per replicate, shared by the rows. per_seed: (rows, seeds)
    fixed values, or (rows, seeds, n_boot) values that differ per replicate (scored over its resampled items)."""
    pick = rng.integers(0, per_seed.shape[1], size=(n_boot, per_seed.shape[1]))
    if per_seed.ndim == 2:
        return per_seed[:, pick].mean(axis=2).T
    return per_seed[:, pick, np.arange(n_boot)[:, None]].mean(axis=2).T


def _resampled_means(
    scale: Scale, n_boot: int, rng: np.random.Generator, weights: np.ndarray | None
) -> tuple[np.ndarray, bool]:
    """(n_boot, variants) means of the resampled runs of a scale, and whether the variants were resampled together.
    weights: the replicates' item resample (item_weights), for a scale with per-item values."""
    seed_lists = [sorted(s) for s in scale.scores]
    paired = all(seeds == seed_lists[0] for seeds in seed_lists)
    groups = [list(range(len(seed_lists)))] if paired else [[k] for k in range(len(seed_lists))]
    columns = []
    for group in groups:  # unpaired: seed k means different runs for different variants, no pairing to keep
        seeds = seed_lists[group[0]]
        if scale.items is not None:
            values = np.array([[scale.items[k][s] for s in seeds] for k in group], float)  # (variants, seeds, items)
            per_seed = values @ weights  # each run's mean over each replicate's items
        else:
            per_seed = np.array([[scale.scores[k][s] for s in seeds] for k in group], float)
        columns.append(_seed_means(per_seed, n_boot, rng))
    means = np.concatenate(columns, axis=1)
    if scale.items is None and scale.item_source is not None:  # the item set's share, persistent, per variant
        means = means + rng.normal(0, 1, means.shape) * np.sqrt(np.asarray(scale.item_var, float))
    return means, paired


@dataclass(frozen=True)
class DAInterval:
    """A DA interval as the report shows it: ci (None: not shown or not computed), whether the bootstrap paired the
    seeds, the weaker scale's ITEM_SOURCES entry (None where a scale has neither: the interval then leaves the item
    set's share out), the measured coverage at the seeds, and why the interval is not shown."""

    ci: list[float] | None = None
    paired: bool | None = None
    item_noise: str | None = None
    coverage: float | None = None
    ci_note: str | None = None


def interval(small: Scale, large: Scale, n_boot: int, seed: int, level: float = 0.95) -> DAInterval:
    """Percentile interval of the DA of the smaller scale's metric (small) against the target at the largest
    (large), over resamples of seeds and items."""
    item_noise = _item_noise(small, large)
    if n_boot < 1 or len(large.scores) < 2:
        return DAInterval(paired=True, item_noise=item_noise)
    rng = np.random.default_rng(seed)
    n_items = max(len(s.ids) if s.items is not None else 1 for s in (small, large))
    chunk = max(1, 4_000_000 // n_items)  # replicates at a time: bounds the item weights to a few tens of MB
    values = []
    for done in range(0, n_boot, chunk):
        size = min(chunk, n_boot - done)
        weights = [item_weights(len(s.ids), size, rng) if s.items is not None else None for s in (small, large)]
        if small.items is not None and small.ids == large.ids:
            weights[1] = weights[0]  # the same items at both scales: one resample of them
        small_means, small_paired = _resampled_means(small, size, rng, weights[0])
        large_means, large_paired = _resampled_means(large, size, rng, weights[1])
        values.append(decision_accuracy(small_means, large_means))
    da = np.concatenate(values)
    da = da[np.isfinite(da)]
    tail = (1 - level) / 2 * 100
    ci = [float(x) for x in np.percentile(da, [tail, 100 - tail])] if da.size else None
    return DAInterval(ci=ci, paired=small_paired and large_paired, item_noise=item_noise)


def coverage_for(seeds: int) -> tuple[float | None, int | None]:
    """Measured coverage at a seed count: the table's figure at the largest tabulated count <= seeds (more seeds
    only shrink the sampling noise), with that count; (None, None) below the table."""
    counts = [n for n in COVERAGE if n <= seeds]
    return (COVERAGE[max(counts)], max(counts)) if counts else (None, None)


def shown_interval(small: Scale, large: Scale, seeds: int, n_boot: int, seed: int) -> DAInterval:
    """The interval where its measured coverage at `seeds` is >= MIN_COVERAGE and the item set's share is known;
    otherwise no interval and a note saying why."""
    cover, at = coverage_for(seeds)
    noise = _item_noise(small, large)
    if cover is None:
        note = f"interval not shown: coverage was not measured below {min(COVERAGE)} seeds (have {seeds})"
    elif cover < MIN_COVERAGE:
        note = (
            f"interval not shown: a 95% bootstrap covered the true DA in {cover:.0%} of constructed ladders at "
            f"{at} seeds (< {MIN_COVERAGE:.0%})"
        )
    elif noise is None:
        note = (
            "interval not shown: no per-item files or logged standard errors, so the item set's share of the "
            "uncertainty (the same items on every seed) is unknown"
        )
    else:
        return dataclasses.replace(interval(small, large, n_boot, seed), coverage=cover)
    return DAInterval(paired=_all_paired(small, large), item_noise=noise, coverage=cover, ci_note=note)


def _item_noise(small: Scale, large: Scale) -> str | None:
    """How the item set's share entered: the weaker of the two scales' sources, None where a scale has neither."""
    sources = [small.item_source, large.item_source]
    return None if None in sources else max(sources, key=ITEM_SOURCES.index)


def _all_paired(*scales: Scale) -> bool:
    return all(all(sorted(s) == sorted(sc.scores[0]) for s in sc.scores) for sc in scales if sc.scores)


# ---- coverage on constructed ladders --------------------------------------------------------------------------


def _ladder_scale(rng, means, seed_sd: float, n_seeds: int, d: dict, item_set_sd: float) -> Scale:
    """One scale of a constructed ladder, per-item values of each run: the variant's true mean, seed k's shared
    effect, the variant's persistent item quirks and fresh per-item noise (seed_sd on a run's mean)."""
    n_items, root = d["items"], np.sqrt(d["items"])
    shared = rng.normal(0, d["shared_seed_sd"], n_seeds)
    quirks = rng.normal(0, item_set_sd * root, (len(means), 1, n_items))
    values = (
        np.asarray(means, float)[:, None, None]
        + shared[None, :, None]
        + quirks
        + rng.normal(0, seed_sd * root, (len(means), n_seeds, n_items))
    )
    items = [dict(enumerate(v)) for v in values]
    return Scale([{k: float(x.mean()) for k, x in v.items()} for v in items], items, [str(i) for i in range(n_items)])


def da_coverage(
    n_seeds: int,
    small_seed_sd: float,
    item_set_sd: float,
    n_ladders: int,
    n_boot: int,
    seed: int = 0,
    design: dict | None = None,
) -> float:
    """Share of constructed ladders (COVERAGE_DESIGN, or `design`) whose 95% interval contains the true DA."""
    d = design or COVERAGE_DESIGN
    truth = float(decision_accuracy(np.array(d["small_means"]), np.array(d["large_means"])))
    rng = np.random.default_rng(seed)
    hits = 0
    for k in range(n_ladders):
        small = _ladder_scale(rng, d["small_means"], small_seed_sd, n_seeds, d, item_set_sd)
        large = _ladder_scale(rng, d["large_means"], d["large_seed_sd"], n_seeds, d, item_set_sd)
        ci = interval(small, large, n_boot, seed * 1_000_003 + k).ci
        hits += ci is not None and ci[0] - 1e-9 <= truth <= ci[1] + 1e-9
    return hits / n_ladders


def coverage_table(seed_counts, n_ladders: int, n_boot: int, seed: int = 0) -> dict[int, dict]:
    """{seeds: {item set sd: coverage at each of COVERAGE_DESIGN's smaller-scale seed sds}}: COVERAGE_BY_NOISE."""
    sds, item_sds = COVERAGE_DESIGN["small_seed_sds"], COVERAGE_DESIGN["item_set_sds"]
    return {
        n: {i: tuple(round(da_coverage(n, sd, i, n_ladders, n_boot, seed), 3) for sd in sds) for i in item_sds}
        for n in seed_counts
    }


if __name__ == "__main__":  # recompute the table: python -m ablate.report.stats.da [ladders] [replicates]
    import sys
    import time

    start = time.perf_counter()
    ladders, replicates = (int(x) for x in (sys.argv[1:] or ["10000", "2000"]))
    table = coverage_table((2, 3, 4, 5, 6, 8, 10), n_ladders=ladders, n_boot=replicates)
    print(f"COVERAGE_BY_NOISE = {{  # {ladders} ladders per cell, {replicates} replicates each")
    for n, row in table.items():
        print(f"    {n}: {row},")
    print(f"}}  # {time.perf_counter() - start:.0f} s")
