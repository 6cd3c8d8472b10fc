"""A stack's members equal their lone runs over 50 steps, on CPU in fp32: StackedTrainer (training/stack.py) against
the same Trainers stepped one by one, for Muon, a batch ramp, experts balanced by their loss and by a router bias,
latent attention with document masks, and members that differ in learning rate, weight decay, clipping, schedule
and init scale. Every logged (step, loss, grad_norm) row (log_every 1) and every final weight and buffer is compared:
bit for bit where the batched kernels allow it, else to 1e-5 relative (each test's docstring says which, and the
largest difference measured when it was written: 2 cores, torch's CPU kernels)."""

from __future__ import annotations

import pytest
import torch
from test_stack import poisoned_stack, _curve, _trainers

from ablate import rundir
from ablate.training.callbacks import Verdict
from ablate.training.stack import StackedTrainer

# 2 seeds by default (the file's runtime); 3 where members differ in values, and in the divergence test
STEPS, SEEDS = 50, (0, 1)
MOE = {"model.ffn": "moe", "model.moe_experts": 4, "model.moe_top_k": 2}
# experts only: their batched matmuls under vmap round differently from a lone run's (the same routing choices)
CLOSE = dict(rtol=1e-5, atol=0)  # losses and grad norms: relative, as the stack promises
CLOSE_WEIGHTS = dict(rtol=1e-5, atol=1e-6)  # weights near 0 (where Adam magnifies a last-bit gradient difference)


def _members(root, fields: dict, own: list[dict] | None = None, seeds=SEEDS) -> list:
    """test_stack._trainers (log_every 1, opened), with `own` overrides per member beside the shared `fields`."""
    own = own or [{}] * len(seeds)
    return [t for seed, extra in zip(seeds, own) for t in _trainers(root, STEPS, (seed,), **fields, **extra)]


def _lone_and_stacked(tmp_path, fields: dict, own: list[dict] | None = None, seeds=SEEDS, spy=None):
    """The runs trained alone, one after another, and the same runs trained as one stack, each to its last step
    (the plan's length: a batch ramp decides it). `spy(tokens, targets, doc_ids)` sees every stacked pass."""
    lone = _members(tmp_path / "lone", fields, own, seeds)
    for trainer in lone:
        while trainer.step < trainer.max_steps:
            trainer.train_step()
    members = _members(tmp_path / "stack", fields, own, seeds)
    stacked = StackedTrainer(members)
    if spy is not None:
        loss = stacked.stack.loss
        stacked.stack.loss = lambda *args: (spy(*args), loss(*args))[1]
    while stacked.unfinished:
        stacked.train_step()
    assert not stacked.failed
    assert all(t.step == t.max_steps == STEPS for t in lone + members)
    return lone, members


def _moe_rows(trainer, prefix: str = "moe/") -> list[dict]:
    """The `prefix` fields of each metrics.jsonl row that has them (ExpertBalance's, every step at log_every 1)."""
    rows = [
        {k: v for k, v in r.items() if k.startswith(prefix)}
        for r in rundir.read_jsonl(trainer.run_dir / rundir.METRICS)
    ]
    return [r for r in rows if r]


def _assert_curves_close(got: list[tuple], want: list[tuple]) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64), **CLOSE)


def _assert_members_equal_lone_runs(lone, members, exact: bool) -> None:
    """Every member's logged curve and final state (parameters and buffers: a router's bias) equal its lone run's,
    bit for bit if `exact`, else to CLOSE / CLOSE_WEIGHTS; and the members differ from each other."""
    curves = []
    for alone, member in zip(lone, members):
        got, want = _curve(member), _curve(alone)
        assert len(got) == len(want) == STEPS and [r[0] for r in got] == list(range(1, STEPS + 1))
        if exact:
            assert got == want
        else:
            _assert_curves_close(got, want)
        mine, theirs = member.model.state_dict(), alone.model.state_dict()
        assert list(mine) == list(theirs)
        for name in mine:
            if exact:
                assert torch.equal(mine[name], theirs[name]), name
            else:
                torch.testing.assert_close(mine[name], theirs[name], **CLOSE_WEIGHTS, msg=lambda m, n=name: f"{n}: {m}")
        curves.append(got)
    assert len({curve[-1][1] for curve in curves}) == len(curves)  # the members are different runs


def test_muon_members_equal_their_lone_runs(tmp_path):
    """optim.name="muon" (Newton-Schulz on each member's own hidden matrices, views of the stacked storage; AdamW on
    the rest). Measured: bit-identical, curves and weights."""
    lone, members = _lone_and_stacked(tmp_path, {"optim.name": "muon"})
    assert type(members[0].optimizer).__name__ == "Muon"
    _assert_members_equal_lone_runs(lone, members, exact=True)


def test_a_batch_ramp_stacks_equal_their_lone_runs(tmp_path):
    """train.batch_schedule="ramp" from 2 to 8 sequences in passes of 2 (1 to 4 stacked passes per step, each member
    on its own sampler), the learning rate scaled by sqrt(batch / global_batch); max_tokens chosen so the plan is
    exactly 50 steps: 14 x 2, 7 x 4, 4 x 6, 25 x 8. Measured: bit-identical, curves and weights."""
    ramp = {
        "train.micro_batch": 2,
        "train.batch_schedule": "ramp",
        "train.batch_start": 2,
        "train.batch_ramp_tokens": 20 * 4 * 32,
        "train.batch_lr_scaling": "sqrt",
        "train.max_tokens": 8960,
    }
    lone, members = _lone_and_stacked(tmp_path, ramp)
    assert sorted(set(members[0].batch_plan)) == [2, 4, 6, 8]
    _assert_members_equal_lone_runs(lone, members, exact=True)


@pytest.mark.parametrize("balance", ["aux_loss", "bias"])
def test_moe_members_equal_their_lone_runs_and_log_their_own_routing(tmp_path, balance):
    """4 experts, top 2, in both layers; moe_balance "aux_loss" (Switch's loss in each member's training loss) or
    "bias" (ExpertBalance moves each member's router bias by that member's own load, which the stack hands its
    routers after every pass). Each member's logged moe/ fields are its lone run's: the loads (so every routing
    choice, the bias updates and the final biases) bit for bit, the balancing and z-losses to 1e-5.
    Measured over seeds 0-2: losses within 1.8e-7 relative, grad norms within 3.5e-6, weights within 4e-7 absolute;
    moe/aux_loss and moe/z_loss within 1.6e-7 relative; loads, dropped and the router biases bit-identical.
    Not bit-identical: the experts' batched matmuls under vmap round differently from a lone run's."""
    lone, members = _lone_and_stacked(tmp_path, {**MOE, "model.moe_balance": balance})
    _assert_members_equal_lone_runs(lone, members, exact=False)
    for alone, member in zip(lone, members):
        for name, bias in member.model.state_dict().items():
            if name.endswith("router.bias"):
                assert torch.equal(bias, alone.model.state_dict()[name]), name
                assert bool(bias.any()) == (balance == "bias"), name  # moved only by "bias", from the member's load
        got, want = _moe_rows(member), _moe_rows(alone)
        assert len(got) == len(want) == STEPS and all(g.keys() == w.keys() for g, w in zip(got, want))
        for g, w in zip(got, want):
            for key in g:
                if key.startswith(("moe/aux_loss", "moe/z_loss")):
                    torch.testing.assert_close(g[key], w[key], rtol=1e-5, atol=0, msg=lambda m, k=key: f"{k}: {m}")
                else:  # loads, their max over mean, dropped: counts of routing choices
                    assert g[key] == w[key], key
    biases = [m.model.state_dict()["layers.0.ffn.router.bias"] for m in members]
    assert balance == "aux_loss" or not torch.equal(biases[0], biases[1])  # each member its own bias


def test_mla_with_document_masks_equals_its_lone_runs(tmp_path):
    """model.attention="mla" (latent keys and values, decoupled RoPE) with data.doc_mask (attention within a
    document where documents are packed into one sequence: the stack passes each member's doc_ids). Measured:
    bit-identical, curves and weights."""
    seen = []

    def spy(tokens, targets, doc_ids):
        seen.append(doc_ids is not None and bool((doc_ids[..., -1] != doc_ids[..., 0]).any()))

    lone, members = _lone_and_stacked(tmp_path, {"model.attention": "mla", "data.doc_mask": True}, spy=spy)
    assert type(members[0].model.layers[0].attn).__name__ == "LatentAttention"
    assert any(seen)  # some sequences do hold a document boundary, so the mask is not all-ones
    _assert_members_equal_lone_runs(lone, members, exact=True)


def test_members_that_differ_in_values_equal_their_lone_runs(tmp_path):
    """Members that share a shape but not their values: learning rate, weight decay, init_std, grad_clip and
    schedule per member (each its own optimizer, schedule and clipping by its own norm; init_std is read only by
    each member's own initialisation). Measured: bit-identical, curves and weights."""
    own = [
        {},
        {"optim.lr": 1e-3, "optim.weight_decay": 0.0, "model.init_std": 0.05, "optim.grad_clip": 0.5},
        {"optim.lr": 6e-3, "optim.weight_decay": 0.3, "model.init_std": 0.01, "schedule.name": "wsd"},
    ]
    lone, members = _lone_and_stacked(tmp_path, {}, own, seeds=(0, 1, 2))
    assert [t.optimizer.param_groups[0]["weight_decay"] for t in members] != [0.1] * 3
    assert len({t.run.model.init_std for t in members}) == len({t.run.optim.lr for t in members}) == 3
    _assert_members_equal_lone_runs(lone, members, exact=True)


def test_a_diverging_moe_member_leaves_the_others_unchanged(tmp_path):
    """Bias-balanced experts, member 1's weights poisoned with NaN after step 2: its non-finite guard masks it
    (its row is still computed, on another member's batch, its routers' statistics dropped). Members 0 and 2 log
    what they log in a stack where nobody diverged, bit for bit (the same batched kernels), and their lone runs'
    curves to 1e-5."""
    steps, fields = 10, {**MOE, "model.moe_balance": "bias"}
    healthy = StackedTrainer(_trainers(tmp_path / "healthy", steps, **fields))
    for _ in range(steps):
        healthy.train_step()
    lone = _trainers(tmp_path / "lone", steps, seeds=(0, 2), **fields)
    for trainer in lone:
        for _ in range(steps):
            trainer.train_step()
    stacked = poisoned_stack(tmp_path / "stack", steps, **fields)
    members = stacked.members
    assert list(stacked.failed) == [1] and members[1].step < steps
    assert members[0].step == members[2].step == steps
    for k, alone in zip((0, 2), lone):
        got = _curve(members[k])
        assert got == _curve(healthy.members[k])
        assert _moe_rows(members[k], "moe/load") == _moe_rows(healthy.members[k], "moe/load")
        mine, theirs = members[k].model.state_dict(), healthy.members[k].model.state_dict()
        assert all(torch.equal(mine[n], theirs[n]) for n in mine)
        _assert_curves_close(got, _curve(alone))
    for trainer in (members[1], healthy.members[1]):  # the others were closed by _curve
        trainer.end()


def test_a_muon_stack_orthogonalises_each_matrix_once_for_all_members(tmp_path, monkeypatch):
    """Muon.stacked_step: one Newton-Schulz per hidden matrix for the whole stack (a (K, rows, cols) batch), as
    many calls a step as a lone run makes, and a member that skips its update (a non-finite step) leaves the
    others' orthogonalised together. With experts: their (n, rows, cols) stacks batched as (K, n, rows, cols)."""
    import ablate.optim.muon as muon

    shapes = []
    real = muon.newton_schulz
    monkeypatch.setattr(muon, "newton_schulz", lambda m, steps: (shapes.append(tuple(m.shape)), real(m, steps))[1])
    fields = {"optim.name": "muon", **MOE}
    lone = _trainers(tmp_path / "lone", 2, (0,), **fields)[0]
    lone.train_step()
    alone = list(shapes)
    shapes.clear()
    members = [t for seed in SEEDS for t in _trainers(tmp_path / "stack", 2, (seed,), **fields)]
    stacked = StackedTrainer(members)
    stacked.train_step()
    assert alone and len(shapes) == len(alone)
    assert shapes == [(len(SEEDS), *shape) for shape in alone]
    assert any(len(shape) == 4 for shape in shapes)  # the experts' stacks
    shapes.clear()
    before = {n: t.clone() for n, t in members[1].model.state_dict().items()}
    members[1].callbacks_verdict = lambda: Verdict("skip", "a test's")  # its update skipped: the others go on
    stacked.train_step()
    assert shapes == [(len(SEEDS) - 1, *shape) for shape in alone]
    assert members[1].skipped_steps == 1 and members[0].skipped_steps == 0
    assert all(torch.equal(t, before[n]) for n, t in members[1].model.state_dict().items())
