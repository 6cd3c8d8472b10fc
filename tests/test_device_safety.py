"""What a run meets between machines and runs, tested without a GPU: a checkpoint written with CUDA resumed
without it and the reverse (the CUDA side simulated), each run's own memory peak when runs follow one another in
one process, and stability monitors whose CUDA path takes a few kernels and host reads whatever the model's size."""

import importlib
import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate import checkpoint_files
from ablate.config import ModelConfig
from ablate.model import Transformer
from ablate.setup.experiment import load_experiment
from ablate.training import checkpoint
from ablate.training.callbacks import metrics
from ablate.training.callbacks import Callback
from ablate.training.callbacks.metrics import peak_memory_bytes, reset_peak_memory
from ablate.training.callbacks.stability import StabilityMonitors, parameter_groups, snapshot, squared_norms
from ablate.training.parallel import init_distributed
from conftest import TINY

train_module = importlib.import_module("ablate.training.run")  # `from ablate import train` is the function
FAKE_CUDA_RNG = torch.arange(16, dtype=torch.uint8)  # the shape of a CUDA generator's state: seed and offset


def with_cuda_rng() -> dict:
    """_rng_state on a machine with CUDA."""
    return {"torch": torch.get_rng_state(), "cuda": FAKE_CUDA_RNG}


# -- checkpoints between machines with and without CUDA ------------------------------------------------------------


def tiny_training_state():
    """A process group, a small model and an optimizer with state: what load_checkpoint restores."""
    d = init_distributed("cpu")
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return d, model, optimizer


def save(tmp_path, d, model, optimizer):
    return checkpoint.save_checkpoint(tmp_path, 1, model, optimizer, {"tokens": 0, "sampler": {}}, d, keep=3)


def saved_keys(ckpt) -> set[str]:
    return set(checkpoint_files.read_metadata(ckpt).state_dict_metadata)


class CudaHere:
    """Simulates a machine with CUDA for the checkpoint code: _rng_state holds a cuda entry, and the CUDA generator
    calls are recorded instead of made."""

    def __init__(self, monkeypatch):
        self.seeds, self.states = [], []
        monkeypatch.setattr(checkpoint, "_rng_state", with_cuda_rng)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "manual_seed", self.seeds.append)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.states.append)


def resume(ckpt_root, d, model, optimizer):
    """What a run's start does: the newest intact checkpoint restored, damaged ones set aside."""
    return checkpoint.restore_newest_intact(
        ckpt_root, lambda ckpt: checkpoint.load_checkpoint(ckpt, model, optimizer, d), d
    )


def test_a_checkpoint_written_without_cuda_resumes_where_cuda_is(tmp_path, monkeypatch, capsys):
    d, model, optimizer = tiny_training_state()
    ckpt = save(tmp_path, d, model, optimizer)
    assert not any(".cuda" in key for key in saved_keys(ckpt))  # written here, without CUDA
    next_draw = torch.rand(3)
    cuda = CudaHere(monkeypatch)
    for _ in range(2):  # a resume, then the same checkpoint again (as a rollback would)
        torch.rand(100)
        assert resume(tmp_path, d, model, optimizer) == ckpt  # not set aside as damaged (the old failure)
        assert torch.equal(torch.rand(3), next_draw)  # the CPU generator restored
    assert cuda.states == []  # nothing to restore: the CUDA generator is seeded instead,
    assert len(cuda.seeds) == 2 and cuda.seeds[0] == cuda.seeds[1]  # the same way each time this checkpoint loads
    told = [line for line in capsys.readouterr().err.splitlines() if "holds no CUDA RNG state" in line]
    assert len(told) == 1  # said once


def test_a_checkpoint_written_with_cuda_resumes_on_cpu(tmp_path, monkeypatch):
    d, model, optimizer = tiny_training_state()
    with monkeypatch.context() as patched:  # the writer's machine had CUDA
        patched.setattr(checkpoint, "_rng_state", with_cuda_rng)
        ckpt = save(tmp_path, d, model, optimizer)
    assert "rng_rank0.cuda" in saved_keys(ckpt)
    next_draw = torch.rand(3)
    torch.rand(100)
    assert resume(tmp_path, d, model, optimizer) == ckpt
    assert torch.equal(torch.rand(3), next_draw)  # the CPU generator restored, the cuda entry ignored


def test_a_cuda_checkpoint_resumes_where_cuda_is(tmp_path, monkeypatch):
    d, model, optimizer = tiny_training_state()
    with monkeypatch.context() as patched:  # torch.cuda.is_available would send DCP's writer to CUDA streams
        patched.setattr(checkpoint, "_rng_state", with_cuda_rng)
        ckpt = save(tmp_path, d, model, optimizer)
    cuda = CudaHere(monkeypatch)
    assert resume(tmp_path, d, model, optimizer) == ckpt
    assert [state.tolist() for state in cuda.states] == [FAKE_CUDA_RNG.tolist()] and cuda.seeds == []


def test_a_checkpoint_of_another_world_size_restores_no_rng(tmp_path, monkeypatch):
    """Its rng_rank{r} entries belong to ranks of another run layout: none is asked for, none restored."""
    d, model, optimizer = tiny_training_state()
    ckpt = save(tmp_path, d, model, optimizer)
    meta = json.loads((ckpt / checkpoint_files.META).read_text())
    (ckpt / checkpoint_files.META).write_text(json.dumps({**meta, "world": 2}))
    cuda = CudaHere(monkeypatch)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    assert resume(tmp_path, d, model, optimizer) == ckpt
    assert torch.equal(torch.rand(3), expected)  # the generator as this run seeded it
    assert cuda.seeds == cuda.states == []


# -- each run's own memory peak --------------------------------------------------------------------------------------

BALLAST_BYTES = 400 * 2**20


class Ballast(Callback):
    """Holds BALLAST_BYTES of touched memory while its run trains: a run with a far higher peak than the next."""

    name = "ballast"

    def pre_train(self, trainer) -> None:
        self.held = torch.ones(BALLAST_BYTES // 4)

    def close(self) -> None:
        self.held = None


def test_cuda_peak_counters_are_reset_and_read_per_device(monkeypatch):
    reset, read = [], []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset.append)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: read.append(device) or 123)
    device = torch.device("cuda", 1)
    reset_peak_memory(device)
    assert peak_memory_bytes(device) == 123
    assert reset == read == [device]


def test_runs_one_after_another_in_one_process_report_their_own_peak(tmp_path, monkeypatch):
    """Two tiny runs in one process, as a sweep worker trains them: the peak is reset at each run's start, so the
    second run's summary does not carry the first one's ballast. Asserted: one reset per run, and (where Linux
    lets the process reset its peak resident set) the second peak well below the first."""
    resets = []

    def counted_reset(device):
        resets.append(device)
        metrics.reset_peak_memory(device)

    monkeypatch.setattr(train_module, "reset_peak_memory", counted_reset)
    mha, mqa = load_experiment(TINY, overrides={"train.max_steps": "2", "train.ckpt_every": "0"})
    heavy = train_module.train(mha, tmp_path, callbacks=[Ballast()])
    light = train_module.train(mqa, tmp_path)
    assert len(resets) == 2
    assert heavy["peak_memory_bytes"] > BALLAST_BYTES
    if not _peak_resettable():
        pytest.skip("this kernel does not let a process reset its peak resident set: the peak is the process's")
    assert light["peak_memory_bytes"] < heavy["peak_memory_bytes"] - BALLAST_BYTES // 2


def _peak_resettable() -> bool:
    try:
        metrics.PROC_CLEAR_REFS.write_text("5")
        return "VmHWM:" in metrics.PROC_STATUS.read_text()
    except OSError:
        return False


# -- stability monitors: cheap on CUDA by design -------------------------------------------------------------------


class OpCounter(TorchDispatchMode):
    """The aten ops that compute (views left out: no kernel) run under it, by name; a host read of a tensor's
    value is aten._local_scalar_dense."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(str(func.overloadpacket).removeprefix("aten."))
        return func(*args, **(kwargs or {}))


def update_of(params: list[torch.Tensor], seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for p in params:
        p.add_(torch.randn(p.shape, generator=generator) * 1e-3)


def test_fp32_update_norms_match_float64_ones():
    params = [
        torch.randn(shape, generator=torch.Generator().manual_seed(i))
        for i, shape in enumerate([(64, 32), (32,), (7, 5, 3)])
    ]
    exact, fast = snapshot(params, fp32=False), snapshot(params, fp32=True)
    update_of(params)
    reference = squared_norms(params, exact, fp32=False)
    measured = squared_norms(params, fast, fp32=True)
    assert reference.dtype == measured.dtype == torch.float64
    assert torch.allclose(measured, reference, rtol=1e-5, atol=0)


@pytest.mark.parametrize("count", [2, 12])
def test_fp32_update_norms_take_the_same_few_ops_whatever_the_parameter_count(count):
    params = [torch.randn(8, 8) for _ in range(count)]
    ops = {}
    for fp32 in (False, True):
        before = snapshot(params, fp32)
        update_of(params)
        with OpCounter() as counter:
            squared_norms(params, before, fp32)
        ops[fp32] = counter.ops
    assert "_local_scalar_dense" not in ops[True] + ops[False]  # no host read in either path
    assert len(ops[True]) <= 12  # foreach kernels over the block: stacks, norms, one subtraction, sums
    assert len(ops[False]) > 6 * count  # the float64 path: a few ops per parameter (why CUDA does not take it)


def small_model() -> Transformer:
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, kernels="torch"), 16)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


class FakeTrainer:
    """What StabilityMonitors reads of a trainer, for one monitored step of a small unsharded model."""

    def __init__(self, model):
        self.model, self.step, self.max_steps, self.logged = model, 4, 100, {}
        self.dist = init_distributed("cpu")

    def log(self, fields: dict) -> None:
        self.logged.update(fields)


def one_monitor_pass(fp32: bool, monkeypatch) -> tuple[dict, list[str]]:
    """A monitored step: the snapshot before the update, the update, then the figures; with the aten ops and the
    host reads (.tolist, and .item and the like) made while the figures were taken."""
    monkeypatch.setattr(StabilityMonitors, "fp32", staticmethod(lambda trainer: fp32))
    trainer = FakeTrainer(small_model())
    monitors = StabilityMonitors(every=5, micro_batch=2, doc_mask=False)
    monitors.inputs = (torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0)), None)
    monitors.pre_train(trainer)
    monitors.before_update(trainer)
    with torch.no_grad():
        update_of([p for group in parameter_groups(trainer.model).values() for p in group])
    trainer.step = 5
    tolists, real_tolist = [], torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: tolists.append("tolist") or real_tolist(self))
    with OpCounter() as counter:
        monitors.post_step(trainer)
    monkeypatch.undo()
    # a CPU tensor's .tolist() reaches no aten op; .item(), float(), bool() run aten._local_scalar_dense
    return trainer.logged, tolists + [op for op in counter.ops if op == "_local_scalar_dense"]


def test_a_monitor_pass_reads_the_host_twice_and_fp32_agrees(monkeypatch):
    exact, exact_reads = one_monitor_pass(False, monkeypatch)
    fast, fast_reads = one_monitor_pass(True, monkeypatch)
    # the ratios' one .tolist, and stability_stats' one .tolist of every layer's maximum with the logits' norm
    assert sorted(exact_reads) == sorted(fast_reads) == ["tolist", "tolist"]
    assert set(exact) == set(fast) and any(key.startswith("stability/update_ratio/") for key in exact)
    for key, value in exact.items():
        assert fast[key] == pytest.approx(value, rel=1e-5), key
