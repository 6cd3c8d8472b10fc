"""The report's decisions calibrated on itself: A/A studies (every variant drawn from one distribution) must yield a
significant claim in at most alpha = 5% of studies, and a planted effect must be found (power).

A study is variants x seeds x items, on two decision metrics: a validation-loss-like score (continuous, lower is
better) and a task accuracy (0/1 per item, higher is better). Each run's value on an item is
    item difficulty (shared by every run) + seed effect (shared by the variants' runs with that seed: data order)
    + run effect (this run's own) + item noise (this run on this item) [+ the planted effect]
so run-level scores vary from seed to seed and items add evaluation noise, as in real ablations.

Most studies run in memory through the functions `ablate report` itself uses (pairs.pairwise -> seed-level tests,
families.apply_family -> Benjamini-Hochberg, headline.decide_series and families.winner -> the headline's decisions);
the designs users run (3 and 5 seeds, 60 and 1000 items, quantized accuracies, per-run item quirks that persist over
checkpoints, a scale axis, a subject floor: ablate.report.calibrate, as scripts/calibrate_report.py) go
through analyze_runs, the report's whole path after loading; a handful go through write_report on run folders.
`pytest -s` prints the measured rates.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ablate.report import Options, write_report
from ablate.report import calibrate
from ablate.report.sections.decisions import families, pairs
from ablate.report.stats import power
from ablate.report.sections.decisions.headline import decide_series
from ablate.report.schema import Series
from report_fixtures import record_with, simulated_final, write_run

SIG_RUN, SIG_SEED, SIG_ITEM, ITEMS = 0.02, 0.01, 0.3, 200  # loss: run, seed and item-noise sds; items per eval
# sd of one seed-level difference of run scores (paired: the shared seed effect cancels): the effect-size unit
SD_DIFF = math.sqrt(2 * (SIG_RUN**2 + SIG_ITEM**2 / ITEMS))
ALPHA = 0.05
OPTS = Options(bootstrap=0)  # p-values and decisions only: the CI bootstrap is not part of the decision


def mc_margin(p: float, n: int) -> float:
    """One-sided 99% Monte-Carlo margin of a rate p measured over n studies (2.33 binomial sds)."""
    return 2.33 * math.sqrt(p * (1 - p) / n)


def simulate(
    rng, variants, n_seeds: int, effect: float = 0.0, planted: str | None = None, paired: bool = True, quirk=None
):
    """{metric: (sign, {variant: (seeds, (seeds, items) matrix)})}; effect in SD_DIFF units on the loss (and the
    same number of accuracy points x 2 on the task), for `planted`. quirk: (loss sd, logit sd) of each variant's
    persistent item quirks (the same on every seed; zero mean over the population of items: a population null)."""
    seeds = {
        v: list(range(n_seeds)) if paired else list(range(k * n_seeds, (k + 1) * n_seeds))
        for k, v in enumerate(variants)
    }
    seed_fx = rng.normal(0, SIG_SEED, n_seeds * len(variants))
    difficulty = rng.normal(0, 1, ITEMS)
    p_item = 1 / (1 + np.exp(-rng.normal(0.3, 1.5, ITEMS)))
    loss, acc = {}, {}
    for v in variants:
        shift = effect if v == planted else 0.0
        loss_quirk, logit_quirk = (rng.normal(0, sd, ITEMS) for sd in quirk or (0.0, 0.0))
        p_v = 1 / (1 + (1 / p_item - 1) * np.exp(-logit_quirk))  # p_item moved by the quirk on the logit scale
        loss[v] = (
            np.array(
                [
                    3 + difficulty + loss_quirk + seed_fx[s] + rng.normal(0, SIG_RUN) + rng.normal(0, SIG_ITEM, ITEMS)
                    for s in seeds[v]
                ]
            )
            - shift * SD_DIFF
        )
        acc[v] = np.array(
            [
                (rng.random(ITEMS) < np.clip(p_v + seed_fx[s] + rng.normal(0, SIG_RUN) + 0.02 * shift, 0, 1)).astype(
                    float
                )
                for s in seeds[v]
            ]
        )
    return {
        "loss": (-1, {v: (seeds[v], loss[v]) for v in variants}),
        "acc": (1, {v: (seeds[v], acc[v]) for v in variants}),
    }


def decide_study(study: dict, opts=OPTS):
    """The report's decision procedure on in-memory scores: (winner, series, decisions)."""
    series = []
    for metric, (sign, data) in study.items():
        variants = list(data)
        scores = {v: dict(zip(seeds, matrix.mean(axis=1))) for v, (seeds, matrix) in data.items()}
        final = {v: simulated_final(scores[v]) for v in variants}
        series.append(
            record_with(
                Series,
                task="val_loss" if metric == "loss" else metric,  # the loss is the primary family, as in a report
                metric=metric,
                primary=True,
                direction="higher" if sign > 0 else "lower",
                final=final,
                best=None,  # decide_series finds the leader from the pairwise rows (pairs.best)
                pairwise=pairs.pairwise(variants, scores, {v: data[v][1] for v in variants}, sign, opts),
            )
        )
    _, series = families.apply_family(series, opts, "in a simulated study")
    decisions = [d for s in series if (d := decide_series(s, opts))]
    return families.winner(decisions), series, decisions


def claims(series) -> bool:
    """Whether the study claims any difference (any significant pair): what an A/A study must not do."""
    return any(p.significant for s in series for p in s.pairwise)


@pytest.mark.slow  # simulates at length: the whole suite runs it, not the quick tier
@pytest.mark.parametrize("paired", [True, False], ids=["paired-seeds", "welch-different-seeds"])
def test_aa_false_positive_rate(paired):
    """3 variants x 5 seeds x 2 metrics: a family of 6 seed-level tests per study."""
    n = 400 if paired else 200
    rng = np.random.default_rng(10 if paired else 11)
    claimed = winners = item_level = tests = 0
    for _ in range(n):
        winner, series, _ = decide_study(simulate(rng, ["A", "B", "C"], 5, paired=paired))
        claimed += claims(series)
        winners += winner is not None
        rows = [p for s in series for p in s.pairwise]
        item_level += sum(p.p_items < ALPHA for p in rows)
        tests += len(rows)
    fpr, margin = claimed / n, mc_margin(ALPHA, n)
    print(
        f"\nA/A ({'paired t' if paired else 'Welch t'}, {n} studies, 3 variants x 5 seeds x 2 metrics = 6 tests, "
        f"BH at {ALPHA}): any significant claim {fpr:.3f} (must be <= {ALPHA} + MC margin {margin:.3f}); "
        f"a winner named {winners / n:.3f}; the item-level test alone: {item_level / tests:.3f} of tests "
        f"'significant'"
    )
    assert fpr <= ALPHA + margin
    assert winners / n <= ALPHA
    assert item_level / tests > 2 * ALPHA  # why items alone never decide: seed noise passes as a difference


@pytest.mark.slow  # simulates at length: the whole suite runs it, not the quick tier
@pytest.mark.parametrize("seeds", [3, 5, 8])
def test_aa_with_persistent_item_quirks(seeds):
    """A/A under a population null: each variant answers some items better and others worse on every seed (loss
    quirk sd 0.1 nats, accuracy quirk sd 1.5 logits, zero mean over items), so each pair's difference carries a
    persistent item part that no seed count averages away. 3 variants x 2 metrics, 200 studies per design: the
    any-claim rate stays <= alpha + 2 standard errors (0.081). A test that divides the item part by the seeds
    rejected more often the more seeds it had."""
    n = 200
    rng = np.random.default_rng(50 + seeds)
    claimed = sum(claims(decide_study(simulate(rng, ["A", "B", "C"], seeds, quirk=(0.1, 1.5)))[1]) for _ in range(n))
    print(f"\nA/A with persistent item quirks, {seeds} seeds, {n} studies: any claim {claimed / n:.3f}")
    assert claimed / n <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / n)


@pytest.mark.slow  # simulates at length: the whole suite runs it, not the quick tier
@pytest.mark.parametrize("variants,effect,floor", [(2, 3.0, 0.85), (3, 3.0, 0.8), (2, 2.0, 0.6)])
def test_planted_effect_power(variants, effect, floor):
    """Power: the share of studies whose headline names the planted variant as the winner (significantly best on
    val loss, behind on nothing), at 5 seeds, effect = `effect` x SD_DIFF on the loss (Cohen's d_z)."""
    n = 200
    rng = np.random.default_rng(20 + variants + int(effect))
    names = ["A", "B", "C"][:variants]
    found = wrong = 0
    for _ in range(n):
        winner, _, _ = decide_study(simulate(rng, names, 5, effect=effect, planted="A"))
        found += winner == "A"
        wrong += winner not in (None, "A")
    print(
        f"\nplanted ({n} studies, {variants} variants x 5 seeds x 2 metrics, effect {effect:g} sd of the seed-level "
        f"difference = {effect * SD_DIFF:.3f} loss): power {found / n:.3f} (floor {floor}); wrong winner "
        f"{wrong / n:.3f}"
    )
    assert found / n >= floor and wrong == 0


def test_two_seeds_never_decide_and_say_how_many_are_needed():
    rng = np.random.default_rng(30)
    for _ in range(50):
        winner, series, decisions = decide_study(simulate(rng, ["A", "B"], 2, effect=6.0, planted="A"))
        assert winner is None and not claims(series)
        loss = decisions[0]
        assert loss.status == "too_few_seeds" and loss.seeds_needed >= 3
        assert "not established with 2 seeds (~" in loss.text


@pytest.mark.slow  # simulates at length: the whole suite runs it, not the quick tier
def test_seeds_needed_delivers_the_power_it_promises():
    """Plan with the true seed-level sd, then run studies with that many seeds: the measured power is the promised
    80%. The normal approximation alone (n = ((z_0.975 + z_0.8) / d)^2 = 4 seeds for d = 1.5) measured 0.53 here:
    with few seeds the t-test needs more, so the report raises n until the noncentral-t power reaches 80%."""
    effect = 1.5  # in SD_DIFF units
    need = power.seeds_needed(effect * SD_DIFF, SD_DIFF, ALPHA, 0.8)
    assert math.ceil(((1.959964 + 0.841621) / effect) ** 2) == 4 and need == 6
    rng = np.random.default_rng(40)
    n, found = 300, 0
    for _ in range(n):
        study = simulate(rng, ["A", "B"], need, effect=effect, planted="A")
        _, series, _ = decide_study({"loss": study["loss"]})  # one test: no multiplicity
        found += bool(series[0].pairwise[0].significant)
    print(
        f"\nseeds needed for d_z={effect}: {need}; measured power with {need} seeds over {n} studies: "
        f"{found / n:.3f} (promised 0.8, MC margin {mc_margin(0.8, n):.3f})"
    )
    # at least the promised power, and not grossly more (n is rounded up: the t-test's power at 6 seeds is 0.83)
    assert 0.8 - mc_margin(0.8, n) <= found / n <= 0.95


# ---- full reports on run folders ---------------------------------------------------------------------------

STEPS = [10, 20, 30, 40]
VARIANTS = ["d128", "d32", "d64"]  # written in text order: the report must sort them d32, d64, d128


def build_study(root, rng, effect: float, n_seeds: int = 4):
    """Run folders of one study: val loss falls and the task accuracy rises over 4 checkpoints; d128 carries the
    planted effect (in SD_DIFF units) at every checkpoint."""
    difficulty = rng.normal(0, 1, ITEMS)
    p_item = 1 / (1 + np.exp(-rng.normal(0, 1.0, ITEMS)))
    seed_fx = rng.normal(0, SIG_SEED, n_seeds)
    for v in VARIANTS:
        shift = effect if v == "d128" else 0.0
        for s in range(n_seeds):
            run_fx = rng.normal(0, SIG_RUN)
            val_items, task_items = {}, {}
            for k, step in enumerate(STEPS):
                base = 4.0 - 0.25 * k + difficulty + seed_fx[s] + run_fx - shift * SD_DIFF
                val_items[step] = (base + rng.normal(0, SIG_ITEM, ITEMS)).tolist()
                p = np.clip(0.1 * k + p_item * 0.5 + 0.1 + seed_fx[s] + run_fx + 0.02 * shift, 0, 1)
                right = rng.random(ITEMS) < p
                task_items[step] = [{"id": f"q{i}", "gold": 0, "acc_per_char": float(right[i])} for i in range(ITEMS)]
            write_run(
                root,
                v,
                s,
                STEPS,
                None,
                {"sim": {"chance": 0.25, "primary": "acc_per_char", "items": task_items}},
                val_items=val_items,
            )
    return root


@pytest.mark.parametrize("study", range(3))
def test_full_report_aa_names_no_winner(tmp_path, study):
    report = write_report(
        build_study(tmp_path / f"aa{study}", np.random.default_rng(100 + study), 0.0), opts=Options(bootstrap=200)
    )
    head = report["headline"]
    assert report["groups"][0]["variants"] == ["d32", "d64", "d128"]
    assert head["winner"] is None and "Winner:" not in head["text"], head["text"]
    assert not any(d["status"] == "best" for d in head["decisions"])
    assert report["inference"]["tests"] == 3 * len(report["inference"]["family_metrics"])
    print(f"\nA/A report {study}: {head['text']}")


@pytest.mark.parametrize("study", range(3))
def test_full_report_planted_names_the_winner(tmp_path, study):
    report = write_report(
        build_study(tmp_path / f"planted{study}", np.random.default_rng(200 + study), 4.0), opts=Options(bootstrap=200)
    )
    head = report["headline"]
    assert head["winner"] == "d128", head["text"]
    assert "val_loss: d128 best, ahead of d32, d64 (p_BH<=" in head["text"] and "4 seeds" in head["text"]
    val = next(s for s in report["groups"][0]["series"] if s["task"] == "val_loss")
    pair = next(p for p in val["pairwise"] if {p["a"], p["b"]} == {"d32", "d128"})
    assert pair["paired"] and pair["significant"] and pair["p_bh"] >= pair["p_seeds"]
    assert pair["ci"][0] < pair["diff"] < pair["ci"][1] and pair["n_items"] == ITEMS
    md = (tmp_path / f"planted{study}" / "report.md").read_text()
    assert "Benjamini-Hochberg" in md and "eval noise only" in md
    print(f"\nplanted report {study}: {head['text']}")


# ---- the whole report on the designs users run (ablate.report.calibrate; scripts/calibrate_report.py) ----

JOBS = 2  # the whole-report calibrations end the suite, when the other pytest worker has little left: both cores
STUDIES = 120  # per design: the suite's budget (scripts/calibrate_report.py runs 1000 for the docs' figures)
MC_SE = 2 * math.sqrt(ALPHA * (1 - ALPHA) / STUDIES)  # two standard errors of a rate of alpha over 120 studies: 0.040


@pytest.mark.slow
@pytest.mark.parametrize("seeds,items", [(3, 60), (5, 60), (8, 60)])  # 1000 items: calibrate_report.py
def test_aa_any_claim_rate_through_the_whole_report(seeds, items):
    """120 A/A studies per design, each through analyze_runs: 3 variants at two scales (decision accuracy from the
    smaller one ranks each task's metrics), validation loss, a cloze task with every metric, a continuation task and
    a subject-averaged task with a subject floor; accuracies quantized by the items, per-run item quirks that persist
    across checkpoints and per-variant item quirks that persist across seeds (a population null). Any significant
    pair in either family counts as a claim: the rate stays within alpha + 2
    standard errors (0.090)."""
    out = calibrate.calibrate(
        calibrate.Design(seeds=seeds, items=items), STUDIES, seed=seeds * 10_000 + items, jobs=JOBS
    )
    rate, _ = out["any_claim"]
    print(f"\nA/A {out['design'].label()}: any claim {rate:.3f}, winner named {out['winner_named'][0]:.3f}")
    assert rate <= ALPHA + MC_SE and out["winner_named"][0] <= ALPHA + MC_SE
    assert out["decision_metrics"] > 1.2  # tasks do enter the decisions: more than validation loss alone


@pytest.mark.slow
def test_planted_effect_found_through_the_whole_report():
    """A planted effect of 6 seed-level sds on A, at 3 seeds: named winner in most studies, never a wrong one. (At
    3 sds, 3 seeds find it in about a third of studies: the t-test's power on 2 degrees of freedom at the primary
    family's first Benjamini-Hochberg step, 0.04 / 3.)"""
    out = calibrate.calibrate(calibrate.Design(seeds=3, effect=6.0), 100, seed=7, jobs=JOBS)
    print(f"\nplanted {out['design'].label()}: right winner {out['right_winner'][0]:.3f}")
    assert out["right_winner"][0] >= 0.5 and out["wrong_winner"][0] == 0


@pytest.mark.slow
def test_calibration_script_smoke():
    result = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "scripts" / "calibrate_report.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| A/A") or line.startswith("| planted")]
    assert len(rows) == 12 and "ratio worst A/A any-claim rate / alpha: " in result.stdout, result.stdout
