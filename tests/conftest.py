import contextlib
import io
import os
import random
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "experiments" / "tiny.py"

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: N workers share the cores, one thread each (and children)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Ctrl-C is tested (a run's CtrlC, `ablate run`'s exit 130): a suite started ignoring SIGINT (nohup, `cmd &` without
# job control) would pass that on to every run and child it starts, and CtrlC keeps an ignored Ctrl-C ignored
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Tests marked gpu skip, saying why, where no CUDA device is visible."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not torch.cuda.is_available():
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


def _pin_to_cpu(patch: pytest.MonkeyPatch) -> None:
    """No GPU for this process (torch.cuda says none) nor for the processes it starts (CUDA_VISIBLE_DEVICES="", which
    run_cli and torchrun pass on): on a GPU host, train.device=auto and torchrun's ranks would otherwise take GPUs."""
    patch.setenv("CUDA_VISIBLE_DEVICES", "")
    patch.setattr(torch.cuda, "is_available", lambda: False)
    patch.setattr(torch.cuda, "device_count", lambda: 0)


def _module_has_gpu_tests(request) -> bool:
    in_module = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    return any(item.get_closest_marker("gpu") for item in in_module)


@pytest.fixture(scope="module", autouse=True)
def cpu_module(request):
    """A module without tests marked gpu runs on CPU whole, its module fixtures (runs trained once) included."""
    if _module_has_gpu_tests(request):
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        _pin_to_cpu(patch)
        yield


@pytest.fixture(autouse=True)
def cpu_test(request, monkeypatch):
    """In a module that has gpu tests, its other tests run on CPU (those marked gpu keep the GPU)."""
    if not request.node.get_closest_marker("gpu"):
        _pin_to_cpu(monkeypatch)


@pytest.fixture(scope="session", autouse=True)
def data_cache(tmp_path_factory):
    """One tokenizer/token cache for the whole session, never the user's ~/.cache."""
    path = tmp_path_factory.mktemp("ablate_cache")
    os.environ["ABLATE_CACHE"] = str(path)
    return path


def run_cli(*args, torchrun_procs: int = 0, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `python -m ablate ...` (or under torchrun) in a fresh process, as a user would."""
    if torchrun_procs:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={torchrun_procs}",
            "-m",
            "ablate",
            *args,
        ]
    else:
        cmd = [sys.executable, "-m", "ablate", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def cli_in_process(*args, check: bool = True) -> subprocess.CompletedProcess:
    """`ablate ...` called in this process (cwd the repo, as run_cli): the exit code, and what the command prints,
    as run_cli returns them, without a fresh interpreter's 1.5-2.5 s of imports. For refusals and quick commands;
    what only a real process shows (its exit status as the shell sees it, library warnings at import, environment
    variables read at start-up, signals, torchrun) takes run_cli."""
    from ablate.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _process_state_restored(), contextlib.chdir(REPO):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(arg) for arg in args])
            except SystemExit as exc:  # argparse: a refusal (2) or --help (0)
                code = exc.code
            if isinstance(code, str):  # sys.exit("message"), as the interpreter reports it
                print(code, file=sys.stderr)
                code = 1
    result = subprocess.CompletedProcess(["ablate", *map(str, args)], code or 0, out.getvalue(), err.getvalue())
    if check and result.returncode != 0:
        raise AssertionError(
            f"ablate {' '.join(result.args[1:])} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


@contextlib.contextmanager
def _process_state_restored():
    """What a command changes in its process and a fresh one would drop with it: training seeds the random
    generators; environment variables, torch threads and warning filters are kept too, so tests stay independent.
    (main installs no signal or logging handlers; `ablate run` destroys the process group it makes.)"""
    env, threads = dict(os.environ), torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for name in set(os.environ) - set(env):
            del os.environ[name]
        os.environ.update(env)
        torch.set_num_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def tiny_trainer(tmp_path, only: str = "mha", opened: bool = True, **fields):
    """The tiny experiment's Trainer at world size 1, on CPU unless `fields` say train.device, not logging,
    validating or checkpointing in its first steps; `fields`: config overrides ("train.max_steps": 5, ...).
    opened: ready to step (its channel open, begin() called), as fit() leaves it; False: as built, for fit()."""
    from ablate.setup.checks import check_run
    from ablate.setup.experiment import load_experiment
    from ablate.setup.overrides import apply_overrides
    from ablate.training.parallel import init_distributed
    from ablate.training.trainer import Trainer

    quiet = {"train.max_steps": 3, "train.log_every": 100, "train.val_every": 0, "train.ckpt_every": 0}
    run = load_experiment(TINY, only=[only])[0]
    run = apply_overrides(run, {**quiet, "train.device": "cpu", **fields})
    d = init_distributed(run.train.device)
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(check_run(run, d.world), run_dir, d)
    if opened:
        trainer.start_time = 0.0
        trainer.channel.open(0)  # as fit() starts training
        trainer.begin()
    return trainer


@pytest.fixture(scope="session")
def tokenizer():
    """A byte-level BPE of 300 tokens trained on ARC-Easy's questions: the eval tests' tokenizer."""
    import ablate_evals

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [r["question"] for r in ablate_evals.TASKS["arc_easy"].rows()]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return tok
