"""`ablate plan --stack K`: a stack's memory (every member's bytes; an optimizer step's temporaries once where the
members step one after another), the largest stack that fits a device, and the command line. CPU, no training."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.components import registry
from ablate import optim
from ablate.config import DataConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from ablate.cost import memory, plan
from ablate.setup.checks import check_run
from ablate.setup.experiment import load_checked
from conftest import TINY, cli_in_process


def _members(k: int, **optim_fields) -> list:
    """K seeds of one small run (two micro-batches a step: the second finds gradients waiting)."""
    run = RunConfig(
        model=ModelConfig(vocab_size=512, d_model=64, n_layers=3, n_heads=4),
        data=DataConfig(seq_len=32),
        train=TrainConfig(max_steps=10, global_batch=8, micro_batch=4, peak_flops=1e11),
        optim=OptimConfig(**optim_fields),
    )
    return [check_run(dataclasses.replace(run, train=dataclasses.replace(run.train, seed=s))) for s in range(k)]


def _stack_total(members: list) -> int:
    return memory.estimate_stack_memory(members, "cpu").total


@pytest.fixture
def one_at_a_time():
    """An optimizer with step temporaries and no stacked_step: a stack's members step it one after another."""

    @optim.register("one_at_a_time_for_plan")
    class OneAtATime(torch.optim.SGD):
        def __init__(self, groups, cfg):
            super().__init__(groups, lr=cfg.lr)

        @staticmethod
        def state_elements(shapes: optim.ParamShapes, world: int) -> int:
            return 0

        @staticmethod
        def transient_elements(shapes: optim.ParamShapes, world: int) -> int:
            return 100 * optim.shard_elements(shapes.root + shapes.all_blocks, world)  # made up: the peak

    yield "one_at_a_time_for_plan"
    registry.unregister("optimizer", "one_at_a_time_for_plan")


@pytest.mark.parametrize("optimizer", ["adamw", "muon", "one_at_a_time"])
def test_a_stack_needs_k_times_each_moment_but_what_it_holds_once(optimizer, request):
    """Every member's bytes at every moment, the loss's chunks of logits included (the loss is batched over the
    stack); only the temporaries of an optimizer whose members step one after another are held once (Muon steps
    together, AdamW's fused step has none)."""
    name = request.getfixturevalue(optimizer) if optimizer == "one_at_a_time" else optimizer
    lone = memory.step_moments(_members(1, name=name)[0], 1, "cpu")
    step = lone[-1]
    assert step.moment == "optimizer step" and step.once_per_stack == step.activations
    assert not any(m.once_per_stack for m in lone[:-1])
    assert (step.once_per_stack > 0) == (optimizer != "adamw")
    held_once = optimizer == "one_at_a_time"
    assert memory.steps_together(_members(2, name=name)) == (optimizer == "muon")
    totals = []
    for k in range(1, 5):
        once = [m.once_per_stack if held_once else 0 for m in lone]
        formula = max(k * (m.total - held) + held for m, held in zip(lone, once))
        stacked = memory.estimate_stack_memory(_members(k, name=name), "cpu")
        assert stacked.total == formula
        at = next(m for m in lone if m.moment == stacked.moment)  # every kind k times, at the stack's peak
        assert (stacked.params, stacked.grads, stacked.optimizer, stacked.gathered) == tuple(
            k * n for n in (at.params, at.grads, at.optimizer, at.gathered)
        )
        totals.append(stacked.total)
        assert memory.largest_stack(_members(1, name=name)[0], stacked.total, "cpu") == k
    assert totals == sorted(set(totals))  # grows with every member
    if held_once:  # the step's temporaries once: under twice a lone run
        assert totals[1] < 2 * totals[0]
    else:
        assert totals == [k * totals[0] for k in range(1, 5)]


def test_a_stack_of_one_is_the_lone_run():
    (alone,) = _members(1)
    assert memory.estimate_stack_memory([alone], "cpu") == memory.estimate_memory(alone, 1, "cpu")


def test_members_with_different_optimizers_add_their_own_states():
    adamw, muon = _members(1)[0], _members(1, name="muon")[0]
    pairs = zip(memory.step_moments(adamw, 1, "cpu"), memory.step_moments(muon, 1, "cpu"))
    formula = max(
        a.total - a.once_per_stack + m.total - m.once_per_stack + max(a.once_per_stack, m.once_per_stack)
        for a, m in pairs
    )
    assert _stack_total([adamw, muon]) == formula
    assert _stack_total(_members(2, name="muon")) < _stack_total([adamw, muon]) < _stack_total(_members(2))


def test_the_largest_stack_is_the_boundary_of_what_fits():
    run = _members(1)[0]
    device = _stack_total(_members(3)) + 1000  # well under a fourth member
    assert memory.largest_stack(run, device, "cpu") == 3
    assert _stack_total(_members(3)) <= device < _stack_total(_members(4))
    exactly = _stack_total(_members(2))  # check_fits's rule: a peak equal to the device memory fits
    assert memory.largest_stack(run, exactly, "cpu") == 2
    assert memory.largest_stack(run, exactly - 1, "cpu") == 1
    lone = memory.estimate_memory(run, 1, "cpu").total
    assert memory.largest_stack(run, lone - 1, "cpu") == 0
    memory.check_fits(run, 1, lone, "cpu")  # the same rule as a lone run's


def test_plan_stacks_groups_as_training_does_and_sizes_each_stack():
    runs = load_checked(TINY, seeds=[0, 1, 2])
    stacks, alone = plan.plan_stacks(runs, 2, device_memory=None)
    assert [s.label for s in stacks] == ["mha seed0, mha seed1", "mha seed2", "mqa seed0, mqa seed1", "mqa seed2"]
    assert not alone and all(s.largest is None for s in stacks)
    assert stacks[0].memory == memory.estimate_stack_memory(runs[:2])
    (lone,) = plan.plan_stacks(runs[:1], 2, device_memory=64 * 2**20)[0]
    assert lone.largest == memory.largest_stack(runs[0], 64 * 2**20)


# ---------------------------------------------------------------------------------------------------------------
# the command line


def test_cli_prints_each_stack_its_memory_and_the_largest_that_fits():
    shown = cli_in_process("plan", TINY, "--stack", "2", "--seeds", "0,1", "--device-memory", "64MiB").stdout
    runs = load_checked(TINY, seeds=[0, 1])
    mha = [r for r in runs if r.config.name == "mha"]
    row = next(line for line in shown.splitlines() if line.endswith("mha seed0, mha seed1"))
    assert memory.format_bytes(memory.estimate_stack_memory(mha).total) in row
    assert f" {memory.largest_stack(mha[0], 64 * 2**20)} " in row and "yes" in row
    assert "mqa seed0, mqa seed1" in shown and "stacks of up to 2 runs" in shown and "trains alone" not in shown


def test_cli_says_which_runs_train_alone_and_that_no_device_memory_is_known():
    shown = cli_in_process("plan", TINY, "--stack", "2").stdout  # no GPU here, no --device-memory
    assert "mha seed0: alone (no other run shares its shape and steps)" in shown and "mqa seed0: alone" in shown
    assert "largest K: unknown" in shown and "fits" not in shown.split("stacks of up to")[1]


def test_cli_refuses_a_stack_that_cannot_fit_naming_the_largest_that_would():
    mha = load_checked(TINY, only="mha", seeds=[0, 1])
    between = (memory.estimate_memory(mha[0]).total + memory.estimate_stack_memory(mha).total) // 2
    refused = cli_in_process(
        "plan", TINY, "--only", "mha", "--seeds", "0,1", "--stack", "2", "--device-memory", str(between), check=False
    )
    assert refused.returncode == 2
    assert "1 stack cannot fit" in refused.stderr and "stack 1 (mha seed0, mha seed1) needs" in refused.stderr
    assert "at most 1 of its shape fit: --stack 1" in refused.stderr
    assert "NO" in refused.stdout  # the tables are printed first


def test_cli_stack_of_one_prints_what_plan_always_did():
    plain = cli_in_process("plan", TINY, "--device-memory", "64MiB")
    one = cli_in_process("plan", TINY, "--device-memory", "64MiB", "--stack", "1")
    assert one.stdout == plain.stdout and one.stderr == plain.stderr


def test_cli_refuses_a_stack_over_several_ranks():
    refused = cli_in_process("plan", TINY, "--stack", "2", "--world-size", "2", check=False)
    assert refused.returncode == 2 and "a stack trains on one device (world size 1)" in refused.stderr


@pytest.mark.parametrize("value", ["0", "-1", "''", "two", "1.5"])
def test_cli_refuses_a_stack_that_is_not_a_whole_number_from_1(value):
    refused = cli_in_process("plan", TINY, "--stack", value.strip("'"), check=False)
    assert refused.returncode == 2 and "--stack" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_cli_takes_the_files_stack_as_ablate_run_does(tmp_path):
    stacked = tmp_path / "stacked.py"
    stacked.write_text(TINY.read_text() + "seeds = [0, 1]\nstack = 2\n")
    shown = cli_in_process("plan", stacked, "--only", "mha").stdout
    assert "stacks of up to 2 runs" in shown and "mha seed0, mha seed1" in shown
    alone = cli_in_process("plan", stacked, "--only", "mha", "--stack", "1").stdout
    assert alone == cli_in_process("plan", TINY, "--only", "mha", "--seeds", "0,1").stdout  # experiment="tiny" in both
    refused = cli_in_process("plan", stacked, "--world-size", "2", check=False)
    assert refused.returncode == 2 and "the file's stack = 2 with --world-size 2" in refused.stderr
