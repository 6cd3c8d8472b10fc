"""What ablate's install puts in users' environments: its packages and two commands, and nothing that runs at
Python's start-up (no .pth file), built every way ablate gets built (a wheel from the tree, a wheel from the sdist)."""

import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow  # builds a wheel and an sdist

BUILD = """
import sys, setuptools.build_meta as backend
kind, out = sys.argv[1], sys.argv[2]
print(backend.build_sdist(out) if kind == "sdist" else backend.build_wheel(out))
"""


def build(source, kind: str, out) -> str:
    done = subprocess.run(
        [sys.executable, "-c", BUILD, kind, str(out)], cwd=source, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return str(out / done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the tree, so that builds leave the checkout alone."""
    copy = tmp_path_factory.mktemp("tree") / "ablate"
    shutil.copytree(
        REPO,
        copy,
        ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "runs"),
    )
    return copy


def _check_wheel(wheel: str) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith(".pth")], names  # nothing runs at users' start-up
    assert "ablate/kernels/__init__.py" in names and "ablate_evals/lm_eval_tasks/__init__.py" in names
    # every module of the tree ships (a package missing from pyproject's list once left out ablate/optim/)
    modules = {f"ablate/{p.relative_to(REPO / 'src' / 'ablate')}" for p in (REPO / "src" / "ablate").rglob("*.py")}
    assert not modules - set(names), sorted(modules - set(names))
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "ablate = ablate.cli:main" in entry_points and "ablate-lm-eval = ablate.cli.lm_eval:main" in entry_points


def test_wheel_and_sdist_carry_the_package_and_no_startup_hook(source, tmp_path):
    _check_wheel(build(source, "wheel", tmp_path))
    sdist = build(source, "sdist", tmp_path)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked = next((tmp_path / "unpacked").iterdir())
    (tmp_path / "from_sdist").mkdir()
    _check_wheel(build(unpacked, "wheel", tmp_path / "from_sdist"))
