"""The installed package carries `ablate_lm_eval_plugin.pth` to site-packages (for `lm_eval --model ablate`) in every
way ablate gets built: a wheel from the tree, a wheel from the sdist, and editable installs (lenient and strict)."""
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import REPO

PTH = "ablate_lm_eval_plugin.pth"
BUILD = """
import sys, setuptools.build_meta as backend
kind, out = sys.argv[1], sys.argv[2]
if kind == "sdist":
    print(backend.build_sdist(out))
elif kind == "wheel":
    print(backend.build_wheel(out))
else:
    print(backend.build_editable(out, {"editable_mode": kind}))
"""


def build(source, kind: str, out) -> str:
    done = subprocess.run([sys.executable, "-c", BUILD, kind, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(out / done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of the tree, so that builds leave the checkout alone."""
    copy = tmp_path_factory.mktemp("tree") / "ablate"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                              ".pytest_cache", "runs"))
    return copy


def test_wheel_and_sdist_carry_the_pth(source, tmp_path):
    wheel = build(source, "wheel", tmp_path)
    assert PTH in zipfile.ZipFile(wheel).namelist() and "_ablate_lm_eval_plugin.py" in zipfile.ZipFile(wheel).namelist()
    sdist = build(source, "sdist", tmp_path)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked = next((tmp_path / "unpacked").iterdir())
    (tmp_path / "from_sdist").mkdir()
    assert PTH in zipfile.ZipFile(build(unpacked, "wheel", tmp_path / "from_sdist")).namelist()


@pytest.mark.parametrize("mode", ["lenient", "strict"])
def test_editable_wheels_carry_the_pth(source, tmp_path, mode):
    assert PTH in zipfile.ZipFile(build(source, mode, tmp_path)).namelist()


def test_the_hook_registers_the_model_and_never_breaks_lm_eval(tmp_path):
    """With lm-eval's registry, importing lm_eval.models lists "ablate"; with an lm-eval that lacks it, the import
    still works and ablate only warns."""
    probe = ("import sys, warnings; sys.path.insert(0, sys.argv[1]); import _ablate_lm_eval_plugin\n"
             "with warnings.catch_warnings(record=True) as caught:\n"
             "    warnings.simplefilter('always')\n"
             "    import lm_eval.models\n"
             "from lm_eval.api import registry\n"
             "print(getattr(registry, 'model_registry', {}).get('ablate', None), len(caught))")
    real = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "nothing")], capture_output=True, text=True)
    assert real.returncode == 0 and "ablate.lm_eval_model.AblateLM" in real.stdout, real.stderr  # get() loads it
    assert real.stdout.split()[-1] == "0"
    fake = tmp_path / "old" / "lm_eval"  # an lm-eval before 0.4.10: MODEL_REGISTRY, no model_registry
    (fake / "models").mkdir(parents=True)
    (fake / "api").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "api" / "__init__.py").write_text("")
    (fake / "api" / "registry.py").write_text("MODEL_REGISTRY = {}\n")
    (fake / "models" / "__init__.py").write_text("from lm_eval.api.registry import MODEL_REGISTRY\n")
    old = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "old")], capture_output=True, text=True)
    assert old.returncode == 0 and old.stdout.split()[-2:] == ["None", "1"], old.stderr
