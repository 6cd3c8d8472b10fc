"""ablate report over synthetic run folders whose figures are known exactly (see report_fixtures.py)."""

import json

import numpy as np
import pytest

from ablate.report import Options, ReportError, build_report, write_report
from ablate.report.stats import describe, noise, power
from conftest import run_cli
from report_fixtures import STEPS, TOY, accuracy_items, build_toy_experiment, write_run

FAST = Options(bootstrap=300)


def series(report, task, metric, group=-1):
    return next(s for s in report["groups"][group]["series"] if (s["task"], s["metric"]) == (task, metric))


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = build_toy_experiment(tmp_path_factory.mktemp("runs") / "toy")
    return root, write_report(root, opts=FAST)


def test_ranking_figures_are_exact(toy):
    _, report = toy
    s = series(report, "toy:cf", "acc_per_char")
    ranking = s["quality"]["ranking"]
    assert [r["step"] for r in ranking["by_checkpoint"]] == STEPS
    assert [r["tau"] for r in ranking["by_checkpoint"]] == pytest.approx([-1, 1 / 3, 1, 1])
    assert [r["decision_accuracy"] for r in ranking["by_checkpoint"]] == pytest.approx([0, 2 / 3, 1, 1])
    assert ranking["tau_second_half"] == pytest.approx(2 / 3)  # steps 20 and 30 (the final is left out)
    assert ranking["early_step"] == 10 and ranking["early_decision_accuracy"] == 0
    assert ranking["consistent_from_step"] == 30 and ranking["consistent_from_fraction"] == 0.75
    assert s["quality"]["monotonicity"] == pytest.approx(0.6)
    assert s["quality"]["monotonicity_per_run"]["C/seed0"] == pytest.approx(-0.2)


def test_final_scores_snr_and_chance(toy):
    _, report = toy
    s = series(report, "toy:cf", "acc_per_char")
    assert {v: f["mean"] for v, f in s["final"].items()} == pytest.approx({v: TOY[v][-1] for v in TOY})
    assert s["final"]["A"]["seed_std"] == pytest.approx(np.std([0.71, 0.69], ddof=1))
    assert s["best"] == "A" and s["final"]["A"]["n_items"] == 100
    lo, hi = s["final"]["A"]["ci"]
    # the t interval under the tests' noise model: 2 seeds leave about 1 df, so it is far wider than the item
    # set's own +-2 se (100 items near 0.7: se 0.046) and centred on the mean
    assert lo < 0.70 < hi and hi - lo > 4 * 0.046 and (lo + hi) / 2 == pytest.approx(0.70)
    q = s["quality"]
    finals = [0.70, 0.60, 0.45]
    assert q["signal"] == pytest.approx((0.70 - 0.45) / np.mean(finals))
    # Signal and Noise: noise = sd (ddof 1) of a run's last 3 checkpoints up to the compared one, mean over runs,
    # relative to the same mean as the signal; SNR = range of the finals / mean within-run sd
    tails = [[v + o for v in TOY[name][-3:]] for name in TOY for o in (0.01, -0.01)]
    mean_sd = np.mean([np.std(t, ddof=1) for t in tails])
    assert q["noise"] == pytest.approx(mean_sd / np.mean(finals))
    assert q["snr"] == pytest.approx(q["signal"] / q["noise"]) and q["snr"] == pytest.approx(0.25 / mean_sd)
    c = q["chance"]
    se = np.mean([np.sqrt(p * (1 - p) / 100) for p in [0.71, 0.69, 0.61, 0.59, 0.46, 0.44]])
    assert c["chance"] == 0.25 and c["z_final"] == pytest.approx((np.mean(finals) - 0.25) / se)
    assert c["first_significant_step"] == 10
    assert c["gain_over_choices_only"] == pytest.approx(np.mean(finals) - 0.25) and c["gain_z"] > 2
    val = series(report, "val_loss", "loss")
    assert val["direction"] == "lower" and val["best"] == "A" and val["chance"] == pytest.approx(np.log(512))
    assert val["quality"]["monotonicity"] == 1 and val["quality"]["ranking"]["tau_second_half"] == 1


def test_pairwise_two_seeds_establish_nothing(toy):
    """Two seeds per variant: the item-level test is tiny and both seeds agree, but a difference is only decided
    from >= 3 seeds (the old report called these pairs significant from items alone)."""
    _, report = toy
    ab = next(p for p in series(report, "toy:cf", "acc_per_char")["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    assert ab["diff"] == pytest.approx(0.1) and ab["better"] == "A" and ab["significant"] is None  # untested
    assert not ab["testable"] and ab["p_bh"] is None and "2 seeds both ran, fewer than 3" in ab["note"]
    # identical per-seed diffs: the seed term is floored by the items' fresh noise, never p = 0
    assert ab["paired"] and ab["test"] == "paired t over seeds, seeds + items (per-item files)"
    assert 0 < ab["p_seeds"] and ab["sd_seeds"] == 0 and ab["sd_diff"] == ab["noise_floor_sd"] > 0
    assert ab["seeds_needed"] >= 3
    assert ab["p_items"] < 0.01 and ab["ci"] is None and ab["seeds_agree"] == 2 and ab["n_items"] == 100
    flat = next(p for p in series(report, "flat:cf", "acc_raw")["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    # flat is no decision metric but a candidate, so in the family: two seeds, not tested, not significant
    assert flat["diff"] == 0 and flat["better"] is None and flat["significant"] is None
    assert flat["p_items"] == pytest.approx(1.0) and flat["ci"] is None and flat["seeds_needed"] is None
    val = next(p for p in series(report, "val_loss", "loss")["pairwise"] if (p["a"], p["b"]) == ("A", "C"))
    assert val["diff"] == pytest.approx(-0.2) and val["better"] == "A" and val["significant"] is None
    assert report["inference"]["tests"] == 0 and report["inference"]["comparisons"] == 9  # 3 pairs x 3 candidates
    assert report["inference"]["family_metrics"] == [
        ["val_loss", "loss"],
        ["toy:cf", "acc_per_char"],
        ["flat:cf", "acc_raw"],
    ]  # not the choices-only baseline
    baseline = series(report, "toy:cf", "acc_choices_only")["pairwise"][0]
    assert baseline["significant"] is None and baseline["p_bh"] is None


def test_recommendation_and_headline(toy):
    root, report = toy
    rec = report["recommendation"]
    assert [(e["task"], e["metric"]) for e in rec["suite"]] == [("val_loss", "loss"), ("toy:cf", "acc_per_char")]
    assert rec["rejected"] == [
        {
            "task": "flat:cf",
            "status": "no_signal",
            "reasons": {"acc_raw": "not monotone (rho 0 < 0.5); consistent not computable"},
        }
    ]
    toy_choice = next(c for c in rec["choices"] if c["task"] == "toy:cf")
    assert toy_choice["metric"] == "acc_per_char" and toy_choice["figures"]["monotonicity"] == pytest.approx(0.6)
    assert toy_choice["others"] == [{"metric": "acc_choices_only", "why": "a baseline (answer priors), never a signal"}]
    assert toy_choice["text"].startswith("toy: acc_per_char (rho 0.6, SNR ")
    assert series(report, "toy:cf", "acc_choices_only")["quality"]["passes"] is False  # a baseline, never a signal
    assert rec["aggregate"]["A"]["mean_rank"] == 1 and rec["aggregate"]["C"]["mean_rank"] == 3
    assert rec["aggregate_over"] == [["val_loss", "loss"], ["toy:cf", "acc_per_char"]]  # flat: no signal, left out
    head = report["headline"]
    assert head["winner"] is None  # two seeds establish nothing
    assert [(d["name"], d["status"], d["leader"]) for d in head["decisions"]] == [
        ("val_loss", "too_few_seeds", "A"),
        ("toy", "too_few_seeds", "A"),
    ]
    assert head["no_signal"] == ["flat"]
    assert head["text"].startswith("toy: val_loss: A ahead, not established with 2 seeds (~3 seeds needed); toy: A")
    assert "flat: no signal here" in head["text"] and "No winner established" in head["text"]
    assert "A/seed2" in head["text"]
    # Stricter thresholds move toy out of the suite: tau 2/3 < 0.7.
    strict = build_report(root, Options(bootstrap=50, min_tau=0.7)).to_json()
    assert [e["task"] for e in strict["recommendation"]["suite"]] == ["val_loss"]


def test_unfinished_run_is_named_and_left_out(toy):
    root, report = toy
    o = report["overview"]
    assert o["not_analyzed"] == ["A/seed2"]
    row = next(r for r in o["runs"] if r["run"] == "A/seed2")
    assert row["status"] == "unfinished" and "step 20 of 40" in row["note"]
    assert series(report, "val_loss", "loss")["final"]["A"]["seeds"] == [0, 1]
    md = (root / "report.md").read_text()
    assert "A/seed2" in md and "unfinished" in md


def test_files_agree_with_report_json(toy):
    root, report = toy
    on_disk = json.loads((root / "report.json").read_text())
    assert on_disk == report
    md, page = (root / "report.md").read_text(), (root / "report.html").read_text()
    assert report["headline"]["verdict"] in md.replace("\\", "")  # markdown escapes (~ etc.) aside
    assert page.count("data:image/png;base64,") >= 4  # training loss, val_loss, flat, toy, ranking
    tau = series(report, "toy:cf", "acc_per_char")["quality"]["ranking"]["tau_second_half"]
    assert f"{tau:.3g}" in md and f"{tau:.3g}" in page


def test_one_seed_one_checkpoint_says_what_it_cannot_compute(tmp_path):
    root = tmp_path / "single"
    for variant, k in (("A", 60), ("B", 40)):
        write_run(
            root,
            variant,
            0,
            [40],
            [4.0 if variant == "A" else 4.2],
            {"toy": {"chance": 0.25, "primary": "acc_per_char", "items": {40: accuracy_items(set(range(k)))}}},
        )
    write_run(root, "C", 0, [40], [float("nan")], {}, finished=False)  # diverged: named as failed
    report = write_report(root, opts=FAST)
    failed = next(r for r in report["overview"]["runs"] if r["run"] == "C/seed0")
    assert failed["status"] == "failed" and "non-finite loss at step 40" in failed["note"]
    assert report["groups"][0]["variants"] == ["A", "B"]
    notes = " ".join(report["cannot_compute"])
    assert "need >= 2 seeds per variant" in notes and "needs >= 3 evaluated checkpoints" in notes
    assert "need >= 2 evaluated checkpoints" in notes
    s = series(report, "toy:cf", "acc_per_char")
    assert s["final"]["A"]["seed_std"] is None and s["quality"]["monotonicity"] is None
    assert s["quality"]["snr"] is None and s["quality"]["ranking"]["tau_second_half"] is None
    pair = s["pairwise"][0]  # 60 vs 40 of 100 items: evaluation noise says "different", one seed says nothing
    assert pair["p_items"] < 0.05 and pair["p_seeds"] is None and pair["seeds_needed"] is None
    assert pair["significant"] is None  # a candidate, in the family; one seed: not tested, so no verdict
    val = series(report, "val_loss", "loss")["pairwise"][0]
    assert val["significant"] is None and not val["testable"]
    text = report["headline"]["text"]
    assert "val_loss: A ahead, not established with 1 seed (seed spread unknown)" in text
    assert "toy: signal not assessable" in text and "No winner established" in text
    assert report["recommendation"]["suite"] == []
    assert "n/a" in (root / "report.md").read_text()


def test_names_are_escaped(tmp_path):
    root = tmp_path / "escape"
    task = "<img src=x onerror=alert(1)>"
    for variant, k in (("<script>alert(1)</script>", 30), ("ok|pipe", 35)):
        for seed in (0, 1):
            items = {step: accuracy_items(set(range(k + step // 10 + seed))) for step in (10, 20, 30)}
            write_run(
                root,
                variant.replace("/", "_"),
                seed,
                [10, 20, 30],
                [4.0, 3.9, 3.8],
                {task: {"chance": 0.25, "primary": "acc_per_char", "items": items}},
            )
    report = write_report(root, opts=FAST)
    page = (root / "report.html").read_text()
    assert "<script" not in page and "<img src=x" not in page
    assert "&lt;script&gt;" in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    md = (root / "report.md").read_text()
    assert "<script" not in md.replace("\\<script", "") and "ok\\|pipe" in md
    assert report["groups"][0]["variants"] == ["<script>alert(1)<_script>", "ok|pipe"]


def test_scale_axis_decision_accuracy(tmp_path):
    """mqa wins at d_model 32, mha at 64: decision accuracy from the small scale is 0, tau -1."""
    root = tmp_path / "scales"
    for d_model, losses in ((32, {"mha": 4.2, "mqa": 4.1}), (64, {"mha": 3.6, "mqa": 3.7})):
        for method, loss in losses.items():
            for seed in (0, 1, 2):
                extra = {"model.d_model": d_model, "model.n_kv_heads": 1 if method == "mqa" else None}
                write_run(
                    root,
                    f"{method}@d{d_model}",
                    seed,
                    [10, 20, 30],
                    [loss + 0.4, loss + 0.2, loss],
                    {},
                    config_extra=extra,
                )
    report = build_report(root, Options(bootstrap=50, scale=["model.d_model"])).to_json()
    assert [g["scale"] for g in report["groups"]] == [32, 64]
    assert report["groups"][1]["variants"] == ["mha", "mqa"]
    (row,) = report["across_scales"][0]["by_scale"]
    assert row["scale"] == 32 and row["decision_accuracy"] == 0 and row["tau"] == -1
    assert report["headline"]["winner"] == "mha"
    assert report["headline"]["text"].startswith(
        "scales at model.d_model=64: val_loss: mha best (p_BH<0.001, 3 seeds) (validation loss only"
    )
    assert "Winner: mha (best on 1 of 1" in report["headline"]["text"]
    family = report["inference"]["family"]
    assert "at model.d_model=64: primary metric val_loss, 1 pair(s), Benjamini-Hochberg at 0.04; 1 of 1" in family


@pytest.mark.slow
def test_cli_report_prints_the_verdict_and_the_decisions_table(toy, tmp_path):
    root, _ = toy
    result = run_cli("report", str(root), "--out", str(tmp_path / "out"), "--bootstrap", "100", "--min-tau", "0.5")
    head = json.loads((tmp_path / "out" / "report.json").read_text())["headline"]
    lines = result.stdout.splitlines()
    assert lines[0] == f"toy: {head['verdict']}" and lines[0].startswith("toy: No winner: too few seeds")
    assert lines[1].split() == "metric status leader pairs decided closest open pair seeds needed".split()
    rows = len(head["decisions"])
    assert lines[2].startswith("val_loss ") and lines[2 + rows : -1] == head["notes"] and head["notes"]
    assert (tmp_path / "out" / "report.html").is_file()
    assert json.loads((tmp_path / "out" / "report.json").read_text())["options"]["min_tau"] == 0.5
    missing = run_cli("report", str(tmp_path / "nothing"), check=False)
    assert missing.returncode == 2 and "not a folder" in missing.stderr


def test_stats_edge_cases():
    assert describe.spearman([1, 2], [1, 2]) is None and describe.spearman([1, 2, 3], [5, 5, 5]) == 0
    assert describe.kendall([1, 1, 1], [1, 2, 3]) == 0 and describe.kendall([1, 2, 3], [2, 2, 2]) is None
    assert describe.decision_accuracy([1, 1], [1, 2]) == 0.5 and describe.decision_accuracy([1, 2], [3, 3]) is None
    assert describe.signal_noise([1.0], [[1.0, 2.0]]) == describe.SignalNoise(None, None, None, 2)
    assert describe.signal_noise([1.0, 2.0], [[3.0]]).snr is None  # one checkpoint: no noise estimate
    flat = describe.signal_noise([1.0, 2.0], [[1.0, 1.0], [2.0, 2.0]])  # checkpoints that do not move: SNR unknown
    assert flat.snr is None and flat.noise == 0 and flat.signal == pytest.approx(1 / 1.5)
    # a margin whose variants straddle zero: signal and noise relative to a mean near 0 blow up, SNR does not
    margin = describe.signal_noise([-0.1, 0.1], [[-0.2, 0.0], [0.0, 0.2]])
    assert margin.signal is None and margin.snr == pytest.approx(0.2 / np.std([-0.2, 0.0], ddof=1))
    with pytest.raises(ReportError, match="no run folders"):
        build_report(__import__("pathlib").Path(__file__).parent).to_json()


def test_seed_level_tests_and_bh():
    a, b = {0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.5, 1: 1.8, 2: 2.1}
    paired = noise.seed_test(a, b)
    assert paired.paired and paired.p == pytest.approx(__import__("scipy").stats.ttest_1samp([0.5, 0.2, 0.9], 0).pvalue)
    assert paired.sd_diff == pytest.approx(np.std([0.5, 0.2, 0.9], ddof=1))
    welch = noise.seed_test(a, {5: 0.5, 6: 1.8, 7: 2.1})
    assert (
        not welch.paired
        and welch.test == "Welch t over seeds"
        and welch.p
        == pytest.approx(__import__("scipy").stats.ttest_ind([1, 2, 3], [0.5, 1.8, 2.1], equal_var=False).pvalue)
    )
    assert welch.sd_diff == pytest.approx(
        np.sqrt((np.var([1, 2, 3], ddof=1) + np.var([0.5, 1.8, 2.1], ddof=1)) / 2) * np.sqrt(2)
    )
    assert power.bh_adjust([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    assert power.bh_adjust([]) == [] and power.bh_adjust([0.9, 0.95]) == pytest.approx([0.95, 0.95])
    # normal approximation 4 seeds; the t-test needs 6 for 80% power at d = 1.5
    assert power.seeds_needed(1.5, 1.0, 0.05, 0.8) == 6 and power.seeds_needed(0.0, 1.0, 0.05, 0.8) is None
    assert power.seeds_needed(1.0, None, 0.05, 0.8) is None and power.seeds_needed(1.0, 0.0, 0.05, 0.8) == 2


def _acc_items(ids, right):
    return [{"id": i, "gold": 0, "acc_per_char": float(k < right)} for k, i in enumerate(ids)]


def test_different_item_sets_are_matched_or_left_out(tmp_path):
    """A/seed0's last evaluation was re-scored on 50 items (ablate eval --limit 50): "t" is compared over the 50
    items every run shares and the mismatch is named; on "u" A/seed0 scored other ids: u is left out, and named."""
    root = tmp_path / "mixed"
    ids = [f"q{i}" for i in range(100)]
    for variant, right in (("A", 60), ("B", 40)):
        for seed in (0, 1, 2):
            t_items = {step: _acc_items(ids, right + step // 10 + seed) for step in (10, 20, 30)}
            u_items = {step: _acc_items(ids[:50], 25 + step // 10) for step in (10, 20, 30)}
            if (variant, seed) == ("A", 0):
                t_items[30] = _acc_items(ids[:50], 35)
                u_items[30] = _acc_items([f"other{i}" for i in range(50)], 30)
            write_run(
                root,
                variant,
                seed,
                [10, 20, 30],
                [4.0, 3.9, 3.8],
                {
                    "t": {"chance": 0.25, "primary": "acc_per_char", "items": t_items},
                    "u": {"chance": 0.25, "primary": "acc_per_char", "items": u_items},
                },
            )
    report = write_report(root, opts=FAST)
    mismatch = {m["task"]: m for m in report["groups"][0]["item_mismatch"]}
    assert mismatch["t:cf"]["kept"] and mismatch["t:cf"]["shared"] == 50
    assert mismatch["t:cf"]["runs"]["A/seed0"] == 50 and mismatch["t:cf"]["runs"]["B/seed2"] == 100
    assert "50 items: A/seed0" in mismatch["t:cf"]["text"] and "compared over the 50 items" in mismatch["t:cf"]["text"]
    t = series(report, "t:cf", "acc_per_char")
    assert t["final"]["A"]["n_items"] == 50 and t["pairwise"][0]["n_items"] == 50
    assert t["final"]["A"]["values"][0] == pytest.approx(35 / 50)  # A/seed0's score over the shared 50 items
    assert t["final"]["B"]["values"][0] == pytest.approx(43 / 50)  # B/seed0: 43 right, all among the first 50
    assert not mismatch["u:cf"]["kept"] and mismatch["u:cf"]["shared"] == 0
    assert not any(s["task"] == "u:cf" for s in report["groups"][0]["series"])
    assert (
        report["headline"]["left_out"] == ["u:cf"]
        and "u:cf: left out (runs scored different items)" in report["headline"]["text"]
    )
    md = (root / "report.md").read_text()
    assert "Different item sets: t:cf: runs scored different items" in md and "u:cf" in md


def test_different_batch_sizes_compare_at_equal_tokens(tmp_path):
    """global_batch 32 makes twice the tokens per step: finals are taken at 4,000 tokens (where the batch-16 runs
    end), from the batch-32 runs' step 20."""
    root = tmp_path / "tokens"
    for variant, batch, val in (("gb=16", 16, [5.0, 4.6, 4.3, 4.1]), ("gb=32", 32, [4.9, 4.4, 4.0, 3.7])):
        for seed in (0, 1, 2):
            write_run(
                root,
                variant,
                seed,
                STEPS,
                [v + 0.01 * seed for v in val],
                {},
                tokens_per_step=batch * 100 // 16,
                config_extra={"train.global_batch": batch},
            )
    report = write_report(root, opts=FAST)
    val = series(report, "val_loss", "loss")
    assert val["final"]["gb=32"]["steps"] == [20, 20, 20] and val["final"]["gb=32"]["tokens"] == [4000] * 3
    assert val["final"]["gb=16"]["steps"] == [40, 40, 40]
    assert val["final"]["gb=32"]["mean"] == pytest.approx(4.4 + 0.01) and val["best"] == "gb=16"
    assert not val["compared_at"]["at_last"] and val["compared_at"]["tokens"] == 4000
    assert "4,000 tokens, the most every run reached" in val["compared_at"]["text"]
    assert [r["tokens"] for r in val["quality"]["ranking"]["by_checkpoint"]] == [2000, 3000, 4000]
    assert report["groups"][0]["shape_differences"] == {"train.global_batch": {"16": ["gb=16"], "32": ["gb=32"]}}
    md = (root / "report.md").read_text()
    assert "train.global_batch differs between runs" in md and "at 4,000 tokens, the most every run reached" in md
    assert report["headline"]["text"].startswith("tokens: val_loss: gb=16 best (p_BH")


def test_natural_order_vs_best_table_axes_and_chance_caption(tmp_path):
    """Four widths written in text order: shown d_model=16 < 32 < 64 < 128, laid out on their axis; the pairwise
    table is each variant vs the best; val loss near 3 leaves ln(512) = 6.2 off the plot, and says so."""
    root = tmp_path / "widths"
    for width, loss in ((128, 3.0), (16, 3.3), (32, 3.2), (64, 3.1)):
        for seed in (0, 1, 2):
            write_run(
                root,
                f"d_model={width}",
                seed,
                STEPS,
                [loss + 0.1 - 0.03 * k + 0.002 * seed for k in range(4)],
                {},
                axes={"model.d_model": width},
                config_extra={"model.d_model": width},
            )
    report = write_report(root, opts=FAST)
    order = ["d_model=16", "d_model=32", "d_model=64", "d_model=128"]
    assert report["groups"][0]["variants"] == order and report["overview"]["variants"] == order
    assert report["overview"]["axes"] == {
        "fields": ["d_model"],
        "by_variant": {v: {"d_model": int(v[8:])} for v in order},
    }
    val = series(report, "val_loss", "loss")
    assert len(val["pairwise"]) == 6 and report["inference"]["tests"] == 6
    text = report["headline"]["text"]
    # every pair differs by construction: the leader's three tests, then each other significant pair by name
    assert text.startswith(
        "widths: val_loss: d_model=128 best, ahead of d_model=16, d_model=32, d_model=64 (p_BH<0.001, 3 seeds); also "
        "d_model=32 ahead of d_model=16 (p_BH<0.001), d_model=64 ahead of d_model=16 (p_BH<0.001), d_model=64 ahead "
        "of d_model=32 (p_BH<0.001)"
    ), text
    md = (root / "report.md").read_text()
    caption = "the best (d_model=128) vs each other variant, diff = d_model=128 - other; all 6 pairs are in report.json"
    table = md.split(caption)[1].split("\n\n")[1]
    assert table.startswith("| d_model=128 vs | diff |") and table.count("\n| d_model=") == 3
    assert (
        "Chance level far from the curves, not drawn so it does not flatten them: val_loss [loss] (chance 6.238)" in md
    )
    assert "Variants on the grid's axes" in md
    page = (root / "report.html").read_text()
    assert "<figcaption>val_loss [loss] (chance 6.238 is far from the curves and not drawn)</figcaption>" in page


def test_runs_table_shows_active_parameters_and_kv_cache_bytes(tmp_path):
    """An MoE run's total and active parameters, and each attention choice's KV-cache bytes beside its loss."""
    root = tmp_path / "arch"
    sizes = {"mha": (12345, 12345, 4096), "mla": (12000, 12000, 1280), "moe": (30000, 12345, 4096)}
    for variant, (params, active, kv) in sizes.items():
        for seed in (0, 1):
            run = write_run(root, variant, seed, STEPS, [5.0, 4.5, 4.0, 3.8], {})
            summary = json.loads((run / "summary.json").read_text())
            summary.update(params=params, params_active=active, kv_cache_bytes_per_token=kv)
            (run / "summary.json").write_text(json.dumps(summary))
    report = write_report(root, opts=FAST)
    rows = {r["run"]: r for r in report["overview"]["runs"]}
    assert rows["mla/seed0"]["kv_bytes_per_token"] == 1280 and rows["moe/seed1"]["params_active"] == 12345
    md = (root / "report.md").read_text()
    assert "| KV cache B/token |" in md
    assert "| 30,000 (12,345 active) |" in md and "| 1,280 |" in md
