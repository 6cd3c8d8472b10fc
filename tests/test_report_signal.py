"""Every metric a candidate decision signal, judged by what the runs show (constructed run folders with known
answers): the choice of a task's metric, --average-last, the subject SNR floor, and SNR / decision accuracy with a
bootstrap CI across scales."""

import json

import numpy as np
import pytest

from ablate.report import Options, build_report, write_report
from ablate.report.stats import da
from conftest import cli_in_process
from report_fixtures import STEPS, write_run

FAST = Options(bootstrap=300)
N = 100
SEED_OFFSET = {0: -0.01, 1: 0.0, 2: 0.01}  # zero mean over seeds: variant means are the designed values
# acc_per_char: monotone and ranking-consistent (A > B > C at every checkpoint) but ending at chance (mean 0.25)
ACC_AT_CHANCE = {"A": [0.10, 0.15, 0.20, 0.27], "B": [0.08, 0.13, 0.18, 0.25], "C": [0.06, 0.11, 0.16, 0.23]}
# gold_bpb (lower is better): falls at every checkpoint, A < B < C throughout
BPB_CLEAN = {"A": [3.0, 2.8, 2.6, 2.4], "B": [3.1, 2.9, 2.7, 2.5], "C": [3.2, 3.0, 2.8, 2.6]}
# correct_prob: jumps up and down; the order of the variants changes at every checkpoint
PROB_NOISY = {"A": [0.30, 0.20, 0.32, 0.22], "B": [0.25, 0.31, 0.21, 0.29], "C": [0.28, 0.24, 0.30, 0.20]}
# val loss: A < B < C by 0.01, the order gold_bpb gives (gold_bpb's tracking is checked against it: acc is at chance)
VAL = {v: [x + 0.01 * k for x in (5.0, 4.6, 4.3, 4.1)] for k, v in enumerate("ABC")}


def series(report, task, metric, group=-1):
    return next(s for s in report["groups"][group]["series"] if (s["task"], s["metric"]) == (task, metric))


def _mc_items(variant: str, seed: int, k: int, bpb: dict) -> list[dict]:
    off = SEED_OFFSET[seed]
    right = round((ACC_AT_CHANCE[variant][k] + off) * N)
    return [
        {
            "id": f"q{i}",
            "gold": 0,
            "acc_per_char": float(i < right),
            "acc_choices_only": float(i < 25),
            "gold_bpb": bpb[variant][k] + off + 0.02 * (i % 5 - 2),
            "correct_prob": PROB_NOISY[variant][k] + off / 2 + 0.01 * (i % 3 - 1),
        }
        for i in range(N)
    ]


def _mc_experiment(root, bpb: dict):
    for variant in ACC_AT_CHANCE:
        for seed in SEED_OFFSET:
            items = {step: _mc_items(variant, seed, k, bpb) for k, step in enumerate(STEPS)}
            write_run(
                root,
                variant,
                seed,
                STEPS,
                [v + SEED_OFFSET[seed] for v in VAL[variant]],
                {"mc": {"chance": 0.25, "primary": "acc_per_char", "items": items}},
            )
    return root


def test_continuous_metric_enters_the_decision_set_when_it_passes(tmp_path):
    """gold_bpb passes (monotone, consistent) and enters; acc_per_char is monotone and consistent too but at chance:
    it never counts, whatever its SNR; correct_prob is noise."""
    report = write_report(_mc_experiment(tmp_path / "clean", BPB_CLEAN), opts=FAST)
    rec = report["recommendation"]
    assert [(e["task"], e["metric"]) for e in rec["suite"] if e["task"] != "val_loss"] == [("mc:cf", "gold_bpb")]
    acc = series(report, "mc:cf", "acc_per_char")["quality"]
    assert acc["monotonicity"] == 1 and acc["ranking"]["tau_second_half"] == 1 and acc["snr"] is not None
    assert acc["chance"]["z_final"] == pytest.approx(0, abs=1e-9) and acc["criteria"]["above_chance"] is False
    assert not acc["passes"]
    bpb = series(report, "mc:cf", "gold_bpb")
    assert bpb["direction"] == "lower" and bpb["chance"] is None and "above_chance" not in bpb["quality"]["criteria"]
    assert bpb["quality"]["passes"] and bpb["best"] == "A"
    choice = next(c for c in rec["choices"] if c["task"] == "mc:cf")
    why = {o["metric"]: o["why"] for o in choice["others"]}
    assert why["acc_per_char"] == "at chance (z 0 < 2)"
    assert why["acc_choices_only"].startswith("a baseline")
    assert "not monotone" in why["correct_prob"] and "ranking not consistent" in why["correct_prob"]
    assert choice["text"].startswith("mc: gold_bpb (rho 1, SNR ")
    # the decision rests on it: A leads on gold_bpb, by the same difference on every item of every seed (no seed
    # spread, no item noise: not tested rather than p = 0)
    head = report["headline"]
    assert report["inference"]["metrics"] == [["val_loss", "loss"], ["mc:cf", "gold_bpb"]]
    decision = next(d for d in head["decisions"] if d["task"] == "mc:cf")
    assert decision["name"] == "mc [gold_bpb]" and decision["status"] == "not_tested" and decision["leader"] == "A"
    assert "mc [gold_bpb]: A ahead, not established" in head["text"]
    md = (tmp_path / "clean" / "report.md").read_text().replace("\\", "")
    assert "mc: gold_bpb (rho 1, SNR" in md and "acc_per_char: at chance (z 0 < 2)" in md


def test_noisy_continuous_metric_is_left_out(tmp_path):
    """The same experiment with gold_bpb as noisy as correct_prob: no metric of mc passes, mc has no signal."""
    report = build_report(_mc_experiment(tmp_path / "noisy", PROB_NOISY), FAST).to_json()
    rec = report["recommendation"]
    assert [e for e in rec["suite"] if e["task"] != "val_loss"] == []
    rejected = next(r for r in rec["rejected"] if r["task"] == "mc:cf")
    assert rejected["status"] == "no_signal"
    assert "not monotone" in rejected["reasons"]["gold_bpb"]
    assert report["headline"]["no_signal"] == ["mc"] and "mc: no signal here" in report["headline"]["text"]
    assert report["inference"]["metrics"] == [["val_loss", "loss"]]


def test_average_last_scores_the_mean_of_the_last_evaluations(tmp_path):
    """Runs whose last checkpoints jump: with --average-last 3 a run's score is the hand mean of its last 3
    evaluations, from per-item files (val loss) and from logged values alone (task t, its item files removed)."""
    root = tmp_path / "avg"
    val = {
        ("A", 0): [5.0, 4.2, 4.6, 4.0],
        ("A", 1): [5.0, 4.4, 4.1, 4.5],
        ("A", 2): [5.0, 4.3, 4.0, 4.2],
        ("B", 0): [5.1, 4.5, 4.2, 4.4],
        ("B", 1): [5.1, 4.3, 4.6, 4.2],
        ("B", 2): [5.1, 4.4, 4.4, 4.3],
    }
    acc = {
        ("A", 0): [30, 50, 40, 60],
        ("A", 1): [30, 45, 55, 44],
        ("A", 2): [30, 52, 47, 49],
        ("B", 0): [30, 40, 48, 41],
        ("B", 1): [30, 46, 39, 50],
        ("B", 2): [30, 42, 45, 44],
    }
    for (variant, seed), losses in val.items():
        items = {
            step: [{"id": i, "gold": 0, "acc_raw": float(i < acc[variant, seed][k])} for i in range(N)]
            for k, step in enumerate(STEPS)
        }
        run = write_run(
            root, variant, seed, STEPS, losses, {"t": {"chance": 0.25, "primary": "acc_raw", "items": items}}
        )
        for path in run.glob("eval_items/*/t_cf.jsonl"):
            path.unlink()
    report = write_report(root, opts=Options(bootstrap=200, average_last=3))
    v = series(report, "val_loss", "loss")
    for variant in ("A", "B"):
        hand = [np.mean(val[variant, s][-3:]) for s in (0, 1, 2)]
        assert v["final"][variant]["values"] == pytest.approx(hand)
        assert v["final"][variant]["mean"] == pytest.approx(np.mean(hand))
        assert v["final"][variant]["averaged"] == [3] * 3
        t = series(report, "t:cf", "acc_raw")
        assert not t["has_items"]
        assert t["final"][variant]["values"] == pytest.approx([np.mean(acc[variant, s][-3:]) / N for s in (0, 1, 2)])
    assert v["has_items"] and v["final"]["A"]["ci"] is not None
    plain = build_report(root, Options(bootstrap=200)).to_json()  # without: the last evaluation alone
    assert series(plain, "val_loss", "loss")["final"]["A"]["values"] == pytest.approx([4.0, 4.5, 4.2])
    assert report["headline"]["text"].endswith("Each run's score: the mean of its last 3 evaluations.")
    assert "Each run's score" not in plain["headline"]["text"]
    md = (root / "report.md").read_text()
    assert "--average-last 3" in md.replace("\\", "") and "Averaged: each run's score is the mean of its last 3" in md
    bad = cli_in_process("report", str(root), "--average-last", "0", check=False)
    assert bad.returncode == 2 and "--average-last 0: allowed: a whole number >= 1" in bad.stderr


# ---- across scales: SNR and decision accuracy with a bootstrap CI over seeds ------------------------------------

LADDER_VAL = {
    16: {"x": 5.2, "y": 5.0, "z": 5.4},
    32: {"x": 4.0, "y": 4.2, "z": 4.4},
    64: {"x": 3.0, "y": 3.2, "z": 3.4},
}
# gold_bpb per seed: at 32, y's seeds average exactly z's (a tie: one half) and spread so that a resample can order
# them either way; at 16 and 64 the order is x < y < z
LADDER_BPB = {
    16: {"x": [0.6] * 3, "y": [0.8] * 3, "z": [0.9] * 3},
    32: {"x": [0.5] * 3, "y": [1.0, 1.0, 1.3], "z": [1.1] * 3},
    64: {"x": [0.4] * 3, "y": [0.5] * 3, "z": [0.6] * 3},
}


LR = {"x": 1e-3, "y": 2e-3, "z": 3e-3, "A": 1e-3, "B": 2e-3}  # what sets the methods apart in their configs


def _ladder(root):
    for d_model in (64, 16, 32):
        for method in ("x", "y", "z"):
            for seed in (0, 1, 2):
                loss = LADDER_VAL[d_model][method] + SEED_OFFSET[seed]
                bpb = LADDER_BPB[d_model][method][seed]
                items = {
                    step: [{"id": i, "gold": 0, "gold_bpb": bpb + 0.3 * (3 - k)} for i in range(20)]
                    for k, step in enumerate(STEPS)
                }
                write_run(
                    root,
                    f"{method}@d{d_model}",
                    seed,
                    STEPS,
                    [loss + 0.6, loss + 0.4, loss + 0.2, loss],
                    {"lad": {"chance": 0.25, "primary": "gold_bpb", "items": items}},
                    config_extra={"model.d_model": d_model, "optim.lr": LR[method]},
                )
    return root


def test_decision_accuracy_with_bootstrap_ci_across_scales(tmp_path):
    """Known answers: val loss orders x < y < z at 32 and 64 (DA 1) but y < x at 16 (DA 2/3); gold_bpb at 32 ties y
    and z (DA (1 + 1 + 1/2) / 3). At 3 seeds the 95% interval of DA (seeds and items resampled) covered the true DA
    in at least 90% of constructed ladders (report/stats/da.py), so it is shown: the items of a run are all alike here
    and the seed offsets shared, so only gold_bpb at 32 (y's seeds spread across z) has an interval wider than a
    point."""
    report = write_report(_ladder(tmp_path / "ladder"), opts=Options(bootstrap=2000, scale=["model.d_model"]))
    assert [g["scale"] for g in report["groups"]] == [16, 32, 64]
    across = {(a["task"], a["metric"]): a for a in report["across_scales"]}
    assert list(across)[0] == ("val_loss", "loss")
    val = {r["scale"]: r for r in across["val_loss", "loss"]["by_scale"]}
    assert val[32]["decision_accuracy"] == 1 and val[32]["ci"] == [1, 1] and val[32]["ci_note"] is None
    assert val[32]["item_noise"] == "per-item files" and val[32]["coverage"] == da.COVERAGE[3] >= da.MIN_COVERAGE
    assert val[32]["tau"] == 1
    assert val[16]["decision_accuracy"] == pytest.approx(2 / 3) and val[16]["ci"] == pytest.approx([2 / 3, 2 / 3])
    assert across["val_loss", "loss"]["mean_decision_accuracy"] == pytest.approx(5 / 6)
    # SNR at 32: range of the finals 0.4 over each run's sd (ddof 1) of its last 3 checkpoints (0.4, 0.2, 0)
    assert val[32]["snr"] == pytest.approx(0.4 / np.std([0.4, 0.2, 0.0], ddof=1))
    bpb = {r["scale"]: r for r in across["lad:cf", "gold_bpb"]["by_scale"]}
    assert bpb[16]["decision_accuracy"] == 1 and bpb[16]["ci"] == [1, 1] and bpb[16]["paired"]
    assert bpb[32]["ci"] == pytest.approx([2 / 3, 1])  # y's resampled seeds order it either side of z
    assert bpb[32]["decision_accuracy"] == pytest.approx(5 / 6) and bpb[32]["self_agreement"] == pytest.approx(5 / 6)
    assert bpb[32]["seeds"] == 3 and bpb[32]["variants"] == ["x", "y", "z"]
    md = (tmp_path / "ladder" / "report.md").read_text()
    assert "## Which signal to trust at which scale" in md
    row = next(line for line in md.replace("\\", "").splitlines() if line.startswith("| lad:cf | gold_bpb (primary)"))
    assert "| 1 | 1 [1, 1] | 1 | 1 | 2 | 0.833 [0.6667, 1] | 0.833 | 0.833 |" in row
    # the scale axis ranks the candidates by decision accuracy first: gold_bpb is lad's only metric and passes
    choice = next(c for c in report["recommendation"]["choices"] if c["task"] == "lad:cf")
    assert choice["metric"] == "gold_bpb" and choice["figures"]["decision_accuracy"] == pytest.approx(11 / 12)
    assert "DA 0.917 from smaller scales" in choice["text"]


# ---- MMLU-like groups and the subject SNR floor --------------------------------------------------------------

GROUP_SIZES = {"g1": 10, "g2": 20, "g3": 10}  # unequal: the macro average differs from the mean over items


def _group_value(d_model, variant, group, seed, k):
    """correct_prob of every item of a group. g1, g2: A above B by 0.1, rising. g3 at d_model 16: A and B end level
    and jump between checkpoints (SNR 0); at 32 g3 separates them widely (it is still left out: chosen at 16)."""
    base = 0.2 + 0.05 * k + 0.01 * (seed - 1)
    if group != "g3":
        return base + (0.1 if variant == "A" else 0.0) + (0.05 if group == "g2" else 0.0)
    if d_model == 16:
        return 0.3 + (0.05 if (k + (variant == "A")) % 2 else -0.05) * (k < 3)
    return base + (0.3 if variant == "A" else 0.0)


def _grouped(root):
    for d_model in (16, 32):
        for variant in ("A", "B"):
            for seed in (0, 1, 2):
                items = {
                    step: [
                        {
                            "id": f"{g}-{i}",
                            "gold": 0,
                            "group": g,
                            "correct_prob": _group_value(d_model, variant, g, seed, k),
                        }
                        for g, n in GROUP_SIZES.items()
                        for i in range(n)
                    ]
                    for k, step in enumerate(STEPS)
                }
                write_run(
                    root,
                    f"{variant}@d{d_model}",
                    seed,
                    STEPS,
                    [4.0, 3.8, 3.6, 3.4],
                    {"mm": {"chance": 0.25, "primary": "correct_prob", "items": items}},
                    config_extra={"model.d_model": d_model, "optim.lr": LR[variant]},
                )
    return root


def test_the_subject_floor_returns_new_runs_and_tasks_and_leaves_its_inputs_as_they_were(tmp_path):
    from ablate.report.inputs.runs import group_by_scale, load_runs, task_infos
    from ablate.report.sections.signal.subjects import apply_floor

    runs, _ = load_runs(_grouped(tmp_path / "groups"))
    tasks, scales = task_infos(runs), group_by_scale(runs, ["model.d_model"])
    key = ("mm:cf", "correct_prob")
    before = {r.label: [(p.value, p.stderr) for p in r.scores[key]] for r in runs}
    (entry,), floored, kept = apply_floor(scales, tasks, Options(subject_snr_floor=1.0))
    assert entry.dropped == ["g3"] and kept["mm:cf"].kept_groups == {"correct_prob": {"g1", "g2"}}
    assert tasks["mm:cf"].kept_groups == {}  # the caller's tasks and runs as they were
    assert {r.label: [(p.value, p.stderr) for p in r.scores[key]] for r in runs} == before
    new = {r.label: r for _, by_variant in floored for rs in by_variant.values() for r in rs}
    assert all(new[label].scores[key][-1].value != values[-1][0] for label, values in before.items())


def test_grouped_task_is_macro_averaged_and_the_subject_floor_names_what_it_leaves_out(tmp_path):
    root = _grouped(tmp_path / "groups")
    plain = build_report(root, Options(bootstrap=100, scale=["model.d_model"])).to_json()
    mm = series(plain, "mm:cf", "correct_prob")
    hand = lambda keep, seed: np.mean([_group_value(32, "A", g, seed, 3) for g in keep])  # noqa: E731
    assert mm["has_items"] and mm["final"]["A"]["values"] == pytest.approx([hand(GROUP_SIZES, s) for s in (0, 1, 2)])
    assert plain["subject_floor"] == []

    report = write_report(root, opts=Options(bootstrap=100, scale=["model.d_model"], subject_snr_floor=1.0))
    (entry,) = report["subject_floor"]
    assert entry["task"] == "mm:cf" and entry["dropped"] == ["g3"] and entry["kept"] == 2 and entry["groups"] == 3
    assert entry["chosen_at"] == [16] and not entry["in_sample"] and entry["snr"]["g3"] == 0
    assert entry["snr"]["g1"] > 1
    for group in (0, -1):  # applied at every scale
        kept = series(report, "mm:cf", "correct_prob", group)
        d_model = report["groups"][group]["scale"]
        want = [np.mean([_group_value(d_model, "A", g, s, 3) for g in ("g1", "g2")]) for s in (0, 1, 2)]
        assert kept["has_items"] and kept["final"]["A"]["values"] == pytest.approx(want)
        assert kept["final"]["A"]["n_items"] == 30  # g1 and g2's items
        # the logged average, refiltered to the kept groups
        assert kept["runs"][f"A@d{d_model}/seed0"]["values"][-1] == pytest.approx(want[0])
    md = (root / "report.md").read_text().replace("\\", "")
    assert "Groups left out (subject SNR floor)" in md and "mm:cf [correct_prob]: 1 of 3 left out: g3" in md
    assert "chosen on the smaller scales (16) only" in md
    bad = cli_in_process("report", str(root), "--subject-snr-floor", "0", check=False)
    assert bad.returncode == 2 and "--subject-snr-floor 0: allowed: a number > 0" in bad.stderr


def test_report_json_round_trip_with_new_sections(tmp_path):
    report = write_report(_ladder(tmp_path / "l2"), opts=Options(bootstrap=100, scale=["model.d_model"]))
    assert json.loads((tmp_path / "l2" / "report.json").read_text()) == report
    assert "Which signal to trust at which scale" in (tmp_path / "l2" / "report.html").read_text()
