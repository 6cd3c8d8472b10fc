"""Decision accuracy (DataDecide, Magnusson et al. 2025) with a seed-bootstrap interval that keeps the design, and
the measured coverage that decides whether the interval is shown.

Decision accuracy: the share of variant pairs a smaller scale's metric orders as the target orders them at the
largest scale (oriented scores: larger is better on each side; a pair tied at the smaller scale counts one half,
pairs tied in the target are left out).

Interval: seed k of every variant at one scale shares data order and init, so a replicate resamples seed indices
once for all variants of a scale (paired), independently per scale (different scales are different runs). Where
the variants of a scale ran different seed lists, each variant's seeds are resampled apart (paired False).

Coverage: the interval is a percentile bootstrap of a discrete statistic from a few seeds; whether its 95% holds
was measured on constructed ladders with a known DA (COVERAGE_DESIGN, da_coverage) and is tabulated by seed count
in COVERAGE, recomputed by `python -m ablate.report.da` and checked by tests/test_report_da.py. The report shows
an interval only where the tabulated coverage at its seed count is >= MIN_COVERAGE.
"""

from __future__ import annotations

import numpy as np

from ablate.report.stats import pair_signs

MIN_COVERAGE = 0.90  # the least measured coverage of a nominal 95% interval for it to be shown
# The constructed ladder: 4 variants; at the largest scale true oriented means 0, 1, 2, 3 (seed sd 0.5 of the gap:
# a target the largest scale resolves); at the smaller scale the first two swapped (true DA 5/6), seed sd from
# half the gap between neighbours to 4 gaps; a seed effect shared by a scale's variants (sd 3 gaps) on both.
COVERAGE_DESIGN = {
    "large_means": (0.0, 1.0, 2.0, 3.0),
    "small_means": (1.0, 0.0, 2.0, 3.0),
    "large_seed_sd": 0.5,
    "small_seed_sds": (0.5, 1.0, 2.0, 4.0),
    "shared_seed_sd": 3.0,
}
# Measured coverage of the 95% paired interval: {seeds: coverage at each of small_seed_sds}; `python -m
# ablate.report.da` (10000 ladders per cell, 2000 replicates each, RNG seed 0) prints this table.
COVERAGE_BY_NOISE = {
    2: (0.975, 0.888, 0.731, 0.582),
    3: (0.999, 0.977, 0.889, 0.763),
    4: (1.0, 0.991, 0.936, 0.838),
    5: (1.0, 0.996, 0.964, 0.882),
    6: (1.0, 0.999, 0.978, 0.91),
    8: (1.0, 1.0, 0.99, 0.943),
    10: (1.0, 1.0, 0.995, 0.958),
}  # 206 s on one core
# The figure the report uses: the lowest over the noise levels tried (the interval must hold at each).
COVERAGE = {n: min(c) for n, c in COVERAGE_BY_NOISE.items()}


def decision_accuracy(guess: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """DA of oriented means `guess` against `truth` along the last axis (any leading axes): NaN where every pair
    of the truth is tied."""
    g, t = pair_signs(np.asarray(guess, float)), pair_signs(np.asarray(truth, float))
    counted = t != 0
    score = np.where(g == 0, 0.5, (g == t).astype(float)) * counted
    n = counted.sum(axis=-1)
    return np.where(n > 0, score.sum(axis=-1) / np.maximum(n, 1), np.nan)


def _resampled_means(scores: list[dict], n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """(n_boot, variants) means of seed-resampled run scores, and whether the variants were resampled together.
    scores[k]: variant k's {seed: oriented run score} at one scale."""
    seed_lists = [sorted(s) for s in scores]
    if all(seeds == seed_lists[0] for seeds in seed_lists):
        values = np.array([[s[k] for k in seed_lists[0]] for s in scores], float)  # (variants, seeds)
        pick = rng.integers(0, values.shape[1], size=(n_boot, values.shape[1]))
        return values[:, pick].mean(axis=2).T, True
    columns = []
    for s in scores:  # seed k means different runs for different variants here: no pairing to keep
        values = np.array([s[k] for k in sorted(s)], float)
        columns.append(values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1))
    return np.stack(columns, axis=1), False


def interval(small: list[dict], large: list[dict], n_boot: int, seed: int, level: float = 0.95) -> dict:
    """Percentile interval of the DA of the smaller scale's metric (small) against the target at the largest
    (large), over seed resamples. small[k], large[k]: variant k's {seed: oriented run score} at each scale."""
    out = {"ci": None, "paired": True}
    if n_boot < 1 or len(large) < 2:
        return out
    rng = np.random.default_rng(seed)
    small_means, small_paired = _resampled_means(small, n_boot, rng)
    large_means, large_paired = _resampled_means(large, n_boot, rng)
    out["paired"] = small_paired and large_paired
    da = decision_accuracy(small_means, large_means)
    da = da[np.isfinite(da)]
    if da.size:
        tail = (1 - level) / 2 * 100
        out["ci"] = [float(x) for x in np.percentile(da, [tail, 100 - tail])]
    return out


def coverage_for(seeds: int) -> tuple[float | None, int | None]:
    """Measured coverage at a seed count: the table's figure at the largest tabulated count <= seeds (more seeds
    only shrink the sampling noise), with that count; (None, None) below the table."""
    counts = [n for n in COVERAGE if n <= seeds]
    return (COVERAGE[max(counts)], max(counts)) if counts else (None, None)


def shown_interval(small: list[dict], large: list[dict], seeds: int, n_boot: int, seed: int) -> dict:
    """The interval where its measured coverage at `seeds` is >= MIN_COVERAGE; otherwise None and a note saying
    why. {ci, ci_note, paired, coverage}."""
    cover, at = coverage_for(seeds)
    if cover is None:
        note = f"interval not shown: coverage was not measured below {min(COVERAGE)} seeds (have {seeds})"
        return {"ci": None, "ci_note": note, "paired": _all_paired(small, large), "coverage": None}
    if cover < MIN_COVERAGE:
        note = (
            f"interval not shown: a 95% seed bootstrap covered the true DA in {cover:.0%} of constructed ladders at "
            f"{at} seeds (< {MIN_COVERAGE:.0%})"
        )
        return {"ci": None, "ci_note": note, "paired": _all_paired(small, large), "coverage": cover}
    return {**interval(small, large, n_boot, seed), "ci_note": None, "coverage": cover}


def _all_paired(*scales: list[dict]) -> bool:
    return all(all(sorted(s) == sorted(scores[0]) for s in scores) for scores in scales if scores)


# ---- coverage on constructed ladders --------------------------------------------------------------------------


def _ladder_scale(rng, means, seed_sd: float, n_seeds: int, shared_sd: float) -> list[dict]:
    """One scale of a constructed ladder: each variant's {seed: score}, seed k's shared effect in every variant."""
    shared = rng.normal(0, shared_sd, n_seeds)
    scores = np.asarray(means, float)[:, None] + shared[None, :] + rng.normal(0, seed_sd, (len(means), n_seeds))
    return [dict(enumerate(row)) for row in scores.tolist()]


def da_coverage(
    n_seeds: int, small_seed_sd: float, n_ladders: int, n_boot: int, seed: int = 0, design: dict | None = None
) -> float:
    """Share of constructed ladders (COVERAGE_DESIGN, or `design`) whose 95% interval contains the true DA."""
    d = design or COVERAGE_DESIGN
    truth = float(decision_accuracy(np.array(d["small_means"]), np.array(d["large_means"])))
    rng = np.random.default_rng(seed)
    hits = 0
    for k in range(n_ladders):
        small = _ladder_scale(rng, d["small_means"], small_seed_sd, n_seeds, d["shared_seed_sd"])
        large = _ladder_scale(rng, d["large_means"], d["large_seed_sd"], n_seeds, d["shared_seed_sd"])
        ci = interval(small, large, n_boot, seed * 1_000_003 + k)["ci"]
        hits += ci is not None and ci[0] - 1e-9 <= truth <= ci[1] + 1e-9
    return hits / n_ladders


def coverage_table(seed_counts, n_ladders: int, n_boot: int, seed: int = 0) -> dict[int, tuple[float, ...]]:
    """{seeds: coverage at each of COVERAGE_DESIGN's smaller-scale seed sds}: what COVERAGE_BY_NOISE holds."""
    sds = COVERAGE_DESIGN["small_seed_sds"]
    return {n: tuple(round(da_coverage(n, sd, n_ladders, n_boot, seed), 3) for sd in sds) for n in seed_counts}


if __name__ == "__main__":  # recompute the table: python -m ablate.report.da
    import time

    start = time.perf_counter()
    table = coverage_table((2, 3, 4, 5, 6, 8, 10), n_ladders=10000, n_boot=2000)
    print("COVERAGE_BY_NOISE = {")
    for n, row in table.items():
        print(f"    {n}: {row},")
    print(f"}}  # {time.perf_counter() - start:.0f} s")
