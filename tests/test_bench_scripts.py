"""Every scripts/bench_*.py runs at its --smoke size and prints its ratio line: a renamed field or a changed API
breaks this test, not a user's benchmark. Nothing about the figures is asserted (the machine may be busy)."""

import json
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
    "bench_cuda_graphs": (
        [],
        "ratio step time un-graphed / graphed, a stack of 2, quickstart, eager",
    ),  # after the lone one
    "bench_fixed_costs": (["--imports", "3"], "ratio fixed costs / wall time, stacks"),
    "bench_kernels": ([], "ratio peak memory chunked/naive"),
    "bench_stack_eval": ([], "ratio stacked / member-by-member requests a second, smoke K=2"),
    "bench_nanogpt": ([], "ratio tokens/s ablate / nanoGPT-style, smoke bf16"),
    "bench_plan": ([], "ratio estimate/measured furthest from 1, of 1 rows"),
    "bench_stack": ([], "ratio tokens/s stacked / one after another, K=2"),
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


def test_the_benchmark_judges_the_gpu_targets_from_its_figures(capsys):
    """The verdicts a GPU lease will print, from made-up figures (real ones need a GPU): the tokens/s ratio, MFU of
    the peak by name, and host syncs counted on non-logging steps only."""
    import torch

    sys.path.insert(0, str(REPO / "scripts"))
    import bench_nanogpt as bench

    def side(name, seconds, syncs):
        runner = type("Runner", (), {"tokens_per_step": 16 * 1024})()
        return bench.Side(name, runner, 0.0, 0, seconds=[seconds], syncs={False: syncs, True: [1]})

    gpu = bench.Settings(torch.device("cuda"), True, 3, 4, 4, judged=True, peaks={})
    flops = 6 * 124e6  # GPT-2 small's 6N: 546k tok/s is 41% of 989 TFLOP/s
    sides = [side("ablate", 0.030, [0, 0, 0]), side("nanoGPT-style", 0.032, [0, 0])]
    bench.judge_shape("gpt2", "GPT-2 small bf16", sides, flops, 989e12, "by name", gpu)
    said = capsys.readouterr().out
    assert "PASS  GPT-2 small bf16: ablate's tokens/s >= 1.0x the nanoGPT-style reference's" in said, said
    assert "FAIL  GPT-2 small bf16: ablate's MFU >= 45%: 41.1%" in said, said
    assert "PASS  GPT-2 small bf16: no host sync on a non-logging step: 0 in 3 steps" in said, said  # 1 on logging
    assert "ratio tokens/s ablate / nanoGPT-style, GPT-2 small bf16: 1.07x" in said, said
    bench.judge_shape("350M", "~350M bf16", [side("ablate", 0.08, [0, 1])], 6 * 350e6, 989e12, "by name", gpu)
    said = capsys.readouterr().out
    assert "PASS  ~350M bf16: ablate's MFU >= 40%" in said and "FAIL  ~350M bf16: no host sync" in said, said
    assert "ratio" not in said  # ablate alone: no reference to compare with


def test_every_stack_bench_row_of_the_lease_is_a_valid_run(monkeypatch):
    """Part 4's stack_bench rows (size, K, train.compile) each build a config that loads, checked here on CPU: a
    lease is too short to find a row refused (its compiled rows once passed train.compile='true', a string)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_stack
    import gpu_acceptance

    from ablate.setup.checks import check_run

    plans = gpu_acceptance.stack_bench_plans(smoke=False)
    assert {compile_setting for _, _, compile_setting in plans} == {"auto", True}
    for size, k, compile_setting in plans:
        monkeypatch.setattr(bench_stack, "COMPILE", compile_setting)
        run = bench_stack.run_config(size, "cpu", seed=k)
        assert run.train.compile == compile_setting and check_run(run).config.train.seed == k


def acceptance(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_acceptance.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_gpu_acceptance_names_its_checks_and_needs_a_gpu():
    listed = acceptance("--list")
    assert listed.returncode == 0, listed.stderr
    assert [f"part {n}:" in listed.stdout for n in range(1, 5)] == [True, True, True, True]
    targets = ("MFU >= 45%", ">= 40% at ~350M", ">= 1.0x the reference's", "no host sync", "time <= 1.0x", ">= 1.5x")
    assert all(target in listed.stdout for target in targets), listed.stdout
    plain = acceptance()  # tests not marked gpu see none (conftest), on a GPU host too
    assert plain.returncode == 2 and "needs a CUDA GPU" in plain.stderr, plain.stderr


def test_gpu_acceptance_cpu_smoke_runs_every_measurement(tmp_path):
    result = acceptance("--cpu-smoke", "--out", str(tmp_path), timeout=900)  # five parts, part 5 added
    shown = f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    assert result.returncode == 0, shown
    lines = ("bf16 peak:", "train ~10M bf16 torch:", "train ~350M bf16 triton:", "packing 2", "smoke bf16 ablate:")
    for line in (*lines, "smoke bf16 nanoGPT-style:", "head + loss peak memory", "step of GPT-2 small bf16 triton:"):
        assert re.search(rf"^INFO  {re.escape(line)}", result.stdout, re.MULTILINE), shown
    assert "best packing of ~10M runs" in result.stdout and "0 fail" in result.stdout, shown
    for line in ("stack of 2, quickstart, train.compile=auto", "the quickstart's 9 runs as 3 stacks"):
        assert re.search(rf"^INFO  {re.escape(line)}", result.stdout, re.MULTILINE), shown
    # each part streamed its log and kept its verdict lines, as a GPU run returns them
    for part in (1, 2, 3, 4):
        record = json.loads((tmp_path / f"part{part}.json").read_text())
        assert record["lines"] and all(line in result.stdout for line in record["lines"])
        assert "== part" in (tmp_path / f"part{part}.log").read_text()


def test_the_gpu_tier_has_25_tests_in_12_functions():
    """Issue 26's floor, counted where it collects (here; they skip without a GPU)."""
    files = ["tests/test_on_gpu.py", *(str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_gpu_*.py"))]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *files],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    items = [line for line in result.stdout.splitlines() if "::" in line]
    functions = {item.split("[")[0] for item in items}
    print(f"GPU tier: {len(items)} tests in {len(functions)} functions")
    assert len(items) >= 25 and len(functions) >= 12, result.stdout[-3000:]


def test_tests_not_marked_gpu_see_no_gpu():
    """conftest pins every module without gpu tests to CPU, module fixtures included (issue 26, 13)."""
    import torch

    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0


@pytest.mark.parametrize("args", [["--runs", "3"], ["--runs", "2"], ["--steps", "0"]])
def test_bench_sweep_refuses_a_count_it_cannot_split(args):
    """The sides alternate over two halves of the seeds at 2 learning rates: fewer than 4 runs, or an odd count,
    would be run as another count than printed. Refused by name before any run starts."""
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench_sweep.py"), *args], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 2 and f"{args[0]} {args[1]}:" in result.stderr, result.stderr
