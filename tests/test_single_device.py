"""World size 1 as a GPU runs it, proved on CPU: a plain module (no FSDP2, no DTensor), the model and its loss as one
compiled graph over every architecture knob and through a batch ramp, no host read on an ordinary step, a non-finite
step skipped on the device exactly as the host skipped it, and one checkpoint format with the run folders written
before (world size 1 <-> 2: tests/test_train.py's gloo test; compiled against eager: its compile test)."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from ablate.training import parallel
from ablate.training.callbacks import Divergence
from conftest import TINY, tiny_trainer

GOLDEN_RUN = Path(__file__).parent / "golden" / "run_before_single_device"


# -- a plain module -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_world_one_trains_a_plain_module_with_fp32_parameters(tmp_path, dtype):
    trainer = tiny_trainer(tmp_path, **{"train.dtype": dtype})
    assert trainer.dist.world == 1 and trainer.dist.mesh is None
    assert not any(isinstance(m, FSDPModule) for m in trainer.model.modules())
    assert not any(isinstance(p, DTensor) for p in trainer.model.parameters())
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # the optimizer's master weights
    trainer.train_step()
    assert trainer.step == 1 and math.isfinite(trainer.last_loss)


# -- no host read on an ordinary step ------------------------------------------------------------------------------


class HostReads(TorchDispatchMode):
    """Every read of a tensor's value by the host: the dispatcher's _local_scalar_dense (item, float, bool, int),
    and tolist/numpy, which read without it. On a GPU each one waits for the device to drain its queue."""

    READERS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self, monkeypatch):
        super().__init__()
        self.reads: list[str] = []
        for name in self.READERS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                self.reads.append(_name)
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append("_local_scalar_dense")
        return func(*args, **(kwargs or {}))

    def per_call(self, step, calls: int) -> list[int]:
        """The reads of each of `calls` calls of `step`."""
        counts = []
        for _ in range(calls):
            with self:
                step()
            counts.append(len(self.reads))
            self.reads.clear()
        return counts


def test_an_ordinary_step_reads_nothing_and_a_logging_step_reads_its_figures_once(tmp_path, monkeypatch):
    """With the default callbacks (log_every 4 here: steps 1-3 are ordinary), no step but the logging one reads a
    value from the device; that one reads the pending steps' figures in one go (then the log line's own)."""
    trainer = tiny_trainer(tmp_path, **{"train.max_steps": 8, "train.log_every": 4, "train.monitor_every": 4})
    reads_per_step = HostReads(monkeypatch).per_call(trainer.train_step, 4)
    monkeypatch.undo()
    assert reads_per_step[:3] == [0, 0, 0], reads_per_step
    assert reads_per_step[3] > 0  # the logging step: figures, monitors, memory
    losses = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").open()]
    assert [row["step"] for row in losses if "loss" in row] == [4]
    assert trainer.figures.pending == [] and trainer.figures.last.step == 4


def test_a_spike_policy_that_decides_reads_every_step(tmp_path, monkeypatch):
    """train.spike_policy=skip must see each loss before its update: then, and only then, each step reads."""
    trainer = tiny_trainer(tmp_path, **{"train.spike_policy": "skip"})
    counter = HostReads(monkeypatch)
    with counter:
        trainer.train_step()
    assert counter.reads.count("tolist") == 1  # the step's figures, read once before the update


# -- a non-finite step, skipped on the device ----------------------------------------------------------------------


def poison(trainer, steps: set[int]):
    """Make the training loss NaN in the given steps (1-based), as a bad batch would."""
    loss = trainer.model.loss

    def poisoned(*args, **kwargs):
        value, ce = loss(*args, **kwargs)
        if trainer.step + 1 in steps:
            return value * math.nan, ce * math.nan
        return value, ce

    trainer.model.loss = poisoned


def train_poisoned(tmp_path, name, steps, on_device: bool, **fields):
    trainer = tiny_trainer(tmp_path / name, **{"train.max_steps": 6, **fields})
    poison(trainer, steps)
    if not on_device:  # the host path: each step read before its update, a non-finite one skipped there
        trainer.skips_on_device, trainer.reads_every_step = False, True
    return trainer


def test_a_non_finite_step_is_skipped_on_the_device_exactly_as_on_the_host(tmp_path):
    """The fused optimizer's found_inf leaves weights and moments as a host-side skip does, bit for bit, and the
    step is counted the same; the steps after it train identically."""
    trainers = {}
    for name, on_device in (("device", True), ("host", False)):
        trainer = train_poisoned(tmp_path, name, {3}, on_device)
        while trainer.step < trainer.max_steps:
            trainer.train_step()
        trainers[name] = trainer
    device, host = trainers["device"], trainers["host"]
    assert device.skipped_steps == host.skipped_steps == 1
    assert device.last_loss == host.last_loss and math.isfinite(device.last_loss)
    for p, q in zip(device.model.parameters(), host.model.parameters()):
        assert torch.equal(p, q)
    device_guard = next(c for c in device.callbacks if c.name == "non_finite_guard")
    assert device_guard.in_a_row == 0


def test_five_non_finite_steps_in_a_row_end_the_run_at_the_fifth_even_when_read_later(tmp_path):
    """Steps 2-6 NaN, read only at the logging step 8: the run ends as diverged at step 6, with 5 skipped steps,
    as when each step was read at once; nothing is logged for step 7 or 8."""
    for name, on_device in (("device", True), ("host", False)):
        trainer = train_poisoned(tmp_path, name, set(range(2, 7)), on_device, **{"train.max_steps": 10})
        with pytest.raises(Divergence, match=r"5 steps in a row .* \(last at step 6\)") as raised:
            while trainer.step < trainer.max_steps:
                trainer.train_step()
        assert raised.value.step == 6 and trainer.skipped_steps == 5, name
        assert trainer.step == (10 if on_device else 6)  # learnt of at the end (device) or at once (host)
        rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").open()]
        assert [r["step"] for r in rows if "loss" in r] == []


def test_a_diverged_run_records_the_step_it_diverged_at(tmp_path):
    from ablate import rundir
    from ablate.setup.experiment import load_experiment
    from ablate.training.run import run_dir_for, train

    run = load_experiment(
        TINY,
        only=["mha"],
        overrides={
            "train.max_steps": "40",
            "train.log_every": "20",
            "optim.lr": "1e4",
            "optim.grad_clip": "0",
            "train.ckpt_every": "0",
            "train.val_every": "0",
        },
    )[0]
    with pytest.raises(rundir.RunDiverged, match="non-finite"):
        train(run, tmp_path)
    status = rundir.read_status(run_dir_for(tmp_path, run))
    assert status["state"] == "diverged" and status["step"] < 20 and status["skipped_steps"] == 5
    assert f"last at step {status['step']})" in status["message"]


# -- one compiled graph ---------------------------------------------------------------------------------------------

KNOBS = {
    "dense": {},
    "gqa, qk-norm, z-loss": {"model.n_kv_heads": 2, "model.qk_norm": True, "model.z_loss": 1e-4},
    "mqa, nope every 2nd layer, gelu, layernorm": {
        "model.n_kv_heads": 1,
        "model.rope_skip_every": 2,
        "model.ffn": "gelu",
        "model.norm": "layernorm",
    },
    "nope": {"model.pos": "nope"},
    "mla": {"model.attention": "mla", "model.q_lora_rank": 16},
    "moe": {"model.ffn": "moe", "model.moe_experts": 4, "model.moe_top_k": 2, "model.moe_capacity": 1.25},
    "document mask": {"data.doc_mask": True},
    "completep (width and depth away from the base)": {
        "model.parametrization": "completep",
        "model.base_width": 16,
        "model.base_depth": 1,
    },
}


@pytest.fixture
def graphs(monkeypatch):
    """torch.compile as the run calls it, with dynamo's eager backend (the graph is what is checked, not Inductor's
    code, which takes minutes on these 2 cores) counting the graphs it is handed; any recompile is an error."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("eager")
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compile_(fn, **{**kwargs, "backend": counter}))
    torch._dynamo.reset()
    yield counter
    torch._dynamo.reset()


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_the_model_and_its_loss_are_one_graph_over_every_knob(tmp_path, graphs, knobs):
    """fullgraph=True: a graph break would raise. Five steps with a changing learning rate: one graph, compiled once."""
    trainer = tiny_trainer(tmp_path, **{"train.compile": True, "train.max_steps": 5, **knobs})
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(5):
            trainer.train_step()
    lrs = {group["lr"] for group in trainer.optimizer.param_groups}
    assert graphs.frame_count == 1 and graphs.op_count > 0
    assert trainer.step == 5 and len(lrs) >= 1 and math.isfinite(trainer.last_loss)


def test_a_batch_ramp_compiles_one_graph(tmp_path, graphs):
    """A batch ramp (4, 8, ... sequences a step): at world size 1 every pass is micro_batch sequences (a ramp's
    batches are whole micro-batches), so the graph never sees another shape: compiled once, never again."""
    ramp = {"train.global_batch": 16, "train.batch_schedule": "ramp", "train.batch_start": 4}
    trainer = tiny_trainer(tmp_path, **{"train.compile": True, "train.batch_ramp_tokens": 600, **ramp})
    assert len(set(trainer.batch_plan)) > 2
    with torch._dynamo.config.patch(error_on_recompile=True):
        while trainer.step < trainer.max_steps:
            trainer.train_step()
    assert graphs.frame_count == 1


# -- one checkpoint format --------------------------------------------------------------------------------------------


def test_a_run_folder_written_before_the_single_device_path_resumes_bit_exactly(tmp_path):
    """tests/golden/run_before_single_device: a run trained by the code before this path (FSDP2 on a 1-rank gloo
    group), its step-4 checkpoint and its logged losses. Resumed now, steps 5-8 give the losses it logged then."""
    from ablate.setup.experiment import load_experiment
    from ablate.training.run import run_dir_for, train

    held = json.loads((GOLDEN_RUN / "config.json").read_text())
    run = load_experiment(TINY, only=["mha"], overrides={"model.d_model": "16", "model.n_heads": "2"})[0]
    assert run.identity() == held["identity"]
    run_dir = run_dir_for(tmp_path, run)
    shutil.copytree(GOLDEN_RUN, run_dir)
    summary = train(run, tmp_path)
    logged = [json.loads(line) for line in (GOLDEN_RUN / "metrics.jsonl").open()]
    now = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    then_losses = {r["step"]: r["loss"] for r in logged if "loss" in r}
    now_losses = {r["step"]: r["loss"] for r in now if "loss" in r}
    assert sorted(now_losses) == list(range(1, 9)) and now_losses == then_losses  # 1-4 kept, 5-8 retrained
    assert summary["final_loss"] == then_losses[8]


def test_world_one_has_no_process_group_and_no_collectives():
    d = parallel.init_distributed("cpu")
    assert d.world == 1 and d.mesh is None and not torch.distributed.is_initialized()
    value = torch.ones(3)
    assert d.sum_tensor(value) is value and d.gather_objects("x") == ["x"] and d.first_of(None) is None
    assert d.broadcast_object({"a": 1}) == {"a": 1} and d.mean(2.5) == 2.5


class OpsDispatched(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_one_pass_step_dispatches_nothing_beside_the_models_loss_and_backward(tmp_path):
    """accumulate() of a step's one pass adds no op to the model's loss and its backward (before: a zeros to start
    the sum from, the division by a share of 1 in forward and backward, and the add: 5 ops a step); two passes
    divide each by its share."""
    trainer = tiny_trainer(tmp_path, **{"train.global_batch": 4, "train.micro_batch": 4})
    ((parts, share),) = list(trainer.passes(4))
    assert share == 1
    with OpsDispatched() as bare:
        loss, _ = trainer.model.loss(*parts)
        loss.backward()
    trainer.optimizer.zero_grad(set_to_none=True)
    with OpsDispatched() as accumulated:
        trainer.accumulate([(parts, share)])
    assert accumulated.count == bare.count
