"""Decide on anything a run logs (`ablate report --metric KEY[:lower|higher]`, `--primary KEY`), and what each variant
changes (the config fields that differ from the base variant's), on constructed run folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ablate.report import Options, ReportError, build_report
from ablate.report.inputs.changes import field_changes
from conftest import run_cli
from report_fixtures import STEPS, write_run

VARIANTS = {"A": {"model.n_kv_heads": 4}, "B": {"model.n_kv_heads": 2}}


def _probe_study(root, effect: float, seeds: int = 4, rng_seed: int = 0):
    """A and B x `seeds` seeds, validation loss alike (seed noise only), and a callback's "probe/acc" in
    metrics.jsonl rising over training, B `effect` above A on every seed (seed sd 0.005)."""
    rng = np.random.default_rng(rng_seed)
    for variant, extra in VARIANTS.items():
        for seed in range(seeds):
            val = [v + rng.normal(0, 0.01) for v in (5.0, 4.5, 4.0, 3.8)]
            run = write_run(root, variant, seed, STEPS, val, {}, config_extra=extra, axes={"model.n_kv_heads": 0})
            lift = effect if variant == "B" else 0.0
            rows = [
                {"step": s, "tokens": s * 100, "probe/acc": 0.3 + 0.01 * s + lift + rng.normal(0, 0.005)} for s in STEPS
            ]
            with open(run / "metrics.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
    return root


def _decision(report, metric: str):
    return next(d for d in report.headline.decisions if d.metric == metric)


def _probe(report):
    return next(s for s in report.groups[-1].series if (s.task, s.metric) == ("logged", "probe/acc"))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return _probe_study(tmp_path_factory.mktemp("planted") / "probe", effect=0.1)


def test_a_logged_metric_is_decided_with_its_direction(planted):
    report = build_report(planted, Options(bootstrap=0, metric=["probe/acc:higher"]))
    d = _decision(report, "probe/acc")
    assert (d.task, d.name, d.direction, d.leader, d.status) == ("logged", "probe/acc", "higher", "B", "best")
    assert d.ahead_of == ["A"] and "probe/acc: B best" in report.headline.text
    (pair,) = _probe(report).pairwise
    assert pair.family == "tasks" and pair.significant and pair.n_seeds == 4  # tested over seeds, in the family
    assert ["logged", "probe/acc"] in report.inference.metrics and report.options["metric"] == ["probe/acc:higher"]
    final = _probe(report).final
    assert final["B"].steps == [40] * 4 == final["A"].steps  # at the step validation loss is compared at
    # lower is better unless said: the same runs then put A ahead
    lower = build_report(planted, Options(bootstrap=0, metric=["probe/acc"]))
    assert _decision(lower, "probe/acc").direction == "lower" and _decision(lower, "probe/acc").leader == "A"


def test_a_logged_metric_can_be_the_primary(planted):
    report = build_report(planted, Options(bootstrap=0, primary="probe/acc:higher"))
    families = {f.name: f for f in report.inference.families}
    assert families["primary"].metrics == [["logged", "probe/acc"]]
    assert ["val_loss", "loss"] in families["tasks"].metrics
    assert report.headline.decisions[0].name == "probe/acc" and report.headline.decisions[0].leader == "B"


def test_without_metric_every_logged_key_is_a_curve_and_nothing_more(planted):
    report = build_report(planted, Options(bootstrap=0))
    assert all(d.task != "logged" for d in report.headline.decisions) and "metric" not in report.options
    curves = {c.key: c.curve for c in report.groups[-1].logged}
    assert {"probe/acc", "lr", "grad_norm"} <= set(curves) and "loss" not in curves  # the loss is train_loss
    assert curves["probe/acc"]["B"].steps == STEPS and len(curves["probe/acc"]) == 2


def test_an_aa_study_decides_nothing_on_the_logged_metric(tmp_path):
    report = build_report(_probe_study(tmp_path / "aa", effect=0.0), Options(bootstrap=0, metric=["probe/acc:higher"]))
    d = _decision(report, "probe/acc")
    assert d.status == "no_difference" and d.ahead_of == [] and not any(p.significant for p in _probe(report).pairwise)
    assert report.headline.winner is None


def test_an_unknown_key_is_refused_before_any_figure(planted, tmp_path):
    with pytest.raises(ReportError, match=r"--metric probe/acx: no run logged 'probe/acx'.*grad_norm.*probe/acc"):
        build_report(planted, Options(bootstrap=0, metric=["probe/acc", "probe/acx"]))
    result = run_cli("report", str(planted), "--out", str(tmp_path), "--metric", "nope:higher", check=False)
    assert result.returncode == 2 and not (tmp_path / "report.json").exists()
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("ablate: error: --metric nope:higher: no run logged 'nope'") and "probe/acc" in line


def test_the_flag_is_repeatable_on_the_command_line(planted, tmp_path):
    run_cli("report", str(planted), "--out", str(tmp_path), "--bootstrap", "100", *("--metric", "probe/acc:higher"))
    report = json.loads((tmp_path / "report.json").read_text())
    run_cli("report", str(planted), "--out", str(tmp_path), *("--metric", "probe/acc:higher", "--metric", "lr"))
    again = json.loads((tmp_path / "report.json").read_text())
    assert report["options"]["metric"] == ["probe/acc:higher"] and again["options"]["metric"] == [
        "probe/acc:higher",
        "lr",
    ]
    assert [m for m in again["inference"]["metrics"] if m[0] == "logged"] == [["logged", "probe/acc"], ["logged", "lr"]]
    assert "probe/acc" in (tmp_path / "report.md").read_text()


def test_the_changes_list_exactly_the_differing_fields(planted):
    changes = build_report(planted, Options(bootstrap=0)).groups[-1].changes
    assert changes.base == "A" and list(changes.by_variant) == ["B"]
    (only,) = changes.by_variant["B"]  # name, train.seed, axes and experiment differ too: bookkeeping, left out
    assert (only.field, only.base, only.value, only.user_code) == ("model.n_kv_heads", 4, 2, False)
    against_b = build_report(planted, Options(bootstrap=0, baseline="B")).groups[-1].changes
    assert against_b.base == "B" and [(c.base, c.value) for c in against_b.by_variant["A"]] == [(2, 4)]


def test_a_user_component_is_named_and_its_digest_left_out():
    base = {"name": "a", "model": {"ffn": "swiglu", "d_model": 32}, "train": {"seed": 0}, "axes": {"x": 1}}
    mine = {
        "name": "b",
        "experiment": "e",
        "model": {"ffn": "relu2", "d_model": 32, "options": {"alpha": 2}},
        "train": {"seed": 1},
        "branch": {"parent_identity": "abc"},
        "user_code": {"ffn:relu2": "0123456789ab"},
        "axes": {"x": 2},
    }
    found = [(c.field, c.base, c.value, c.user_code) for c in field_changes(base, mine)]
    assert found == [("model.ffn", "swiglu", "relu2", True), ("model.options.alpha", None, 2, False)]
    assert field_changes(mine, base)[0].user_code is False  # the value the base names: not the variant's code


def test_the_runs_section_says_what_each_variant_changes(planted, tmp_path):
    run_cli("report", str(planted), "--out", str(tmp_path), "--bootstrap", "100")
    md = (tmp_path / "report.md").read_text()
    assert "**What each variant changes from A**" in md and "| B | model.n_kv_heads: 4 -> 2 |" in md
    assert "model.n_kv_heads: 4 -&gt; 2" in (tmp_path / "report.html").read_text()
