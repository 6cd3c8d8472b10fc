"""ablate report over synthetic run folders whose figures are known exactly (see report_fixtures.py)."""
import json

import numpy as np
import pytest

from ablate.report import Options, ReportError, build_report, write_report
from ablate.report import stats
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
    assert lo < 0.70 < hi and hi - lo < 0.25
    q = s["quality"]
    finals = [0.70, 0.60, 0.45]
    assert q["signal"] == pytest.approx((0.70 - 0.45) / np.mean(finals))
    tails = [[v + o for v in TOY[name][-3:]] for name in TOY for o in (0.01, -0.01)]
    noise = np.mean([np.std(t, ddof=1) / np.mean(t) for t in tails])
    assert q["noise"] == pytest.approx(noise) and q["snr"] == pytest.approx(q["signal"] / noise)
    c = q["chance"]
    se = np.mean([np.sqrt(p * (1 - p) / 100) for p in [0.71, 0.69, 0.61, 0.59, 0.46, 0.44]])
    assert c["chance"] == 0.25 and c["z_final"] == pytest.approx((np.mean(finals) - 0.25) / se)
    assert c["first_significant_step"] == 10
    assert c["gain_over_choices_only"] == pytest.approx(np.mean(finals) - 0.25) and c["gain_z"] > 2
    val = series(report, "val_loss", "loss")
    assert val["direction"] == "lower" and val["best"] == "A" and val["chance"] == pytest.approx(np.log(512))
    assert val["quality"]["monotonicity"] == 1 and val["quality"]["ranking"]["tau_second_half"] == 1


def test_pairwise_significant_and_not(toy):
    _, report = toy
    ab = next(p for p in series(report, "toy:cf", "acc_per_char")["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    assert ab["diff"] == pytest.approx(0.1) and ab["better"] == "A" and ab["significant"]
    assert ab["p_items"] < 0.01 and ab["ci"][0] > 0 and ab["seeds_agree"] == 2 and ab["n_items"] == 100
    flat = next(p for p in series(report, "flat:cf", "acc_raw")["pairwise"] if (p["a"], p["b"]) == ("A", "B"))
    assert flat["diff"] == 0 and flat["better"] is None and flat["significant"] is False
    assert flat["p_items"] == pytest.approx(1.0) and flat["ci"][0] < 0 < flat["ci"][1]
    val = next(p for p in series(report, "val_loss", "loss")["pairwise"] if (p["a"], p["b"]) == ("A", "C"))
    assert val["diff"] == pytest.approx(-0.2) and val["better"] == "A" and val["significant"]


def test_recommendation_and_headline(toy):
    root, report = toy
    rec = report["recommendation"]
    assert [(e["task"], e["metric"]) for e in rec["suite"]] == [("val_loss", "loss"), ("toy:cf", "acc_per_char")]
    assert rec["rejected"] == [{"task": "flat:cf", "metric": "acc_raw", "failed": ["monotone"],
                                "not_computable": ["consistent"]}]
    assert series(report, "toy:cf", "acc_choices_only")["quality"]["passes"] is False  # a baseline, never a signal
    assert rec["aggregate"]["A"]["mean_rank"] == 1 and rec["aggregate"]["C"]["mean_rank"] == 3
    head = report["headline"]
    assert head["winner"] == "A"
    assert [(c["other"], c["won"], c["tasks"], c["significant"]) for c in head["comparisons"]] == \
        [("B", 2, 3, 2), ("C", 2, 3, 2)]
    assert "A beats B on 2/3 tasks, significantly (p < 0.05) on 2" in head["text"] and "A/seed2" in head["text"]
    # Stricter thresholds move toy out of the suite: tau 2/3 < 0.7.
    strict = build_report(root, Options(bootstrap=50, min_tau=0.7))
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
    assert report["headline"]["text"].split(";")[0] in md
    assert page.count("data:image/png;base64,") >= 4  # training loss, val_loss, flat, toy, ranking
    tau = series(report, "toy:cf", "acc_per_char")["quality"]["ranking"]["tau_second_half"]
    assert f"{tau:.3g}" in md and f"{tau:.3g}" in page


def test_one_seed_one_checkpoint_says_what_it_cannot_compute(tmp_path):
    root = tmp_path / "single"
    for variant, k in (("A", 60), ("B", 40)):
        write_run(root, variant, 0, [40], [4.0 if variant == "A" else 4.2],
                  {"toy": {"chance": 0.25, "primary": "acc_per_char", "items": {40: accuracy_items(set(range(k)))}}})
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
    assert s["pairwise"][0]["p_seeds"] is None and s["pairwise"][0]["significant"]  # 60 vs 40 of 100 items
    assert report["recommendation"]["suite"] == []
    assert "n/a" in (root / "report.md").read_text()


def test_names_are_escaped(tmp_path):
    root = tmp_path / "escape"
    task = "<img src=x onerror=alert(1)>"
    for variant, k in (("<script>alert(1)</script>", 30), ("ok|pipe", 35)):
        for seed in (0, 1):
            items = {step: accuracy_items(set(range(k + step // 10 + seed))) for step in (10, 20, 30)}
            write_run(root, variant.replace("/", "_"), seed, [10, 20, 30], [4.0, 3.9, 3.8],
                      {task: {"chance": 0.25, "primary": "acc_per_char", "items": items}})
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
            for seed in (0, 1):
                extra = {"model.d_model": d_model, "model.n_kv_heads": 1 if method == "mqa" else None}
                write_run(root, f"{method}@d{d_model}", seed, [10, 20, 30], [loss + 0.4, loss + 0.2, loss], {},
                          config_extra=extra)
    report = build_report(root, Options(bootstrap=50, scale=["model.d_model"]))
    assert [g["scale"] for g in report["groups"]] == [32, 64]
    assert report["groups"][1]["variants"] == ["mha", "mqa"]
    (row,) = report["across_scales"][0]["by_scale"]
    assert row["scale"] == 32 and row["decision_accuracy"] == 0 and row["tau"] == -1
    assert report["headline"]["winner"] == "mha"
    assert report["headline"]["text"].startswith("scales at model.d_model=64: mha beats mqa on 1/1 tasks")


def test_cli_report_prints_headline(toy, tmp_path):
    root, _ = toy
    result = run_cli("report", str(root), "--out", str(tmp_path / "out"), "--bootstrap", "100", "--min-tau", "0.5")
    assert result.stdout.startswith("toy: A beats B on 2/3 tasks")
    assert (tmp_path / "out" / "report.html").is_file()
    assert json.loads((tmp_path / "out" / "report.json").read_text())["options"]["min_tau"] == 0.5
    missing = run_cli("report", str(tmp_path / "nothing"), check=False)
    assert missing.returncode == 2 and "not a folder" in missing.stderr


def test_stats_edge_cases():
    assert stats.spearman([1, 2], [1, 2]) is None and stats.spearman([1, 2, 3], [5, 5, 5]) == 0
    assert stats.kendall([1, 1, 1], [1, 2, 3]) == 0 and stats.kendall([1, 2, 3], [2, 2, 2]) is None
    assert stats.decision_accuracy([1, 1], [1, 2]) == 0.5 and stats.decision_accuracy([1, 2], [3, 3]) is None
    assert stats.relative_dispersion([1.0]) is None and stats.relative_std([2.0]) is None
    with pytest.raises(ReportError, match="no run folders"):
        build_report(__import__("pathlib").Path(__file__).parent)
