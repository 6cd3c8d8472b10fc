"""A sweep's start: the peak FLOP/s of the slots' thread count is measured by the parent before its workers start
(two workers measuring at once would each see half the machine, and that low figure would be kept). CPU, seconds."""

import json

import torch

from ablate.launch import sweep
from ablate.setup.checks import check_run
from test_sweep import tiny


def test_the_parent_measures_the_peak_of_the_slots_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    sweep._measure_cpu_peaks([check_run(tiny(**{"train.peak_flops": None})), check_run(tiny())], 1)  # tiny: a peak
    kept = json.loads((tmp_path / "peak_flops.json").read_text())
    assert [key.split("|")[-2:] for key in kept] == [["threads=1", "float32"]] and list(kept.values())[0] > 0
    assert torch.get_num_threads() == threads  # the parent's own thread count is left as it was


def test_a_run_that_gives_its_peak_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    sweep._measure_cpu_peaks([check_run(tiny())], 1)  # train.peak_flops=1e11
    assert not (tmp_path / "peak_flops.json").exists()
