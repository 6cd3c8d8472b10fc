"""`ablate report --baseline` on constructed ladders written as run folders: each variant's losses lie on the
baseline's curve at a planted multiple of its compute, so the report's compute multipliers have known answers."""

import json
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

from ablate import ModelConfig, RunConfig, ScheduleConfig, TrainConfig, compute_points, variant
from ablate.report import Options, ReportError, build_report
from ablate.report.schema import Report
from ablate.report.text.render import to_html, to_markdown
from ablate.report.inputs.flops import flops_per_token
from report_fixtures import write_run

BASE = RunConfig(
    experiment="ladder",
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    schedule=ScheduleConfig(warmup=0.05),
    train=TrainConfig(max_steps=40, global_batch=4, micro_batch=4),
)
E, ALPHA, SEED_NOISE = 3.0, 0.3, (-0.004, 0.001, 0.003)
A = {32: 2.0, 64: 1.6, 128: 1.3}  # a larger rung's baseline sits lower at equal compute


def _baseline_loss(d_model: int, flops: float) -> float:
    return E + A[d_model] * (flops / 1e9) ** -ALPHA


def _write_ladder(root, planted: dict, rungs=(32, 64), budgets=(0.5, 1, 2)):
    """baseline and one arm per planted multiplier (an lr change: equal FLOPs; a number, or one per rung), each at
    the budgets, 3 seeds."""
    arms = {"baseline": ({}, 1.0)} | {
        name: ({"optim.lr": 1e-3 * (i + 2)}, m) for i, (name, m) in enumerate(planted.items())
    }
    for d_model in rungs:
        for arm, (changes, m) in arms.items():
            config = variant(BASE, arm, {**changes, "model.d_model": d_model})
            per_token = flops_per_token({"model": config.model.__dict__})[0]
            for run in compute_points(config, f"{arm}@d{d_model}", budgets=budgets):
                flops = per_token * run.train.max_steps * 100  # write_run: 100 tokens a step
                extra = {
                    f"{s}.{k}": v
                    for s, section in run.to_dict().items()
                    if isinstance(section, dict)
                    for k, v in section.items()
                }
                for seed, noise in enumerate(SEED_NOISE):
                    if run.branch:  # as a run folder holds it: the parent's identity is its seed's
                        extra["branch.parent_identity"] = f"parent-{run.branch['parent']}-{seed}"
                    # a seed's shift shared by its runs, and each run's own noise
                    own = np.random.default_rng(zlib.crc32(f"{run.name}/{seed}".encode())).normal(0, 0.002)
                    at = m[d_model] if isinstance(m, dict) else m
                    loss = _baseline_loss(d_model, at * flops) + noise + own
                    steps = run.train.max_steps
                    write_run(root, run.name, seed, [steps // 2, steps], [loss + 0.5, loss], {}, config_extra=extra)
    return root


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    return _write_ladder(tmp_path_factory.mktemp("runs") / "ladder", {"fast": 1.3, "same": 1.0, "huge": 5.0})


@pytest.fixture(scope="module")
def report(ladder):
    return build_report(ladder, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200)).to_json()


def test_planted_multipliers_are_found_with_intervals_that_cover_them(report):
    found = report["multipliers"]
    assert report["schema"] == 4 and found["baseline"] == "baseline"
    rows = {(r["variant"], r["rung"]): r for r in found["rows"] if r["kind"] == "data"}
    assert set(rows) == {(v, d) for v in ("fast", "same", "huge") for d in (32, 64)}
    for rung in (32, 64):
        fast, same = rows[("fast", rung)], rows[("same", rung)]
        assert fast["multiplier"] == pytest.approx(1.3, rel=0.1)
        assert fast["interval"][0] <= 1.3 <= fast["interval"][1] and fast["interval"][0] > 1
        assert same["interval"][0] <= 1.0 <= same["interval"][1]
        assert fast["level"] == 0.9 and fast["seeds"] == 3 and not fast["extrapolated"]
        assert fast["params"] == 12345 and fast["flops"] > 0 and fast["wall_clock_multiplier"] is not None
        # the other budgets beside the main one: M does not depend on the budget when none was planted
        others = [b["multiplier"] for b in fast["by_budget"] if b["multiplier"] is not None]
        assert len(fast["by_budget"]) == 3 and all(m == pytest.approx(1.3, rel=0.15) for m in others)
    # 5x is beyond the baseline's 2x budget: a bound and its reason, never a number
    huge = rows[("huge", 32)]
    assert huge["multiplier"] is None and huge["interval"] is None and huge["extrapolated"]
    assert huge["note"].startswith("beyond 2x")
    assert found["floor"]["used"] == "shared" and found["floor"]["E"] == pytest.approx(E, abs=0.05)
    assert not found["trends"]["same"]["established"]


def test_compute_points_stay_out_of_the_comparisons(report):
    group = report["groups"][-1]
    assert group["variants"] == ["baseline", "fast", "huge", "same"] and group["scale"] == 64
    assert all(len(seeds) == 3 for seeds in group["seeds"].values())
    assert len(report["overview"]["compute_points"]) == 4 * 2 * 2 * 3  # arms x rungs x other budgets x seeds
    assert all("~" in label for label in report["overview"]["compute_points"])
    decided = {d["metric"] for d in report["headline"]["decisions"]}
    assert decided and "~" not in json.dumps(report["headline"]["decisions"])


def test_the_report_says_it_in_words_a_table_and_two_plots(report):
    words = report["headline"]["compute"]
    assert "fast: 1.30x compute [" in words and "compute [" in words and "at d_model=32" in words
    assert "huge: beyond 2x at d_model=32" in words
    assert "with scale not established" in words or "with scale (" in words
    assert words in report["headline"]["text"]
    md = to_markdown(Report.from_json(report))
    assert "## Compute multipliers" in md and "**Compute multipliers against baseline" in md
    # M at the other budgets beside its ratio to the main budget's M and that ratio's interval (planted: no change)
    assert "(ratio 1.00 [" in md and "no change established" in md and "tested for lack of fit" in md
    rows = [r for r in report["multipliers"]["rows"] if r["variant"] == "fast" and r["kind"] == "data"]
    assert all(r["read_from"] == "power law" and r["lack_of_fit"]["p"] > 0.2 for r in rows)
    assert all(not b["established"] for r in rows for b in r["budget_ratios"]) and rows[0]["budget_ratios"]
    assert "**Trend across scale" in md
    html = to_html(Report.from_json(report))
    section = html.split("<h2>Compute multipliers</h2>")[1].split("<h2>")[0]
    assert section.count("<img") == 3  # loss vs FLOPs at each rung, M vs compute


def test_without_a_baseline_the_report_says_how_to_ask(ladder):
    found = build_report(ladder, Options(scale=["model.d_model"], bootstrap=200)).to_json()["multipliers"]
    assert found["baseline"] is None and found["rows"] == []
    assert "--baseline METHOD (one of: baseline, fast, huge, same)" in found["note"]
    with pytest.raises(ReportError, match="--baseline adamw: no such method.*baseline, fast, huge, same"):
        build_report(ladder, Options(scale=["model.d_model"], baseline="adamw", bootstrap=200)).to_json()


def test_one_rung_of_three_points_gives_its_reason_not_a_number(tmp_path):
    root = _write_ladder(tmp_path / "ladder", {"fast": 1.3}, rungs=(32,))
    report = build_report(root, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200)).to_json()
    (row,) = report["multipliers"]["rows"]
    assert row["multiplier"] is None and "pin E" in row["note"]
    assert "one rung: no trend" in report["headline"]["compute"]
    # pinned at the true E, the number comes back, with its sensitivity to E reported
    pinned = build_report(
        root, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200, multiplier_floor=E)
    ).to_json()
    (row,) = pinned["multipliers"]["rows"]
    low, high = row["sensitivity"]["E_range"]  # 0 to 0.8 of the baseline's lowest loss: any E a reader believes
    lowest = min(p["loss"] for p in pinned["multipliers"]["points"] if p["method"] == "baseline" and p["counts"])
    assert row["multiplier"] == pytest.approx(1.3, rel=0.05)
    assert low == 0 and high == pytest.approx(0.8 * lowest, rel=0.01)


def test_a_projection_is_given_only_when_asked_and_labelled(ladder):
    report = build_report(
        ladder, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200, multiplier_target=1e13)
    ).to_json()
    projected = report["multipliers"]["projections"]["fast"]
    assert projected["extrapolation"] and projected["multiplier"] == pytest.approx(1.3, rel=0.15)
    assert "extrapolated" in projected["note"] and "an extrapolation" in to_markdown(Report.from_json(report))


def test_the_floor_flag_says_what_it_accepts(ladder):
    done = subprocess.run(
        [sys.executable, "-m", "ablate", "report", str(ladder), "--multiplier-floor", "low"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "allowed: auto, shared, or a loss in nats > 0" in done.stderr


def test_a_multiplier_that_shrinks_across_three_rungs_gets_a_negative_slope_and_a_frontier(tmp_path):
    root = _write_ladder(tmp_path / "ladder", {"shrink": {32: 1.8, 64: 1.4, 128: 1.1}}, rungs=(32, 64, 128))
    found = build_report(root, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200)).to_json()[
        "multipliers"
    ]
    data = [r["multiplier"] for r in found["rows"] if r["kind"] == "data"]
    assert data == pytest.approx([1.8, 1.4, 1.1], rel=0.1)
    trend = found["trends"]["shrink"]
    assert trend["slope"] < 0 and trend["interval"][1] < 0 and trend["established"]
    assert {r["kind"] for r in found["rows"]} == {"data", "frontier"}


def test_the_interval_carries_the_validation_items_term_where_per_item_files_exist(tmp_path):
    root = _write_ladder(tmp_path / "ladder", {"fast": 1.3})
    with_items = build_report(root, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200)).to_json()
    assert all(r["item_var"] is not None for r in with_items["multipliers"]["rows"])
    assert not any("per-item" in n for n in with_items["multipliers"]["notes"])
    for folder in root.glob("*@d64*/seed*/eval_items"):  # one rung without per-item files: said, not guessed
        shutil.rmtree(folder)
    without = build_report(root, Options(scale=["model.d_model"], baseline="baseline", bootstrap=200)).to_json()[
        "multipliers"
    ]
    rows = {r["rung"]: r for r in without["rows"]}
    assert rows[64]["item_var"] is None
    # with E fitted across the rungs, every row's interval reads every rung's points: none gets a partial item term
    assert without["floor"]["E_carried"] and rows[32]["item_var"] is None
    assert any(n.startswith("rung(s) 64: no per-item validation losses") for n in without["notes"])


def test_the_experiment_files_baseline_recorded_in_the_run_folders_is_used_unasked(tmp_path):
    root = _write_ladder(tmp_path / "ladder", {"fast": 1.3})
    for path in root.glob("*/seed*/config.json"):  # as train() writes it for a file with multiplier_baseline
        record = json.loads(path.read_text())
        record["config"]["multiplier_baseline"] = "baseline"
        path.write_text(json.dumps(record))
    report = build_report(root, Options(scale=["model.d_model"], bootstrap=200)).to_json()
    found = report["multipliers"]
    assert found["baseline"] == "baseline" and found["baseline_from"] == "the experiment file's multiplier_baseline"
    assert report["options"]["baseline"] == "baseline" and found["rows"][0]["multiplier"] is not None
    record = json.loads(path.read_text())
    record["config"]["multiplier_baseline"] = "fast"
    path.write_text(json.dumps(record))
    with pytest.raises(ReportError, match="different multiplier_baseline values \\(baseline, fast\\)"):
        build_report(root, Options(scale=["model.d_model"], bootstrap=200)).to_json()
