"""One pair of variants tested at the level of replication, the training seed, and a series' leader read from its
pairs.

- A pair is tested over run-level scores (a paired t over the per-seed differences of the seeds both variants ran,
  Welch over the two samples when they share fewer than 2) under one noise model (noise.seed_test): the seed
  variance divided by the seeds plus the persistent item-set variance, not divided by them, on Satterthwaite's
  degrees of freedom; a difference repeated exactly by every seed is evidence only as far as the items it rests on
  are. Its interval (`ci`) is the test's own: the same variance and df at the level 1 - alpha, so it excludes 0
  exactly when the unadjusted p < alpha. (A percentile bootstrap over 3 seed pairs cannot be wider than the 3 values
  allow, about 1.7 se where the t on 2 df needs 4.3: it is not shown beside the test.) The item-level p is shown as
  evaluation noise only.
- Fewer than `min_seeds` seeds per variant, or compared points more than `max_token_gap` apart in tokens, or a
  token count missing (match.token_gap): not tested, and the report says why.

`compare` and `pairwise` are what the report runs; the calibration (report/calibrate.py) runs the same functions
on simulated studies.
"""

from __future__ import annotations

import numpy as np

from ablate.report.stats import noise
from ablate.report.inputs import match
from ablate.report.inputs.runs import sign_of
from ablate.report.schema import Final, Pairwise, Series


def best(s: Series) -> str | None:
    """A series' leader (leader() of its direction, finals and pairs)."""
    return leader(s.direction, s.final, s.pairwise)


def leader(direction: str, final: dict[str, Final], rows: list[Pairwise]) -> str | None:
    """The leader of a series, from the paired estimates on shared seeds (each pairwise row's `better`), never from the
    variants' own means: with unequal seed sets (an adaptive study stops giving seeds to decided variants) a mean
    over other seeds can put first a variant that every paired comparison puts behind. The variant ahead of every
    other; where the estimates cycle, the one ahead of most; in both cases among the variants no significant pair
    puts behind (once the families are applied), the means breaking what is left. None when several stay tied."""
    sign = sign_of(direction)
    variants = list(final)
    behind = {p.b if p.better == p.a else p.a for p in rows if p.significant and p.better}
    candidates = [v for v in variants if v not in behind] or variants
    wins = {v: sum(p.better == v for p in rows) for v in candidates}
    leaders = [v for v in candidates if wins[v] == max(wins.values())]
    top = max(sign * final[v].mean for v in leaders)
    leaders = [v for v in leaders if sign * final[v].mean == top]
    return leaders[0] if len(leaders) == 1 else None


def _rows(matrix: np.ndarray | None, seeds: dict, keep: list[int]) -> np.ndarray | None:
    """The rows of a (seeds, items) matrix (rows in sorted seed order) for the seeds `keep`."""
    return None if matrix is None else matrix[[sorted(seeds).index(s) for s in keep]]


def compare(
    a: dict[int, float],
    b: dict[int, float],
    sign: int,
    opts,
    items_a: np.ndarray | None = None,
    items_b: np.ndarray | None = None,
    stderr_a: dict | None = None,
    stderr_b: dict | None = None,
    tokens: tuple[list, list] | None = None,
    names: tuple[str, str] = ("a", "b"),
) -> Pairwise:
    """One pair, named `names`: a and b map seed -> run-level score; items_a/items_b are (seeds, items) matrices,
    rows in sorted seed order, columns the same items (None without per-item files); stderr_*: seed -> logged
    standard error; tokens: the two variants' compared token counts (run order irrelevant). Untested by the
    families yet: no adjusted p, no seeds needed."""
    with_items = items_a is not None and items_b is not None and items_a.shape[1] == items_b.shape[1]
    ia, ib = (items_a, items_b) if with_items else (None, None)
    t = noise.seed_test(a, b, ia, ib, stderr_a, stderr_b, level=1 - opts.alpha)
    shared = sorted(set(a) & set(b))
    n_tested = t.n_shared if t.paired else min(t.n_a, t.n_b)
    gap, refused = match.token_gap(tokens[0] + tokens[1], opts.max_token_gap) if tokens else (None, None)
    testable = n_tested >= opts.min_seeds and t.p is not None and not refused
    untested, why = _why_untested(t, n_tested, refused, opts.min_seeds)
    p_items, n_items = _item_level(a, b, shared, t.paired, ia, ib)
    return Pairwise(
        a=names[0],
        b=names[1],
        diff=t.diff,
        better=names[0] if sign * t.diff > 0 else names[1] if sign * t.diff < 0 else None,
        test=t.test,
        paired=t.paired,
        p_seeds=t.p,
        n_seeds=t.n_shared if t.paired else None,
        n_seeds_a=t.n_a,
        n_seeds_b=t.n_b,
        sd_diff=t.sd_diff,
        sd_seeds=t.sd_seeds,
        noise_floor_sd=t.noise_floor_sd,
        item_sd=t.item_sd,
        item_df=t.item_df,
        noise_source=t.noise_source,
        noise_assumption=noise.STDERR_ASSUMPTION if t.noise_source == "logged standard errors" else None,
        df=t.df,
        seeds_agree=_seeds_agree(a, b, shared, t),
        testable=testable,
        token_gap=gap,
        untested=untested,  # why a pair was not tested: "tokens", "seeds" or "no_spread"
        seeds_needed=None,
        seeds_needed_range=None,
        more_items=None,  # the item set alone hides a difference this size: more items, not more seeds
        ci=t.ci if testable else None,  # the test's interval, unadjusted, at 1 - alpha
        p_items=p_items,
        n_items=n_items,
        family=None,
        p_bh=None,
        significant=None,
        note="; ".join(filter(None, [why, _partly_paired(a, b, shared, t.paired)])),
    )


def _why_untested(t: noise.SeedTest, n_tested: int, refused: str | None, min_seeds: int) -> tuple[str | None, str]:
    """(why a pair was not tested: "tokens", "seeds", "no_spread" or None, the note saying so)."""
    if refused:
        return "tokens", f"not tested: {refused}"
    if n_tested < min_seeds:
        what = f"{n_tested} seeds both ran" if t.paired else f"{n_tested} seeds on the smaller side"
        return "seeds", f"not tested: {what}, fewer than {min_seeds}"
    if t.p is None:
        return "no_spread", "not tested: no seed spread and no item noise known to bound it"
    return None, ""


def _partly_paired(a: dict, b: dict, shared: list[int], paired: bool) -> str:
    """The note of a paired test over fewer seeds than one side ran ("" otherwise)."""
    if paired and (len(shared) < len(a) or len(shared) < len(b)):
        return f"paired over the {len(shared)} seeds both ran ({len(a)} vs {len(b)})"
    return ""


def _seeds_agree(a: dict, b: dict, shared: list[int], t: noise.SeedTest) -> int | None:
    """How many shared seeds' differences have the sign of the paired mean difference (None unpaired or at 0)."""
    if not t.paired or t.diff == 0:
        return None
    per_seed = np.array([a[s] - b[s] for s in shared])
    return int(np.sum(np.sign(per_seed) == np.sign(t.diff)))


def _item_level(a: dict, b: dict, shared: list[int], paired: bool, items_a, items_b) -> tuple[float | None, int | None]:
    """(the item-level p, the items it is over) where both sides have per-item values on the same items: evaluation
    noise only, over the shared seeds' rows when the test is paired."""
    if items_a is None:
        return None, None
    pa, pb = (_rows(items_a, a, shared), _rows(items_b, b, shared)) if paired else (items_a, items_b)
    return noise.item_pvalue(pa, pb), int(items_a.shape[1])


def pairwise(
    variants: list[str],
    scores: dict[str, dict[int, float]],
    items: dict[str, np.ndarray] | None,
    sign: int,
    opts,
    stderrs: dict[str, dict] | None = None,
    final: dict | None = None,
) -> list[Pairwise]:
    """Every pair (a before b in `variants` order), each `compare`d under its names. final: the series'
    final scores (their compared token counts refuse pairs too far apart)."""
    rows = []
    for i, a in enumerate(variants):
        for b in variants[i + 1 :]:
            compared = compare(
                scores[a],
                scores[b],
                sign,
                opts,
                items[a] if items else None,
                items[b] if items else None,
                stderrs.get(a) if stderrs else None,
                stderrs.get(b) if stderrs else None,
                (final[a].tokens, final[b].tokens) if final else None,
                names=(a, b),
            )
            rows.append(compared)
    return rows
