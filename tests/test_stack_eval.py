"""training/stack_eval.py: a stack's members scored by the cloze suite in one stacked pass, equal to each member
scored alone (on CPU in fp32: bit for bit), and a stacked run's evals.jsonl equal to its lone runs'."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_stack import SHAPES, VOCAB, _models, _trainers

from ablate import rundir
from ablate.eval import engine
from ablate.training import stack_eval
from ablate.training.stack import Stack, StackedTrainer


@pytest.fixture(autouse=True)
def one_thread():
    """Bit for bit holds on one CPU thread (as pytest -n gives each worker): with more, a batched matmul and the
    member's own split their sums over the threads differently."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _requests(count: int = 24, seed: int = 3) -> list[tuple[list[int], list[int]]]:
    """(context, continuation) ids: groups of four continuations of one context (the engine's shared-prefix rows),
    contexts of different lengths, one longer than the model's 16 positions (cut from the left)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count // 4):
        context = torch.randint(1, VOCAB, (3 + 2 * i if i < 5 else 20,), generator=g).tolist()
        for k in range(4):
            out.append((context, torch.randint(1, VOCAB, (1 + k % 3,), generator=g).tolist()))
    return out


def _alone(model, requests, batch_size: int) -> list[engine.Scored]:
    model.eval()
    with torch.no_grad():
        return engine.score(engine.for_transformer(model, max_len=16), requests, batch_size)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_stacked_scores_equal_each_members_own(shape):
    """Every member's summed log-probability, greedy flag and token count from one stacked pass equal its own
    model's pass bit for bit (dense, grouped-query, latent attention, experts, an untied head with QK-norm); a
    subset of members in any order scores as those members."""
    models = _models(shape)
    alone = [copy.deepcopy(m) for m in models]
    stack = Stack(models)
    requests = _requests()
    want = [_alone(model, requests, batch_size=5) for model in alone]
    stack.loss_module.eval()
    with torch.no_grad():
        got = engine.score_members(stack_eval.for_stack(stack, max_len=16), requests, batch_size=5)
        subset = engine.score_members(stack_eval.for_stack(stack, [2, 0], max_len=16), requests, batch_size=5)
    assert got == want
    assert subset == [want[2], want[0]]
    assert len({round(s.logprob, 6) for s in got[0]}) > 10 and got[0] != got[1]  # real scores, members differ
    assert any(s.truncated for s in got[0])


def test_one_model_and_a_stack_are_not_mixed_up():
    stack = Stack(_models("gqa"))
    lm = stack_eval.for_stack(stack)
    with pytest.raises(ValueError, match="score_members scores it"):
        engine.score(lm, _requests(4))
    with pytest.raises(ValueError, match="score scores it"):
        engine.score_members(engine.for_transformer(_models("gqa")[0]), _requests(4))
    with pytest.raises(ValueError, match=r"allowed: one or more of 0\.\.2"):
        stack_eval.for_stack(stack, [3])


EVALS = {"eval.tasks": "arc_easy,copa", "eval.every": 4, "eval.limit": 6, "eval.batch_size": 8}


def _evals(trainer) -> list[dict]:
    rows = rundir.read_jsonl(trainer.run_dir / rundir.EVALS)
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def _items(trainer) -> dict[str, list]:
    folder = trainer.run_dir / "eval_items"
    return {str(p.relative_to(folder)): p.read_text().splitlines() for p in sorted(folder.rglob("*.jsonl"))}


def test_a_stacked_runs_evals_equal_its_lone_runs_scored_in_one_pass(tmp_path, monkeypatch):
    """Three seeds of the tiny experiment, evaluated every 4 of 8 steps on two real tasks: stacked, every member's
    evals.jsonl (but its seconds), eval items and summary equal its lone run's, bit for bit; the stack scored each
    evaluation in one pass for all three (no member scored alone)."""
    steps = 8
    lone = _trainers(tmp_path / "lone", steps, **EVALS)
    for trainer in lone:
        for _ in range(steps):
            trainer.train_step()
    members = _trainers(tmp_path / "stack", steps, **EVALS)
    stacked = StackedTrainer(members)
    passes = []
    score_members = engine.score_members
    monkeypatch.setattr(engine, "score", lambda *a, **k: pytest.fail("a stack's member scored alone"))
    monkeypatch.setattr(
        engine, "score_members", lambda lm, *a, **k: passes.append(lm.members) or score_members(lm, *a, **k)
    )
    for _ in range(steps):
        stacked.train_step()
    assert not stacked.failed
    assert passes == [3] * 4  # two evaluations, two tasks each: a pass per task for all three members
    for alone, member in zip(lone, members):
        assert _evals(member) == _evals(alone) and [r["step"] for r in _evals(member)] == [4, 4, 8, 8]
        assert _items(member) == _items(alone) and sum(name.endswith("_cf.jsonl") for name in _items(member)) == 4
        assert member.summary()["evals"] == alone.summary()["evals"]
    assert len({json.dumps(_items(m)) for m in members}) == 3  # the members' scores differ


def test_members_due_at_different_steps_score_alone(tmp_path):
    """A member whose evaluation falls at another step (its own eval.every) is scored alone, as its lone run is;
    the two that share a step are scored together, and every evals.jsonl is its lone run's."""
    steps = 4
    own = [{"eval.every": 2}, {"eval.every": 2}, {"eval.every": 4}]
    fields = {k: v for k, v in EVALS.items() if k != "eval.every"}
    lone = [t for s, o in zip((0, 1, 2), own) for t in _trainers(tmp_path / "lone", steps, (s,), **fields, **o)]
    for trainer in lone:
        for _ in range(steps):
            trainer.train_step()
    members = [t for s, o in zip((0, 1, 2), own) for t in _trainers(tmp_path / "stack", steps, (s,), **fields, **o)]
    stacked = StackedTrainer(members)
    for _ in range(steps):
        stacked.train_step()
    for alone, member in zip(lone, members):
        assert _evals(member) == _evals(alone)
    assert [r["step"] for r in _evals(members[0])] == [2, 2, 4, 4]
    assert [r["step"] for r in _evals(members[2])] == [4, 4]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_stacked_validation_losses_equal_each_members_own(shape):
    """One vmapped per_token_loss over the stack gives each member's validation losses of its own model, bit for
    bit in fp32 (dense, grouped-query, latent attention, experts, an untied head with QK-norm), a subset too."""
    models = _models(shape)
    alone = [copy.deepcopy(m).eval() for m in models]
    stack = Stack(models)
    g = torch.Generator().manual_seed(5)
    inputs, targets = torch.randint(0, VOCAB, (2, 3, 16), generator=g)
    targets[1, 10:] = -100  # a window ending early: ignored positions
    with torch.no_grad():
        want = [model.per_token_loss(inputs, targets) for model in alone]
        with stack_eval.eval_mode(stack.loss_module):
            got = stack_eval.stacked_token_losses(stack, [0, 1, 2])(inputs, targets)
            subset = stack_eval.stacked_token_losses(stack, [2, 1])(inputs, targets)
    assert got.shape == (3, 3, 16) and all(torch.equal(got[k], want[k]) for k in range(3))
    assert torch.equal(subset[0], want[2]) and torch.equal(subset[1], want[1])
    assert not torch.equal(want[0], want[1]) and (want[0][1, 10:] == 0).all()


def _val_rows(trainer) -> list[dict]:
    trainer.end()
    return [r for r in rundir.read_jsonl(trainer.run_dir / rundir.METRICS) if "val/loss" in r]


def test_a_stacked_runs_validation_equals_its_lone_runs_in_one_pass(tmp_path, monkeypatch):
    """Three seeds validating every 2, 4 and 4 of 4 steps: at step 2 the first validates alone, at step 4 all
    three in one stacked pass; every member's val/loss, val/bpb, per-document items and summary equal its lone
    run's, bit for bit."""
    from ablate.training.callbacks.validation import Validation

    steps, cadences = 4, (2, 4, 4)
    lone = [
        t for s, e in enumerate(cadences) for t in _trainers(tmp_path / "lone", steps, (s,), **{"train.val_every": e})
    ]
    for trainer in lone:
        for _ in range(steps):
            trainer.train_step()
    members = [
        t for s, e in enumerate(cadences) for t in _trainers(tmp_path / "stack", steps, (s,), **{"train.val_every": e})
    ]
    passes, document_nats = [], Validation.document_nats

    def recorded(self, trainer, per_token_loss=None):
        nats = document_nats(self, trainer, per_token_loss)
        passes.append((trainer.step if per_token_loss is None else trainer.step + 1, nats.shape))
        return nats

    monkeypatch.setattr(Validation, "document_nats", recorded)
    stacked = StackedTrainer(members)
    for _ in range(steps):
        stacked.train_step()
    assert not stacked.failed
    documents = passes[0][1][0]
    assert passes == [(2, (documents,)), (4, (3, documents))] and documents > 1
    for alone, member in zip(lone, members):
        assert member.summary()["final_val_loss"] == alone.summary()["final_val_loss"]
        assert _val_rows(member) == _val_rows(alone)
        items = [name for name in _items(member) if name.endswith("val_loss.jsonl")]
        assert items and all(_items(member)[name] == _items(alone)[name] for name in items)
    assert [r["step"] for r in _val_rows(members[0])] == [2, 4] and len(
        {_val_rows(m)[-1]["val/loss"] for m in members}
    ) == 3


@pytest.mark.parametrize("shape", list(SHAPES))
def test_stacked_stability_values_equal_each_members_own(shape):
    """One vmapped stability_values over the stack gives each member's attention logit maxima and output logit
    norms of its own model, bit for bit in fp32, with document masks and without, a subset too."""
    models = _models(shape)
    alone = [copy.deepcopy(m) for m in models]
    stack = Stack(models)
    g = torch.Generator().manual_seed(6)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=g)
    doc_ids = torch.randint(0, 2, (2, 16), generator=g).cumsum(-1)
    for docs in (None, doc_ids):
        with torch.no_grad():
            want = [model.stability_values(tokens, docs) for model in alone]
            got = stack_eval.stacked_stability_values(stack, [0, 1, 2])(tokens, docs)
            subset = stack_eval.stacked_stability_values(stack, [2, 0])(tokens, docs)
        assert got.shape == (3, len(models[0].layers) + 1) and all(torch.equal(got[k], want[k]) for k in range(3))
        assert torch.equal(subset[0], want[2]) and torch.equal(subset[1], want[0])
        assert not torch.equal(want[0], want[1])


def _stability_rows(trainer) -> list[dict]:
    trainer.end()
    rows = rundir.read_jsonl(trainer.run_dir / rundir.METRICS)
    return [
        {k: v for k, v in r.items() if k.startswith("stability/") or k == "step"}
        for r in rows
        if "stability/output_logit_norm" in r
    ]


def test_a_stacked_runs_stability_monitors_equal_its_lone_runs_in_one_pass(tmp_path, monkeypatch):
    """Three seeds monitoring every 2, 4 and 4 of 4 steps: at step 2 the first measures its logits alone, at step 4
    all three in one stacked pass; every member's stability figures (logit maxima and norms, update ratios) equal
    its lone run's, bit for bit."""
    from ablate.model import Transformer

    steps, cadences = 4, (2, 4, 4)

    def trainers(root):
        return [
            t
            for s, e in enumerate(cadences)
            for t in _trainers(root, steps, (s,), **{"train.monitor_every": e, "train.log_every": e})
        ]

    lone = trainers(tmp_path / "lone")
    for trainer in lone:
        for _ in range(steps):
            trainer.train_step()
    members = trainers(tmp_path / "stack")
    alone_calls, stacked_passes = [], []
    stability_stats, stacked_values = Transformer.stability_stats, stack_eval.stacked_stability_values

    def counted_alone(self, *args):
        alone_calls.append(members.index(next(m for m in members if m.model is self)))
        return stability_stats(self, *args)

    def counted_stacked(stack, chosen):
        stacked_passes.append(list(chosen))
        return stacked_values(stack, chosen)

    monkeypatch.setattr(Transformer, "stability_stats", counted_alone)
    monkeypatch.setattr(stack_eval, "stacked_stability_values", counted_stacked)
    stacked = StackedTrainer(members)
    for _ in range(steps):
        stacked.train_step()
    assert not stacked.failed
    assert alone_calls == [0] and stacked_passes == [[0, 1, 2]]
    for alone, member in zip(lone, members):
        assert _stability_rows(member) == _stability_rows(alone)
    rows = [_stability_rows(m) for m in members]
    assert [r["step"] for r in rows[0]] == [2, 4] and [r["step"] for r in rows[1]] == [4]
    assert (
        "stability/update_ratio/layer0" in rows[0][-1]
        and len({r[-1]["stability/output_logit_norm"] for r in rows}) == 3
    )
