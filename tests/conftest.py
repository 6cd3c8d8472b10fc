import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "experiments" / "tiny.py"


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu skip, saying why, where no CUDA device is visible."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not torch.cuda.is_available():
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """One tokenizer/token cache for the whole session, never the user's ~/.cache."""
    path = tmp_path_factory.mktemp("ablate_cache")
    os.environ["ABLATE_CACHE"] = str(path)
    return path


def run_cli(*args, torchrun_procs: int = 0, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m ablate ...` (or under torchrun) in a fresh process, as a user would."""
    if torchrun_procs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun_procs}",
               "-m", "ablate", *args]
    else:
        cmd = [sys.executable, "-m", "ablate", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result
