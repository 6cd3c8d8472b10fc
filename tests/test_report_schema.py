"""report.json's schema (ablate.report.schema): every report of the constructed studies reads into the records and
writes back byte for byte; a key the schema lacks, or one it needs, fails naming the key and the record; the docs'
table of every figure is the one the records render."""

import dataclasses
import json

import numpy as np
import pytest

from ablate.report import Options, build_report
from ablate.report.sections.sequential.rule import DecisionRule
from ablate.report.options import Options as OptionsClass, recorded
from ablate.report.schema import Report, SchemaError
from ablate.report.schema import table
from ablate.report.text.render import to_json
from report_fixtures import build_grid_experiment, build_toy_experiment
from test_report_decisions import _tokenizer_runs
from test_report_multipliers import _write_ladder
from test_report_sequential import _write_study
from test_report_signal import _grouped, _ladder
from test_sequential import three_variant_study

FAST = Options(bootstrap=0)
SCALED = Options(bootstrap=100, scale=["model.d_model"])


def _sequential(root):
    seeds = {"baseline": 6, "slow": 3, "twin": 6}
    three_variant_study(root, seeds)
    _write_study(root, DecisionRule(margins={"val_loss": 0.01}, max_seeds=6), seeds, changed_after=True)
    return root


def _tokenizers(root):
    _tokenizer_runs(root, {"A": "text-1", "B": "text-1"})
    return root


def _batches(root):
    """Five batch sizes at one LR: B_crit is fitted, with its bootstrap interval."""
    return build_grid_experiment(root, lrs=(3e-3,), batches=(4, 8, 16, 32, 64), steps=tuple(range(5, 405, 5)))


def _multipliers(root):
    return _write_ladder(root, {"fast": 1.3, "huge": 5.0}, rungs=(32, 64, 128))


LADDER = Options(scale=["model.d_model"], baseline="baseline", bootstrap=100, multiplier_target=1e14)

# name -> (build the run folders under a path, the options): between them every record of the schema
STUDIES = {
    "toy": (build_toy_experiment, FAST),
    "grid": (build_grid_experiment, Options(bootstrap=100)),
    "grid_sizes": (lambda root: build_grid_experiment(root, batches=(16,), sizes=(16, 32, 64, 128)), FAST),
    "grid_batches": (_batches, Options(bootstrap=100)),
    "toy_min_snr": (build_toy_experiment, Options(bootstrap=0, min_snr=5.0)),
    "sequential": (_sequential, FAST),
    "ladder": (_ladder, SCALED),
    "grouped": (_grouped, Options(bootstrap=100, scale=["model.d_model"], subject_snr_floor=1.0)),
    "tokenizers": (_tokenizers, FAST),
    "multipliers": (_multipliers, LADDER),
    "compute_points_without_baseline": (_multipliers, dataclasses.replace(LADDER, baseline=None)),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """name -> the report as build_report returns it (built on first use)."""
    built = {}

    def get(name):
        if name not in built:
            build, opts = STUDIES[name]
            built[name] = build_report(build(tmp_path_factory.mktemp(name) / name), opts).to_json()
        return built[name]

    return get


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_the_records_write_back_every_report_byte_for_byte(reports, name):
    report = reports(name)
    text = to_json(report)  # what write_report writes
    assert to_json(Report.from_json(report).to_json()) == text
    read_back = json.loads(text)  # as report.json is read (what the markdown and HTML are rendered from)
    assert to_json(Report.from_json(read_back).to_json()) == text


def test_the_studies_reach_the_optional_sections(reports):
    assert reports("sequential")["sequential"]["rule_changed_after_results"]
    assert reports("grid")["sweep"]["batch"] and reports("grid_sizes")["sweep"]["scale"]["fit"]
    assert "ci" in reports("grid_batches")["sweep"]["batch"][0]["targets"][0]["critical"]
    assert "snr" in reports("toy_min_snr")["groups"][-1]["series"][0]["quality"]["criteria"]
    assert reports("grouped")["subject_floor"] and reports("ladder")["across_scales"]
    assert reports("multipliers")["multipliers"]["projections"]
    assert any(r["kind"] == "frontier" for r in reports("multipliers")["multipliers"]["rows"])
    assert reports("compute_points_without_baseline")["multipliers"]["baseline"] is None


def _deep(report: dict) -> dict:
    return report["groups"][0]["series"][0]["quality"]


def test_a_key_the_schema_lacks_fails_naming_the_key_the_record_and_where(reports):
    report = json.loads(to_json(reports("toy")))
    _deep(report)["new_figure"] = 1.0
    with pytest.raises(SchemaError, match=r"groups\[0\]\.series\[0\]\.quality: Quality has no field 'new_figure'"):
        Report.from_json(report)
    with pytest.raises(SchemaError, match="Report has no field 'extra'"):
        Report.from_json(json.loads(to_json(reports("toy"))) | {"extra": 1})


def test_a_key_the_schema_needs_fails_when_missing(reports):
    report = json.loads(to_json(reports("toy")))
    del report["headline"]["decisions"][0]["leader"]
    with pytest.raises(SchemaError, match=r"headline\.decisions\[0\]: Decision: missing key 'leader'"):
        Report.from_json(report)
    with pytest.raises(SchemaError, match=r"overview: Overview: expected an object, got list"):
        Report.from_json(json.loads(to_json(reports("toy"))) | {"overview": []})


def test_an_optional_key_is_left_out_again_not_written_as_null(reports):
    report = json.loads(to_json(reports("toy")))
    assert "snr" not in _deep(report)["criteria"]  # no --min-snr: the gate does not apply, the key is left out
    assert "snr" not in _deep(Report.from_json(report).to_json())["criteria"]
    assert "sequential" not in Report.from_json(report).to_json()["headline"]
    assert "sequential" in Report.from_json(reports("sequential")).to_json()["headline"]


def test_the_options_escape_holds_the_options_fields(reports):
    """report["options"] stays a dict (report/options.py declares its fields once): its keys are Options', --metric
    only where given (a report without it reads as before the option existed)."""
    names = [f.name for f in dataclasses.fields(OptionsClass)]
    assert list(reports("toy")["options"]) == [n for n in names if n != "metric"]
    assert list(recorded(OptionsClass(metric=["probe/acc"]))) == names


def test_every_record_is_reached_from_the_report_and_has_its_docs():
    found = table.records()
    assert len(found) == len({cls.__name__ for cls in found})  # one name, one record
    for cls in found:
        assert cls.__doc__, cls.__name__
        assert all(f.doc for f in table.specs(cls)), cls.__name__


def test_the_docs_table_is_generated_from_the_schema():
    assert table.between_markers(table.DOCS.read_text()) == table.render().strip("\n"), (
        "docs/reports.md's table of report.json is out of date: python -m ablate.report.schema.table"
    )


def test_numbers_that_are_not_finite_pass_through_to_the_writer(reports):
    """The records keep values as they are: the writer (to_json) turns non-finite floats into null, as before."""
    report = reports("toy") | {"seconds": float("nan")}
    assert np.isnan(Report.from_json(report).seconds)
    assert json.loads(to_json(Report.from_json(report).to_json()))["seconds"] is None
