"""The report read in ten seconds: the verdict first (the winner and the pairs decided, or "no winner" and why), the
decisions table, the columns every run shares stated once, and the method once, folded away."""

import json
import re

import numpy as np
import pytest

from ablate.report import Options, write_report
from ablate.report.schema import Decision, OpenPair
from ablate.report.sections.decisions.verdict import verdict
from report_fixtures import build_toy_experiment, record_with
import test_report
from test_report_inference import _clear_effect_study

FAST = Options(bootstrap=0)
HEADER = ["metric", "status", "leader", "pairs decided", "closest open pair", "seeds needed"]
METHOD = "a paired t-test over the per-seed differences"  # a sentence of the method, said once
toy = test_report.toy  # the toy study's report (a module fixture: built once here)


def _markdown_table(md: str, header: list[str]) -> list[list[str]]:
    """The rows of the markdown table with this header."""
    lines = md.split("| " + " | ".join(header) + " |\n")[1].split("\n\n")[0].splitlines()[1:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


@pytest.fixture(scope="module")
def clear(tmp_path_factory):
    root = tmp_path_factory.mktemp("opening") / "clear"
    _clear_effect_study(root, np.random.default_rng(1))
    return root, write_report(root, opts=FAST)


def test_the_verdict_names_the_winner_and_the_pairs_decided(clear):
    root, report = clear
    head = report["headline"]
    assert (
        head["verdict"]
        == "Winner: B (best on val_loss, behind on none). Decided: B ahead of A, C, D, E, F on val_loss."
    )
    md = (root / "report.md").read_text()
    assert md.split("## Headline\n\n")[1].startswith(head["verdict"])  # first, before anything else
    assert _markdown_table(md, HEADER) == [["val_loss", "decided", "B", "B > A, C, D, E, F", "none", ""]]
    (row,) = head["decisions"]
    assert row["decided"] == [["B", o] for o in "ACDEF"] and row["closest_open"] is None
    assert head["notes"] == ["t0, t1, t2, t3, t4, t5: no signal here."]


def test_no_winner_says_why_and_the_table_gives_the_seeds_each_metric_needs(toy):
    root, report = toy
    head = report["headline"]
    assert head["verdict"] == "No winner: too few seeds to test a difference (2 per variant, 3 needed)."
    rows = _markdown_table((root / "report.md").read_text(), HEADER)
    assert rows == [
        ["val_loss", "too few seeds", "A", "none", "A vs B (not tested)", "3"],
        ["toy", "too few seeds", "A", "none", "A vs B (not tested)", "more items"],
    ]
    val = head["decisions"][0]["closest_open"]
    assert (val["a"], val["b"], val["untested"], val["seeds_needed"]) == ("A", "B", "seeds", 3)
    assert head["notes"] == ["flat: no signal here.", "1 run(s) unfinished or failed, left out: A/seed2."]
    assert "No winner established" in head["text"]  # the long headline stays in report.json and on the console


def _decision(name, status, leader, ahead_of=(), decided=(), closest=None, seeds=3):
    """A decision as the headline records it; what the verdict does not read is left None."""
    return record_with(
        Decision,
        name=name,
        status=status,
        leader=leader,
        ahead_of=list(ahead_of),
        decided=[list(p) for p in decided],
        closest_open=closest,
        seeds=seeds,
    )


def test_each_reason_for_no_winner_is_said():
    open_pair = record_with(OpenPair, a="A", b="B", testable=True, seeds_needed=8, seeds_needed_range=[7, 20])
    cases = [
        (
            [_decision("val_loss", "best", "A", "B", [("A", "B")]), _decision("toy", "best", "B", "A", [("B", "A")])],
            {},
            "No winner: A best on val_loss, B best on toy. Decided: A ahead of B on val_loss; B ahead of A on toy.",
        ),
        (
            [_decision("val_loss", "best", "A", "B", [("A", "B")]), _decision("toy", "ahead", "B", "A", [("B", "A")])],
            {},
            "No winner: A best on val_loss, but behind on toy. Decided: A ahead of B on val_loss; B ahead of A on toy.",
        ),
        (
            [_decision("val_loss", "best", "A", "B", [("A", "B")])],
            {"A": "1 of 3 seeds diverged"},
            "No winner: A best on val_loss, but 1 of 3 seeds diverged: never named winner. Decided: A ahead of B "
            "on val_loss.",
        ),
        (
            [_decision("val_loss", "no_difference", "A", closest=open_pair)],
            {},
            "No winner: no decision metric separates its leader from every other variant (closest open pair: A vs B "
            "on val_loss, ~8 seeds needed).",
        ),
        ([], {}, "No winner: no decision metric to compare on."),
    ]
    for decisions, failed, said in cases:
        assert verdict(decisions, None, failed, 3) == said


def test_columns_every_run_shares_are_said_once_above_the_runs_table(tmp_path):
    root = build_toy_experiment(tmp_path / "same", unfinished=False)
    for summary in root.glob("*/seed*/summary.json"):  # every run: one tokenizer, the same figures
        held = json.loads(summary.read_text())
        held["tokenizer"] = {"fertility": 1.544, "bytes_per_token": 3.374}
        summary.write_text(json.dumps(held))
    write_report(root, opts=FAST)
    md = (root / "report.md").read_text()
    said = (
        "status finished, steps 40/40, tokens 4,000, params 12,345, wall time 12.5s, tokenizer bpe:512, "
        "val bpb n/a, fertility 1.544, bytes/token 3.374 for every run."
    )
    assert said in md.replace("\\", "")
    rows = _markdown_table(md, ["run", "final val loss"])  # what differs from run to run, and nothing else
    assert [r[0] for r in rows] == ["A/seed0", "A/seed1", "B/seed0", "B/seed1", "C/seed0", "C/seed1"]


def test_the_method_is_said_once_folded_away_and_md_follows_the_html_order(toy):
    root, _ = toy
    page, md = (root / "report.html").read_text(), (root / "report.md").read_text()
    assert page.count(METHOD) == 1 and md.count(METHOD) == 1
    folded = re.search(r"<details><summary>[^<]+</summary>(.*?)</details>", page, re.S)
    assert folded and METHOD in folded.group(1)
    final_scores = md.split("## Final scores")[1].split("\n## ")[0]
    assert METHOD not in final_scores and "Benjamini-Hochberg" not in final_scores
    headings = re.findall(r"^## (.+)$", md, re.M)
    assert headings == re.findall(r"<h2>(.+?)</h2>", page)
    assert headings[:3] == ["Headline", "Method", "Overview"]
    # the verdict, then the decisions table, before any other table
    assert page.index("class='headline'") < page.index("<table><caption>Decisions") < page.index("<caption>Runs")
