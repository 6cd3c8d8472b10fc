"""train.cuda_graphs (training/graphs.py) on CPU: the graphed step's structure (static buffers, the learning rate as
a tensor, found_inf written by graph A, figures copied out) trains bit for bit as the ordinary step, through micro-
batch accumulation, a batch ramp, a non-finite step and a rollback; and the setting is refused by name where a
capture cannot hold. The capture itself (torch.cuda.graph) only a GPU shows: scripts/bench_cuda_graphs.py, in the
lease (scripts/gpu_acceptance.py), compares a graphed run's losses with the eager run's bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.config import ConfigError
from ablate.setup import auto
from ablate.setup.checks import check_run, cuda_graphs_refusal
from ablate.setup.experiment import load_experiment
from ablate.setup.overrides import apply_overrides
from ablate.training import graphs
from ablate.training.graphs import StepGraphs
from conftest import TINY, tiny_trainer
from test_single_device import poison


def _train(trainer, graphed: bool) -> tuple[list, list]:
    """Every step of `trainer`, from static graphs (capture=False: no CUDA here) or not: losses and grad norms."""
    if graphed:
        trainer.graphs = StepGraphs(trainer, capture=False)
    losses, norms = [], []
    while trainer.step < trainer.max_steps:
        trainer.train_step()
        losses.append(trainer.last_loss)
        norms.append(trainer.last_grad_norm)
    return losses, norms


CASES = {
    "plain": {},
    "accumulated": {"train.global_batch": 8, "train.micro_batch": 4},  # two passes a step
    "ramp": {"train.batch_schedule": "stages", "train.batch_stages": "0:4,1200:8", "train.micro_batch": 4},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_graphed_step_trains_bit_for_bit_as_the_ordinary_step(tmp_path, case):
    fields = {"train.max_steps": 8, "train.global_batch": 8, **CASES[case]}
    plain = tiny_trainer(tmp_path / "plain", **fields)
    graphed = tiny_trainer(tmp_path / "graphed", **fields)
    assert plain.max_steps > graphs.EAGER_STEPS_BEFORE_CAPTURE + 2  # most steps from the graphs
    expected, got = _train(plain, graphed=False), _train(graphed, graphed=True)
    assert got == expected  # losses and grad norms, every step
    for p, q in zip(plain.model.parameters(), graphed.model.parameters()):
        assert torch.equal(p, q)
    for a, b in zip(plain.optimizer.state.values(), graphed.optimizer.state.values()):
        assert all(torch.equal(a[key], b[key]) for key in a)
    assert all(isinstance(g["lr"], float) for g in graphed.optimizer.param_groups)  # the tensors only inside B
    sizes = set(plain.batch_plan[graphs.EAGER_STEPS_BEFORE_CAPTURE :])
    assert graphed.graphs.captures == len(sizes)  # one per batch size
    assert set(graphed.graphs.steps) <= sizes


def test_a_non_finite_step_is_skipped_by_the_graphed_update_as_by_the_ordinary_one(tmp_path):
    fields = {"train.max_steps": 7}
    plain, graphed = tiny_trainer(tmp_path / "a", **fields), tiny_trainer(tmp_path / "b", **fields)
    for trainer in (plain, graphed):
        poison(trainer, {5})  # a graphed step (after the eager warm-up)
    expected, got = _train(plain, graphed=False), _train(graphed, graphed=True)
    assert math.isnan(got[0][4]) and graphed.skipped_steps == plain.skipped_steps == 1
    assert got[0][5:] == expected[0][5:]
    for p, q in zip(plain.model.parameters(), graphed.model.parameters()):
        assert torch.equal(p, q)


def test_a_restore_drops_the_graphs_and_training_goes_on_bit_for_bit(tmp_path):
    """A rollback restores the optimizer's state (maybe as new tensors, which no graph reads): the graphs are
    dropped, the next steps eager again, then captured anew."""
    fields = {"train.max_steps": 12, "train.ckpt_every": 4}
    plain, graphed = tiny_trainer(tmp_path / "a", **fields), tiny_trainer(tmp_path / "b", **fields)
    graphed.graphs = StepGraphs(graphed, capture=False)
    for trainer in (plain, graphed):
        for _ in range(6):
            trainer.train_step()
        trainer.roll_back("a test")  # back to step 4's checkpoint
    assert graphed.graphs.steps == {} and graphed.graphs.eager_steps == 0
    expected, got = _train(plain, graphed=False), _train(graphed, graphed=False)  # graphs already attached
    assert got == expected and graphed.graphs.captures == 2


def _run(**fields):
    run = load_experiment(TINY, only=["mha"])[0]
    return apply_overrides(run, {"train.device": "cpu", **fields})


def test_cuda_graphs_true_is_refused_by_name_where_a_capture_cannot_hold():
    with pytest.raises(ConfigError, match=r"train.cuda_graphs=True: CUDA graphs need a CUDA device.*cpu"):
        check_run(_run(**{"train.cuda_graphs": True}), 1)
    cuda = torch.device("cuda")
    assert "world size 2" in cuda_graphs_refusal(_run(), cuda, 2)
    assert "optim.name='muon'" in cuda_graphs_refusal(_run(**{"optim.name": "muon"}), cuda, 1)
    assert "captures_step" in cuda_graphs_refusal(_run(**{"optim.name": "muon"}), cuda, 1)
    moe = _run(**{"model.ffn": "moe", "model.moe_experts": 4, "model.moe_top_k": 2})
    assert cuda_graphs_refusal(moe, cuda, 1).startswith("model.ffn='moe'")
    assert "data.doc_mask" in cuda_graphs_refusal(_run(**{"data.doc_mask": True}), cuda, 1)
    assert cuda_graphs_refusal(_run(), cuda, 1) is None  # AdamW, dense, world size 1 on a GPU: it can
    with pytest.raises(ConfigError, match=r"train.cuda_graphs: got 'yes'.*one of 'auto'"):
        _run(**{"train.cuda_graphs": "yes"})


def test_auto_keeps_cuda_graphs_off_on_cpu_and_where_no_lease_proved_them(tmp_path):
    trainer = tiny_trainer(tmp_path)  # train.cuda_graphs="auto" by default
    assert trainer.graphs is None and not trainer.choices.cuda_graphs.on
    assert auto.cuda_graphs("auto", torch.device("cpu"), None) == auto.Choice(False, "")
    assert auto.cuda_graphs(False, torch.device("cuda"), None).on is False
    with pytest.raises(ConfigError, match="world size 2"):
        auto.cuda_graphs(True, torch.device("cuda"), "world size 2: ...")
    assert auto.CUDA_GRAPHS_PROVEN_ON == ()  # until a lease's bit-for-bit check; then "auto" turns them on there


def test_cuda_graphs_do_not_change_a_runs_identity():
    assert _run(**{"train.cuda_graphs": False}).identity() == _run().identity()


def test_a_stack_says_its_steps_are_not_captured_where_its_members_graphs_are_on(tmp_path, capsys):
    """ "auto" turned on where proven: a member's graphs serve its steps alone, and the stack says its own are not
    captured (train.cuda_graphs=True never enters a stack: test_stack_run)."""
    from ablate.training.stack import StackedTrainer

    members = [tiny_trainer(tmp_path / f"seed{s}", **{"train.seed": s}) for s in (0, 1)]
    members[1].graphs = StepGraphs(members[1], capture=False)
    StackedTrainer(members)
    said = capsys.readouterr()
    assert (said.out + said.err).count("a stack's steps are not captured yet") == 1
