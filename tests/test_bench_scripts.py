"""Every scripts/bench_*.py runs at its --smoke size and prints its ratio line: a renamed field or a changed API
breaks this test, not a user's benchmark. Nothing about the figures is asserted (the machine may be busy)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, TINY, run_cli

pytestmark = pytest.mark.slow  # each starts processes, and most train

# script -> (arguments after --smoke, with RUN for a trained run folder; the label of its ratio line)
SCRIPTS = {
    "bench_eval": (["RUN", "--tasks", "copa,lambada"], "ratio time lm-eval hf, batch 32 / ablate engine"),
    "bench_eval_cost": (
        ["RUN", "--tasks", "copa,lambada"],
        "ratio in-training evaluation/training time, 1 evaluation(s) per run",
    ),
    "bench_kernels": ([], "ratio peak memory chunked/naive"),
    "bench_nanogpt": ([], "ratio step time nanoGPT-style / ablate, bf16"),
    "bench_plan": ([], "ratio estimate/measured furthest from 1, of 1 rows"),
    "bench_sweep": ([], "ratio wall time --jobs 1 / --jobs 2"),
    "bench_train": ([], "ratio tokens/s bf16 / fp32"),
}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """One variant of the tiny experiment, 8 steps: what the eval benchmarks load."""
    out = tmp_path_factory.mktemp("bench")
    run_cli("run", str(TINY), "--only", "mha", "--out", str(out))
    return out / "tiny" / "mha" / "seed0"


def test_every_bench_script_is_covered():
    assert sorted(SCRIPTS) == sorted(p.stem for p in (REPO / "scripts").glob("bench_*.py"))


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_smoke_run_prints_its_ratio_line(script, request):
    extra, label = SCRIPTS[script]
    if "RUN" in extra:
        run = str(request.getfixturevalue("run_folder"))
        extra = [run if arg == "RUN" else arg for arg in extra]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / f"{script}.py"), "--smoke", *extra],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    shown = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 0, shown
    assert re.search(rf"^{re.escape(label)}: \d+\.\d+x", result.stdout, re.MULTILINE), shown
