"""train.cuda_graphs (training/graphs.py) on CPU: the graphed step's structure (static buffers, the learning rate as
a tensor, found_inf written by graph A, figures copied out) trains bit for bit as the ordinary step, through micro-
batch accumulation, a batch ramp, a non-finite step and a rollback, a lone run's step and a stack's (with a member
masked as diverged); and the setting is refused by name where a capture cannot hold. The capture itself
(torch.cuda.graph) only a GPU shows: scripts/bench_cuda_graphs.py, in the lease (scripts/gpu_acceptance.py),
compares a graphed run's losses with the eager run's bit for bit."""

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
from ablate.training.graphs import StackGraphs, StepGraphs
from conftest import TINY, tiny_trainer
from test_moe import HostReads
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
    "ramp": {"train.batch_schedule": "stages", "train.batch_stages": "0:4,600:8", "train.micro_batch": 4},
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
    # one per batch size, after its eager warm-up at that size (a new shape may compile anew: never in a capture)
    sizes = {size for size in plain.batch_plan if plain.batch_plan.count(size) > graphs.EAGER_STEPS_BEFORE_CAPTURE}
    assert graphed.graphs.captures == len(sizes) and set(graphed.graphs.steps) <= sizes
    assert case != "ramp" or len(sizes) == 2  # both of the ramp's sizes from graphs


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
    assert graphed.graphs.steps == {} and graphed.graphs.eager_steps == {}
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


def _stacked(root, graphed: bool, steps: int, seeds=(0, 1, 2), **fields):
    """Members of the tiny experiment as one StackedTrainer, its step from static graphs (capture=False) or not."""
    from ablate.training.stack import StackedTrainer
    from test_stack import _trainers

    stacked = StackedTrainer(_trainers(root, steps, seeds, **fields))
    if graphed:
        stacked.graphs = StackGraphs(stacked, capture=False)
    return stacked


def _stack_to_the_end(stacked):
    while stacked.unfinished:
        stacked.train_step()
    return stacked


def _same_members(eager, graphed, members) -> None:
    """Members `members` of the two stacks: the same logged curves, weights and optimizer states, bit for bit."""
    from test_stack import _curve

    for k in members:
        a, b = eager.members[k], graphed.members[k]
        assert _curve(a) == _curve(b), k
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert torch.equal(p, q), k
        for x, y in zip(a.optimizer.state.values(), b.optimizer.state.values()):
            assert all(torch.equal(x[key], y[key]) for key in x), k


@pytest.mark.parametrize("case", list(CASES))
def test_a_graphed_stack_trains_bit_for_bit_as_the_eager_stack(tmp_path, case):
    """K = 3 members: the stacked step's graph A (every pass's stacked forward and backward, each member's slice,
    clipping, figures and found_inf), the members' verdicts on the host and B (their updates) train as the eager
    stack does, through accumulation and a ramp (one A per batch size, after its eager warm-up)."""
    fields = {"train.global_batch": 8, **CASES[case]}
    eager, graphed = (_stack_to_the_end(_stacked(tmp_path / side, side == "b", 8, **fields)) for side in "ab")
    _same_members(eager, graphed, range(3))
    plan = eager.members[0].batch_plan
    sizes = {size for size in plan if plan.count(size) > graphs.EAGER_STEPS_BEFORE_CAPTURE}
    assert graphed.graphs.captures == len(sizes) >= 1 and {key[0] for key in graphed.graphs.steps} <= sizes
    assert case != "ramp" or len(sizes) == 2
    for member in graphed.members:
        assert all(isinstance(g["lr"], float) for g in member.optimizer.param_groups)  # tensors only inside B


def test_a_graphed_stack_skips_and_masks_a_diverging_member_as_the_eager_stack_does(tmp_path):
    """Member 1's weights made NaN after its second step: its non-finite updates skipped by found_inf from A, then
    its guard masks it (step 7); the graph of three members gives way to one of the two left, and members 0 and 2
    train on as in the eager stack."""
    sides = []
    for side in ("eager", "graphed"):
        stacked = _stacked(tmp_path / side, side == "graphed", 10)
        for step in range(10):
            if step == 2:
                with torch.no_grad():
                    stacked.members[1].model.embed.weight.fill_(float("nan"))
            stacked.train_step()
        sides.append(stacked)
    eager, graphed = sides
    assert list(graphed.failed) == list(eager.failed) == [1] and graphed.failed[1].step == eager.failed[1].step == 7
    assert graphed.members[1].skipped_steps == eager.members[1].skipped_steps > 0
    _same_members(eager, graphed, (0, 2))
    assert graphed.graphs.captures == 2 and [members for _, members in graphed.graphs.steps] == [(0, 2)]


def test_a_members_rollback_drops_the_stacks_graphs_and_training_goes_on_bit_for_bit(tmp_path):
    """Member 1 rolled back at its seventh step (a graphed one) to its step-4 checkpoint: the stack's graphs are
    dropped (its optimizer's state may be new tensors), it catches up alone, the stack warms up eagerly again and
    is captured anew; every member as in the eager stack under the same rollback."""
    from ablate.training.callbacks.base import Verdict

    sides = []
    for side in ("eager", "graphed"):
        stacked = _stacked(tmp_path / side, side == "graphed", 12, **{"train.ckpt_every": 4})
        member, fired = stacked.members[1], []
        verdict = member.callbacks_verdict

        def rolling_back(member=member, fired=fired, verdict=verdict):
            if member.step == 6 and not fired:
                fired.append(member.step)
                return Verdict("rollback", "planted in the test")
            return verdict()

        member.callbacks_verdict = rolling_back
        sides.append(_stack_to_the_end(stacked))
    eager, graphed = sides
    assert [len(m.rollbacks) for m in graphed.members] == [len(m.rollbacks) for m in eager.members] == [0, 1, 0]
    _same_members(eager, graphed, range(3))
    assert graphed.graphs.captures == 2  # before the rollback, and after the eager steps that follow it


def test_a_stack_is_graphed_where_every_members_graphs_are_on_and_says_where_not(tmp_path, capsys):
    """ "auto" may turn graphs on for one member and not another (its optimizer cannot be captured): the stack's
    steps then run un-graphed, and the member with graphs says so. A stack whose model has routers is refused."""
    from types import SimpleNamespace

    from ablate.training.stack import Stack, StackedTrainer
    from test_stack import _models

    members = [tiny_trainer(tmp_path / f"seed{s}", **{"train.seed": s}) for s in (0, 1)]
    members[1].graphs = StepGraphs(members[1], capture=False)
    assert StackedTrainer(members).graphs is None
    said = capsys.readouterr()
    assert (said.out + said.err).count("the stack's steps run un-graphed (mha seed 0 has them off)") == 1
    members[0].graphs = StepGraphs(members[0], capture=False)
    assert isinstance(StackedTrainer(members).graphs, StackGraphs)
    with pytest.raises(NotImplementedError, match="routers"):
        StackGraphs(SimpleNamespace(stack=Stack(_models("moe"))), capture=False)


def test_what_graph_a_holds_reads_nothing_back_to_the_host(tmp_path, monkeypatch):
    """Graph A of a lone run and of a stack (every pass's forward and backward, two accumulated passes here, the
    stack's gradient slices, clipping, the figures, found_inf) dispatches no op that reads a tensor back to the host
    and calls no .tolist(): a capture could hold none of them. (B is torch's fused AdamW, capturable under a
    capture; on CPU its uncapturable path reads the step count, so it is not watched here.)"""
    found, ran = [], []
    real_tolist = torch.Tensor.tolist

    def watched(original):
        def gradients(self):
            monkeypatch.setattr(torch.Tensor, "tolist", lambda t: found.append("tolist") or real_tolist(t))
            try:
                with HostReads() as reads:
                    result = original(self)
            finally:
                monkeypatch.setattr(torch.Tensor, "tolist", real_tolist)
            found.extend(reads.found)
            ran.append(type(self).__name__)
            return result

        return gradients

    for captured in (graphs._CapturedStep, graphs._CapturedStackStep):
        monkeypatch.setattr(captured, "_gradients", watched(captured._gradients))
    fields = {"train.global_batch": 8, "train.micro_batch": 4, "optim.grad_clip": 0.5}
    lone = tiny_trainer(tmp_path / "lone", **{"train.max_steps": 5, **fields})
    _train(lone, graphed=True)
    _stack_to_the_end(_stacked(tmp_path / "stack", True, 5, seeds=(0, 1), **fields))
    assert ran == ["_CapturedStep"] * 2 + ["_CapturedStackStep"] * 2  # the steps after the warm-up
    assert found == []
