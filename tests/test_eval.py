"""The cloze eval suite: tasks, engine (against a token-by-token computation), metrics, the training hook and its
files, `ablate eval`, export to transformers, and agreement with lm-eval's HF backend."""

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

import ablate_evals
from ablate.config import ConfigError, ModelConfig
from ablate.eval import engine, suite
from ablate.eval.metrics import METRICS, METRICS_BY_KIND, ItemScores, item_metrics, predictions
from ablate.eval.tasks import LETTERS, render, requests_for
from ablate.model import Transformer
from ablate.setup.experiment import ExperimentError, load_experiment
from ablate.setup.overrides import apply_overrides
from ablate.training.run import run_dir_for, train
from conftest import TINY, cli_in_process, run_cli

EVAL_TASKS = "arc_easy,copa,winogrande"


def random_model(max_len: int, **knobs) -> Transformer:
    model = Transformer(ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4, **knobs), max_seq_len=max_len)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def test_every_task_builds_valid_items():
    assert len(ablate_evals.SUITES["core"]) == 11 and list(ablate_evals.SUITES["all"]) == list(ablate_evals.TASKS)
    for name, task in ablate_evals.TASKS.items():
        items = task.items(15)
        assert len(items) == min(15, len(task.rows()))
        assert [i.id for i in task.items(5)] == [i.id for i in items[:5]]  # a smaller limit is a prefix
        assert len({i.id for i in task.items(None)}) == len(task.rows()), name  # ids are unique
        for item in items:
            assert 0 <= item.gold < len(item.continuations) == len(item.choice_texts)
            assert len(item.contexts) in (1, len(item.continuations))
            assert all(c.strip() for c in item.contexts) and all(c.startswith(" ") for c in item.continuations)
            contexts, letters = render(item, "mcf")
            assert letters[item.gold] == f" {LETTERS[item.gold]}" and item.choice_texts[-1] in contexts[0]
        assert task.primary_for("cf") in METRICS_BY_KIND[task.kind]
        assert task.primary_for("mcf") == ("acc_raw" if task.kind == "choice" else task.primary)  # one continuation


def test_sciq_answers_are_not_always_last():
    golds = {item.gold for item in ablate_evals.TASKS["sciq"].items(40)}
    assert len(golds) > 2


@pytest.mark.parametrize("knobs", [{}, {"n_kv_heads": 2, "qk_norm": True}])
def test_engine_equals_token_by_token(tokenizer, knobs):
    """Prefix-shared rows, one-row-per-request rows and a plain loop over each request agree; long contexts are
    cut from the left and counted."""
    max_len = 40
    model = random_model(max_len, **knobs)
    requests = []
    for name in ("arc_easy", "hellaswag", "winogrande"):
        for item in ablate_evals.TASKS[name].items(6):
            for fmt in ("cf", "mcf"):
                conditional, unconditional = requests_for(item, fmt)
                requests += conditional + unconditional
    encoded = engine.encode(tokenizer, requests)
    shared = engine.score(engine.for_transformer(model), encoded, batch_size=5)
    flat = engine.score(engine.for_logits_fn(lambda t: model(t), max_len), encoded, batch_size=3)
    truncated = 0
    for (ctx, cont), a, b in zip(encoded, shared, flat):
        truncated_here = len(ctx) + len(cont) - 1 > max_len
        cont = cont[-max_len:]  # a continuation longer than the model keeps its end (lm-eval refuses those)
        whole = (ctx + cont)[-(max_len + 1) :]
        with torch.no_grad():
            logprobs = F.log_softmax(model(torch.tensor([whole[:-1]])).float(), -1)[0]
        start = len(whole) - len(cont) - 1
        expected = sum(logprobs[start + j, t].item() for j, t in enumerate(cont))
        greedy = all(logprobs[start + j].argmax().item() == t for j, t in enumerate(cont))
        assert a.logprob == pytest.approx(expected, abs=1e-4) and b.logprob == pytest.approx(expected, abs=1e-4)
        assert a.greedy == b.greedy == greedy and a.tokens == len(cont)
        assert a.truncated == b.truncated == truncated_here
        truncated += a.truncated
    assert 0 < truncated < len(encoded)


def test_prefix_sharing_runs_each_context_once(tokenizer):
    items = ablate_evals.TASKS["arc_easy"].items(4)
    requests = [r for item in items for r in requests_for(item, "cf")[0]]
    rows, _ = engine.build_rows(engine.encode(tokenizer, requests), max_len=256, shares_prefix=True)
    assert len(rows) == 4  # one row per question, its choices packed after it
    rows, _ = engine.build_rows(engine.encode(tokenizer, requests), max_len=256, shares_prefix=False)
    assert len(rows) == len(requests)
    letters = [(ctx, [letter]) for ctx in ([5, 6, 7], [5, 6, 8]) for letter in (10, 11, 12, 13)]
    rows, _ = engine.build_rows(letters, max_len=256, shares_prefix=False)
    assert [r.tokens for r in rows] == [[5, 6, 7], [5, 6, 8]]  # one-token continuations (MCF letters) share
    assert [t[:2] for t in rows[0].targets] == [(2, 10), (2, 11), (2, 12), (2, 13)]  # their context's row always


def test_identical_requests_are_scored_once():
    model = random_model(40)
    rows_seen = []

    def logits(tokens):
        rows_seen.append(tokens.shape[0])
        return model(tokens)

    encoded = [([5, 6, 7], [10, 11])] * 3 + [([5, 6, 7], [12, 13]), ([8], [10])] * 2
    scored = engine.score(engine.for_logits_fn(logits, 40), encoded, batch_size=8)
    assert sum(rows_seen) == 3  # three distinct requests, one row each
    assert scored[0] == scored[1] == scored[2] and scored[3] == scored[5] and scored[4] == scored[6]
    assert scored[0].logprob != scored[3].logprob


def test_metrics_from_log_likelihoods():
    s = ItemScores(
        logprobs=[-4.0, -6.0, -9.0],
        unconditional=[-1.0, -5.0, -8.0],
        tokens=[2, 2, 3],
        chars=[2, 6, 12],
        bytes=[2, 6, 12],
        gold=1,
    )
    assert predictions(s) == {"raw": 0, "per_token": 0, "per_char": 2, "pmi": 1, "choices_only": 0}
    m = item_metrics(s)
    assert (m["acc_raw"], m["acc_per_char"], m["acc_pmi"], m["acc_choices_only"]) == (0.0, 0.0, 1.0, 0.0)
    assert m["gold_logprob"] == -6.0 and m["gold_bpb"] == pytest.approx(6 / (math.log(2) * 6))
    assert m["margin_loglik"] == pytest.approx(-6 - (-4 - 9) / 2)
    assert m["margin_pmi"] == pytest.approx(-1 - (-3 - 1) / 2)
    assert m["margin"] == pytest.approx(math.exp(-6 / 6) - math.exp(-9 / 12))  # per char: -2, -1, -0.75
    total = math.exp(-4) + math.exp(-6) + math.exp(-9)
    assert m["gold_prob"] == pytest.approx(math.exp(-6) / total)


def test_bad_eval_input_is_refused_by_name(tmp_path):
    run = load_experiment(TINY, only=["mha"])[0]
    unknown = r"eval.tasks: unknown task 'arc_ez'; allowed: arc_easy, arc_challenge"
    with pytest.raises(ExperimentError, match=unknown):  # checked where experiments load (config imports no suite)
        load_experiment(TINY, only=["mha"], overrides={"eval.tasks": "arc_easy,arc_ez"})
    with pytest.raises(ConfigError, match=unknown):  # and where training starts, before a run folder exists
        train(dataclasses.replace(run, eval=dataclasses.replace(run.eval, tasks="arc_easy,arc_ez")), tmp_path)
    assert not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="eval.format"):
        apply_overrides(run, {"eval.format": "gen"})
    with pytest.raises(ValueError, match="--format: 'x'; allowed: cf, mcf"):
        suite.check_format("x")


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """The tiny experiment with the eval hook every 4 steps (seq_len 128 so few contexts are cut)."""
    out = tmp_path_factory.mktemp("evalruns")
    run = load_experiment(
        TINY,
        only=["mha"],
        overrides={"data.seq_len": "128", "eval.tasks": EVAL_TASKS, "eval.every": "4", "eval.limit": "12"},
    )[0]
    summary = train(run, out)
    return run_dir_for(out, run), summary


def test_training_hook_writes_evals(eval_run):
    run_dir, summary = eval_run
    lines = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert [(r["step"], r["task"]) for r in lines] == [(s, t) for s in (4, 8) for t in EVAL_TASKS.split(",")]
    for r in lines:
        assert set(r) == {
            "step",
            "tokens",
            "task",
            "format",
            "n",
            "chance",
            "primary",
            "metrics",
            "stderr",
            "truncated",
            "seconds",
        }
        assert r["n"] == 12 and r["format"] == "cf" and r["tokens"] == r["step"] * 8 * 128
        assert set(r["metrics"]) == set(r["stderr"]) == set(METRICS)
        items = [
            json.loads(x)
            for x in (run_dir / "eval_items" / f"step_{r['step']:07d}" / f"{r['task']}_cf.jsonl")
            .read_text()
            .splitlines()
        ]
        assert len(items) == 12 and {"id", "gold", *METRICS} <= set(items[0])
        assert sum(i["acc_raw"] for i in items) / 12 == pytest.approx(r["metrics"]["acc_raw"])
    assert lines[0]["chance"] == 0.25 and lines[1]["chance"] == 0.5
    assert set(summary["evals"]) == set(EVAL_TASKS.split(","))
    assert summary["evals"]["arc_easy"]["primary"] == "acc_per_char"
    assert summary["evals"]["copa"]["value"] == lines[-2]["metrics"]["acc_raw"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    assert "eval/copa_cf/acc_raw" in events.Tags()["scalars"]


@pytest.mark.slow
def test_cli_eval_matches_the_hook_and_logs_samples(eval_run, tmp_path):
    run_dir, _ = eval_run
    samples = tmp_path / "samples.jsonl"
    result = run_cli("eval", str(run_dir), "--tasks", "copa,arc_easy", "--limit", "12", "--log-samples", str(samples))
    assert "acc_per_char" in result.stdout and "copa" in result.stdout
    assert "tokens, fp32)" in result.stdout  # the run's train.dtype, auto: fp32 on CPU
    assert "replaced an earlier evaluation's items at step 8" in result.stdout and "-> 12)" in result.stdout
    lines = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    by_task = {r["task"]: r for r in lines[:6] if r["step"] == 8}  # the hook's final evaluation
    for r in lines[-2:]:  # the CLI's
        assert r["step"] == 8 and r["metrics"]["acc_raw"] == pytest.approx(by_task[r["task"]]["metrics"]["acc_raw"])
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    requests = [r for r in rows if r["type"] == "request"]
    items = [r for r in rows if r["type"] == "item"]
    assert len(items) == 24 and len(requests) == 2 * (12 * 2 + sum(len(i["choices"]) for i in items[12:]))
    assert {"context", "continuation", "tokens", "chars", "logprob", "greedy"} <= set(requests[0])
    assert set(items[0]["predictions"]) == {"raw", "per_token", "per_char", "pmi", "choices_only"}


@pytest.mark.slow
def test_cli_eval_in_bf16_is_close_to_fp32(eval_run, tmp_path):
    run_dir, _ = eval_run
    logprobs = {}
    for dtype in ("fp32", "bf16"):
        samples = tmp_path / f"{dtype}.jsonl"
        out = run_cli(
            "eval",
            str(run_dir),
            "--tasks",
            "arc_easy",
            "--limit",
            "12",
            "--no-write",
            "--dtype",
            dtype,
            "--log-samples",
            str(samples),
        )
        assert f"tokens, {dtype})" in out.stdout
        logprobs[dtype] = [
            r["logprob"] for r in map(json.loads, samples.read_text().splitlines()) if r["type"] == "request"
        ]
    differences = [abs(a - b) for a, b in zip(logprobs["fp32"], logprobs["bf16"])]
    assert len(differences) == 2 * 48 and 0 < max(differences) < 0.5  # bf16 ran, and stayed close


def test_cli_refuses_bad_input(tmp_path):
    result = cli_in_process("eval", str(tmp_path), check=False)
    assert result.returncode == 2 and "neither a run folder" in result.stderr
    result = cli_in_process("eval", str(tmp_path), "--tasks", "nope", check=False)
    assert result.returncode == 2 and "--tasks: unknown task 'nope'; allowed: arc_easy" in result.stderr


@pytest.mark.parametrize("qk_norm", [False, True])
def test_export_logits_equal(tmp_path, qk_norm):
    from transformers import AutoModelForCausalLM

    from ablate.eval.export import hf_config, hf_state_dict

    model = random_model(64, n_kv_heads=2, qk_norm=qk_norm, tie_embeddings=not qk_norm, rope_base=500.0)
    hf = AutoModelForCausalLM.from_config(hf_config(model.cfg, 64, 0), dtype=torch.float32)
    hf.load_state_dict(hf_state_dict(model.state_dict(), model.cfg), strict=True)
    hf.save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM")
    tokens = torch.randint(0, 300, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, model(tokens), atol=1e-4, rtol=1e-4)


def test_export_refuses_unrepresentable_knobs():
    from ablate.eval.export import check_exportable

    for knobs, field in [
        ({"ffn": "gelu"}, "model.ffn"),
        ({"norm": "layernorm"}, "model.norm"),
        ({"rope_fraction": 0.5}, "model.rope_fraction"),
        ({"pos": "nope"}, "model.pos"),
        ({"rope_skip_every": 2}, "model.rope_skip_every"),
    ]:
        with pytest.raises(NotImplementedError, match=field):
            check_exportable(ModelConfig(**knobs))


@pytest.mark.slow
def test_agreement_with_lm_eval_hf(eval_run, tmp_path):
    """ablate's engine on the ablate model vs lm-eval's HF backend on the exported model: same items, same
    chosen answers, same accuracies."""
    from ablate.eval import agreement
    from ablate.eval.load import load_model

    run_dir, _ = eval_run
    result = run_cli("export", str(run_dir), "--hf", str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "model.safetensors").is_file() and "wrote" in result.stdout
    loaded = load_model(run_dir)
    tasks = ["arc_easy", "winogrande", "boolq"]  # boolq: long passages, cut from the left by both tools
    ours = suite.evaluate(
        engine.for_transformer(loaded.model), loaded.tokenizer(), tasks, limit=30, batch_size=8, log_samples=True
    )
    reference = agreement.run_lm_eval_hf(str(tmp_path / "hf"), tasks, limit=30, batch_size=8)
    for task, row in agreement.compare(ours, reference).items():
        assert row["items"] == 30
        assert row["same_raw"] >= 0.995 and row["acc_raw_diff_points"] <= 0.2, (task, row)
        if "same_per_char" in row:
            assert row["same_per_char"] >= 0.995 and row["acc_per_char_diff_points"] <= 0.2, (task, row)


@pytest.mark.slow
def test_lm_eval_command_runs_the_ablate_model(eval_run, tmp_path):
    """`ablate-lm-eval --model ablate`: lm-eval's own command, in a fresh process, with the model registered by
    ablate (no start-up hook), scores ablate's task configs as ablate's engine does."""
    import subprocess
    import sys
    from pathlib import Path

    from ablate.eval.load import load_model
    from ablate_evals.lm_eval_tasks import PATH

    run_dir, _ = eval_run
    command = [
        str(Path(sys.executable).with_name("ablate-lm-eval")),
        "--model",
        "ablate",
        "--model_args",
        f"path={run_dir}",
        "--tasks",
        "ablate_copa,ablate_arc_easy",
        "--include_path",
        str(PATH),
        "--limit",
        "12",
        "--batch_size",
        "8",
        "--device",
        "cpu",
        "--output_path",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    loaded = load_model(run_dir)
    for r in suite.evaluate(engine.for_transformer(loaded.model), loaded.tokenizer(), ["copa", "arc_easy"], limit=12):
        assert results[f"ablate_{r.task}"]["acc,none"] == pytest.approx(r.metrics["acc_raw"])
        assert results[f"ablate_{r.task}"]["acc_norm,none"] == pytest.approx(r.metrics["acc_per_char"])


@pytest.mark.slow
def test_fsdp_eval_equals_one_process(eval_run, tmp_path):
    """Under torchrun with 2 FSDP ranks each rank scores a share of the rows; the gathered results equal one
    process's (the 2-rank model equals the 1-rank one to ~1e-6)."""
    run_dir, _ = eval_run
    run_cli(
        "run",
        str(TINY),
        "--only",
        "mha",
        "--out",
        str(tmp_path),
        "--set",
        "data.seq_len=128",
        "--set",
        f"eval.tasks={EVAL_TASKS}",
        "--set",
        "eval.every=4",
        "--set",
        "eval.limit=12",
        torchrun_procs=2,
    )
    for task in EVAL_TASKS.split(","):
        name = f"eval_items/step_0000008/{task}_cf.jsonl"
        one = [json.loads(x) for x in (run_dir / name).read_text().splitlines()]
        two = [json.loads(x) for x in (tmp_path / "tiny" / "mha" / "seed0" / name).read_text().splitlines()]
        assert [r["id"] for r in one] == [r["id"] for r in two]
        for a, b in zip(one, two):
            assert a["gold_logprob"] == pytest.approx(b["gold_logprob"], abs=1e-3)
            assert a["margin_loglik"] == pytest.approx(b["margin_loglik"], abs=1e-3)
