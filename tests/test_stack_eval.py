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
