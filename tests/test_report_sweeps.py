"""Sweep views: grid() records its axes; the fits recover known optima (LR, B_crit, B_opt/B_min, power law) from
synthetic data; write_report lays grid run folders out on their axes (report["sweep"], markdown, HTML)."""

import dataclasses
import json

import numpy as np
import pytest

from ablate.config import ConfigError, RunConfig, TrainConfig, validate
from ablate.report import write_report
from ablate.report.sections.sweep.fits import critical_batch, lr_optimum, power_law, wsd_batch
from ablate.setup.experiment import load_experiment
from ablate.setup.overrides import apply_overrides
from ablate.setup.variants import grid, variant
from ablate.training.run import train
from conftest import TINY
from report_fixtures import GRID_B_NOISE, GRID_LR_STAR, build_grid_experiment, build_toy_experiment


# ---------------------------------------------------------------------------------------------------------------
# grid() bookkeeping


def test_grid_records_axes_in_config_json_and_reads_them_back(tmp_path):
    base = load_experiment(TINY, only=["mha"])[0]
    base = dataclasses.replace(base, train=dataclasses.replace(base.train, max_steps=2, val_every=0, ckpt_every=0))
    runs = grid(base, {"optim.lr": [1e-3, 3e-3], "train.global_batch": [8]})
    assert [r.axes for r in runs] == [
        {"optim.lr": 1e-3, "train.global_batch": 8},
        {"optim.lr": 3e-3, "train.global_batch": 8},
    ]
    train(runs[1], out_root=str(tmp_path))
    held = json.loads(next(tmp_path.glob("*/lr=0.003,global_batch=8/seed0/config.json")).read_text())
    assert held["config"]["axes"] == {"optim.lr": 0.003, "train.global_batch": 8}
    assert RunConfig.from_dict(held["config"]) == runs[1]
    assert held["identity"] == dataclasses.replace(runs[1], axes={}).identity()  # bookkeeping, like the name


def test_axes_are_typed_validated_and_follow_overrides():
    runs = grid(RunConfig(), {"optim.lr": [1e-3, 1e-2]})
    moved = apply_overrides(runs[0], {"optim.lr": 5e-3})  # --set on an axis: the record follows the run
    assert moved.axes == {"optim.lr": 5e-3}
    assert variant(runs[0], "v").axes == {} and variant(runs[0], "v", axes={"optim.lr": 1e-3}).axes == {
        "optim.lr": 1e-3
    }
    with pytest.raises(ConfigError, match=r"axes\['optim.lr'\]: records 0.5 but the run has optim.lr=0.001"):
        validate(dataclasses.replace(runs[0], axes={"optim.lr": 0.5}))
    with pytest.raises(ConfigError, match=r"axes\['optim.rate'\]: not a config field"):
        validate(dataclasses.replace(runs[0], axes={"optim.rate": 1e-3}))
    with pytest.raises(ConfigError, match="run.axes: got"):
        validate(dataclasses.replace(runs[0], axes={"optim.lr": [1e-3]}))
    assert RunConfig.from_dict({"train": dataclasses.asdict(TrainConfig())}).axes == {}  # older config.json


# ---------------------------------------------------------------------------------------------------------------
# fits on synthetic data with known answers


def test_lr_optimum_recovers_a_known_optimum_with_a_covering_ci():
    rng = np.random.default_rng(0)
    lrs, lr_star = np.geomspace(1e-4, 1e-1, 7), 2e-3  # lr* between grid points
    values = [3.0 + 0.2 * (np.log10(lr) - np.log10(lr_star)) ** 2 + rng.normal(0, 0.003, 4) for lr in lrs]
    fit = lr_optimum(lrs, values, n_boot=1000)
    assert fit["status"] == "vertex" and abs(fit["lr_opt"] / lr_star - 1) < 0.10
    assert fit["ci"][0] <= lr_star <= fit["ci"][1] and fit["ci_share"] > 0.9
    lo, hi = fit["within"]  # fitted loss within 1%: 0.2 d^2 <= 0.03 -> d = 0.387 decades either side
    assert lo < lr_star < hi and abs(np.log10(hi / lo) / 2 - np.sqrt(0.01 * 3.0 / 0.2)) < 0.05


def test_lr_optimum_past_the_grid_is_a_bound_and_too_few_points_say_why():
    lrs = [1e-4, 3e-4, 1e-3]  # all below lr* = 3e-3: the loss still falls at the largest LR
    values = [[3.0 + 0.2 * (np.log10(lr) - np.log10(3e-3)) ** 2 + d for d in (-0.001, 0.001)] for lr in lrs]
    fit = lr_optimum(lrs, values, n_boot=100)
    assert fit["status"] == "at_least" and fit["bound_lr"] == pytest.approx(1e-3) and fit["lr_opt"] is None
    assert "largest" in fit["note"]
    short = lr_optimum(lrs[:2], values[:2])
    assert short["status"] == "too_few" and ">= 3" in short["note"]


def test_critical_batch_recovers_b_crit_from_the_hyperbola():
    rng = np.random.default_rng(0)
    b = np.array([1024, 2048, 4096, 8192, 16384, 32768.0])  # tokens per step
    s_min, b_crit = 1000.0, 8192.0
    s = s_min * (1 + b_crit / b) * (1 + rng.normal(0, 0.02, len(b)))  # (S/S_min - 1)(E/E_min - 1) = 1, E = B S
    fit = critical_batch(b, s)
    assert fit["status"] == "fit" and abs(fit["b_crit"] / b_crit - 1) < 0.10
    assert abs(fit["s_min"] / s_min - 1) < 0.10 and fit["rel_rmse"] < 0.05
    assert critical_batch(b[:2], s[:2])["status"] == "too_few"
    # bigger batches needing fewer tokens (the WSD crossing of seed 001) is no hyperbola
    assert critical_batch(b, 1e6 / b**1.2)["status"] == "no_tradeoff"


def test_wsd_batch_recovers_b_opt_and_b_min():
    rng = np.random.default_rng(0)
    s_opt, e_min, c = 3000.0, 3e7, 2.0  # quadratic stage C (S - S_opt)^2 + E_min, linear E = 5000 S + 1.5e7 after
    s = np.array([1500, 2200, 3000, 3900, 6000, 9000.0])
    e = np.where(s < 4500, c * (s - s_opt) ** 2 + e_min, 5000 * s + 1.5e7) * (1 + rng.normal(0, 0.003, len(s)))
    fit = wsd_batch(e / s, s)
    assert fit["status"] == "vertex" and abs(fit["b_opt"] / (e_min / s_opt) - 1) < 0.10
    assert abs(fit["b_min"] / 5000 - 1) < 0.10 and fit["linear"]["n"] == 2
    # fewest tokens at the smallest batch tried (the classic E(S)): B_opt is only bounded
    b = np.array([1024, 2048, 4096.0])
    edge = wsd_batch(b, 1000 * (1 + 8192 / b))
    assert edge["status"] == "at_most" and edge["bound_b"] == 1024 and edge["b_opt"] is None


class SyntheticWsd:
    """A WSD E(S) with known constants: 1/(S - S_min) up to S=2000, C (S - S_opt)^2 + E_min up to S=4500, then
    A1 S + A0, joined with equal values and slopes. B_opt = E_min / S_opt = 10000 tokens per step, B_min = A1 = 6000;
    the quadratic stage holds the batch sizes 7667 to 16000 (a factor 2.1)."""

    S_MIN, S1, S_OPT, S2, C, E_MIN = 1000.0, 2000.0, 3000.0, 4500.0, 2.0, 3e7
    A1 = 2 * C * (S2 - S_OPT)
    A0 = C * (S2 - S_OPT) ** 2 + E_MIN - A1 * S2
    D = 2 * C * (S_OPT - S1) * (S1 - S_MIN) ** 2
    F = C * (S1 - S_OPT) ** 2 + E_MIN - D / (S1 - S_MIN)

    def tokens(self, s: float) -> float:
        if s < self.S1:
            return self.D / (s - self.S_MIN) + self.F
        return self.C * (s - self.S_OPT) ** 2 + self.E_MIN if s <= self.S2 else self.A1 * s + self.A0

    def steps(self, b: float) -> float:
        """Where a run of b tokens per step (E = b S) reaches the loss: E(S) / S = b."""
        from scipy.optimize import brentq

        return brentq(lambda s: self.tokens(s) / s - b, self.S_MIN * (1 + 1e-9), 1e9)


def test_wsd_batch_is_exact_on_a_fine_grid_and_says_when_a_grid_is_too_coarse():
    curve = SyntheticWsd()
    b_opt = curve.E_MIN / curve.S_OPT
    fine = np.array([6500, 7000, 9000, 10000, 11000, 14000, 20000, 40000.0])  # 3 in the quadratic stage, 2 linear
    fit = wsd_batch(fine, [curve.steps(b) for b in fine])
    assert fit["status"] == "vertex" and fit["b_opt"] == pytest.approx(b_opt, rel=1e-9)
    assert fit["b_min"] == pytest.approx(curve.A1, rel=1e-9) and fit["window_span"] < 2
    assert "span a factor" not in fit["note"]
    coarse = 8000 * 2.0 ** np.arange(5)  # powers of 2: at most 2 of them in the quadratic stage
    fit = wsd_batch(coarse, [curve.steps(b) for b in coarse])
    print(f"powers-of-2 grid: B_opt {fit['b_opt']:.0f} for {b_opt:.0f} ({fit['b_opt'] / b_opt - 1:+.1%})")
    assert fit["status"] == "vertex" and fit["b_opt"] < 0.95 * b_opt  # biased low...
    assert fit["window_span"] == pytest.approx(4) and "span a factor 4" in fit["note"]  # ...and the report says so
    from ablate.report.schema.sweep import CriticalFit, WsdFit
    from ablate.report.sections.sweep.render import _notes

    critical = critical_batch(coarse, [curve.steps(b) for b in coarse])
    records = (
        CriticalFit.from_json({**critical, "b_crit_sequences": None}),
        WsdFit.from_json({**fit, "b_opt_sequences": None, "b_min_sequences": None, "bound_b_sequences": None}),
    )  # as the section hands them to the table (sequences aside)
    assert "span a factor 4" in _notes(*records)  # the table


def test_power_law_recovers_e_a_alpha_with_cis():
    rng = np.random.default_rng(0)
    n = np.geomspace(1e5, 1e7, 5)
    values = [2.0 + 50 * x**-0.3 + rng.normal(0, 0.002, 3) for x in n]
    fit = power_law(n, [v.mean() for v in values], values, n_boot=100)
    assert fit["status"] == "fit"
    assert abs(fit["alpha"] / 0.3 - 1) < 0.10 and abs(fit["E"] / 2.0 - 1) < 0.03 and abs(fit["A"] / 50 - 1) < 0.15
    assert fit["ci"]["alpha"][0] < fit["alpha"] < fit["ci"]["alpha"][1]
    assert power_law(n[:2], [1, 0.9])["status"] == "too_few"
    assert power_law(n, [1, 1.1, 1.2, 1.3, 1.4])["status"] == "not_decreasing"


# ---------------------------------------------------------------------------------------------------------------
# write_report on grid run folders


def test_write_report_on_a_3x2_grid(tmp_path):
    root = build_grid_experiment(tmp_path / "grid")  # lr {1e-3, 3e-3, 1e-2} x batch {16, 32} x seeds {0, 1}
    report = write_report(root, tmp_path / "out")
    sweep = report["sweep"]
    assert sweep["axes"] == ["optim.lr", "train.global_batch"] and len(sweep["cells"]) == 6
    # batch 32 takes twice the tokens per step: every cell is read where all runs are, at equal tokens
    assert sweep["metric"]["source"].endswith("(equal tokens)") and any("equal tokens" in n for n in sweep["notes"])
    hm = sweep["heatmap"]
    assert (hm["x"], hm["y"], hm["x_values"], hm["y_values"]) == (
        "optim.lr",
        "train.global_batch",
        [1e-3, 3e-3, 1e-2],
        [16, 32],
    )
    cell = next(c for c in sweep["cells"] if c["label"] == "lr=0.01,global_batch=32")
    assert hm["mean"][1][2] == pytest.approx(cell["mean"])
    assert hm["best"]["label"] == "lr=0.003,global_batch=16"  # at equal tokens, batch 32 has had half the steps
    for view in sweep["lr"]:  # one optimum per batch size, at the known 3e-3
        fit = view["fit"]
        assert fit["status"] == "vertex" and abs(fit["lr_opt"] / GRID_LR_STAR - 1) < 0.10
        # two seeds make a coarse bootstrap (three means per LR): near lr*, not a coverage test (that is above)
        assert 0.9 * GRID_LR_STAR < fit["ci"][0] <= fit["lr_opt"] <= fit["ci"][1] < 1.1 * GRID_LR_STAR
    batch = sweep["batch"][0]
    assert batch["batches"] == [16, 32] and batch["curve"] == "val_loss" and batch["targets"]
    assert all(t["critical"]["status"] == "too_few" for t in batch["targets"])  # two batch sizes: said, not fitted
    assert sweep["scale"] is None and any("model-size axis" in n for n in sweep["notes"])
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## Sweep" in markdown and "## Sweep: optimum LR" in markdown and "the fits need >= 3" in markdown
    html = (tmp_path / "out" / "report.html").read_text()
    section = html[html.index("<h2>Sweep</h2>") :]
    assert "Optimum LR" in section and section.count("data:image/png;base64,") >= 4  # heatmap, LR, curves, E-S


def test_batch_axis_recovers_b_crit_from_loss_curves(tmp_path):
    root = build_grid_experiment(
        tmp_path / "bs", lrs=(3e-3,), batches=(4, 8, 16, 32, 64), steps=tuple(range(5, 405, 5))
    )
    batch = write_report(root, tmp_path / "out")["sweep"]["batch"][0]
    fitted = [t["critical"] for t in batch["targets"] if t["critical"]["status"] == "fit"]
    assert len(fitted) >= 3
    for fit in fitted:  # B_crit in sequences: GRID_B_NOISE by construction of grid_loss
        assert abs(fit["b_crit_sequences"] / GRID_B_NOISE - 1) < 0.10
        assert fit["ci_sequences"][0] < fit["b_crit_sequences"] < fit["ci_sequences"][1]
    # the hyperbola's E grows with B: the fewest tokens at the smallest batch, so B_opt is bounded, not a vertex
    assert all(t["wsd"]["status"] in ("at_most", "too_few") for t in batch["targets"])
    assert all(t["minicpm"]["tokens"] == pytest.approx(1.2110e9 / t["loss"] ** 6.2393) for t in batch["targets"])


def test_model_size_axis_fits_a_power_law_and_ranks_lrs_across_sizes(tmp_path):
    root = build_grid_experiment(tmp_path / "size", lrs=(1e-3, 3e-3, 1e-2), batches=(16,), sizes=(16, 32, 64, 128))
    scale = write_report(root, tmp_path / "out")["sweep"]["scale"]
    assert [s["params"] for s in scale["sizes"]] == [48 * d**2 for d in (16, 32, 64, 128)]
    fit = scale["fit"]
    assert fit["status"] == "fit" and abs(fit["alpha"] / 0.3 - 1) < 0.15  # grid_loss: 40 N^-0.3 over a floor
    assert [d["decision_accuracy"] for d in scale["decision"]] == [1.0, 1.0, 1.0]  # LR order is size-free


def test_no_grid_no_sweep_section(tmp_path):
    report = write_report(build_toy_experiment(tmp_path / "toy"), tmp_path / "out")
    assert report["sweep"] is None and "Sweep" not in (tmp_path / "out" / "report.md").read_text()
