"""The LAMBADA and basic_skills tasks: items from the oe-eval request files, LAMBADA's continuation metrics against a
direct computation with the model's logits, both task kinds through the suite's files and table, and the same
answers as lm-eval's HF backend on an exported model.

The model is an ablate Transformer set to be a bigram model of the LAMBADA items' own text (one-hot embeddings,
attention and MLP outputs zeroed, the output projection holding log P(next | previous)): it reproduces some final
words greedily, so the greedy flags are compared on hits as well as misses."""

import gzip
import json
import math

import pytest
import torch
import torch.nn.functional as F

import ablate_evals
from ablate.config import ModelConfig
from ablate.eval import engine, suite
from ablate.eval.metrics import CONTINUATION_METRICS, METRICS
from ablate.eval.tasks import _load_requests, package_root, render
from ablate.model import Transformer

BASIC_SKILLS = [task.name for task in ablate_evals.basic_skills.TASKS]
VOCAB, MAX_LEN, EOS = 512, 1024, "<|endoftext|>"
N_LAMBADA = 24  # items scored in the tests below (the first of ablate's fixed subsample order)

# (task, items, the item of the file's first document: id, gold, gold continuation, end of its context)
FIRST_ITEMS = [
    ("lambada", 5153, 0, 0, " signs", "his mouth curved in a confident grin, I don't care about"),
    ("basic_skills_arithmetic", 1047, "0", 3, " 32", "7 - 4 + 10 = 13\n\n4 * 8 ="),
    ("basic_skills_coding", 1012, "0", 2, " a + b", '"""Return the sum of a and b."""\n    return'),
    ("basic_skills_common_knowledge", 1037, "0", 2, " four", "is pen\n\nThe number of legs of a cat is"),
    (
        "basic_skills_logical_reasoning",
        1118,
        "0",
        2,
        " Hence, a whale is warm-blooded.",
        "not a poem.\n\nAll mammals are warm-blooded. A whale is a mammal.",
    ),
    ("basic_skills_pattern", 534, "0", 2, " 10", "Tertiary\n\nB E H K\n\n2 4 6 8"),
    ("basic_skills_string_operations", 1219, "0", 2, " 5", "is dcba\n\nThe length of the string 'hello' is"),
]


@pytest.mark.parametrize("name,count,item_id,gold,answer,context_end", FIRST_ITEMS)
def test_items_from_request_files(name, count, item_id, gold, answer, context_end):
    task = ablate_evals.TASKS[name]
    rows = task.rows()
    assert len(rows) == count  # oe-eval's unconditional copies ("Answer:", doc_id + 1e6) are not items
    first = task.build(rows[0], 0)
    assert (first.id, first.gold, first.continuations[first.gold]) == (item_id, gold, answer)
    assert len(first.contexts) == 1 and first.contexts[0].endswith(context_end)
    assert not any(i.contexts[0] == "Answer:" for i in task.items(None))
    assert [i.id for i in task.items(7)] == [i.id for i in task.items(20)[:7]]
    assert task.kind == ("continuation" if name == "lambada" else "choice")
    assert task.primary == ("gold_bpb" if name == "lambada" else "acc_per_token")


@pytest.mark.parametrize("name", BASIC_SKILLS)
def test_basic_skills_mcf_is_the_shipped_5shot_context(name):
    """MCF renders exactly the mc_5shot request file's context and letters for the same document."""
    with gzip.open(package_root() / "oe_eval_tasks" / name / "mc_5shot" / "requests.jsonl.gz", "rt") as f:
        first = [r for r in map(json.loads, f) if r["doc_id"] == 0]
    item = ablate_evals.TASKS[name].build(ablate_evals.TASKS[name].rows()[0], 0)
    contexts, letters = render(item, "mcf")
    assert contexts == [first[0]["request"]["context"]] and letters == [r["request"]["continuation"] for r in first]
    assert contexts[0].count("\nAnswer:") == 6  # five solved examples, then the question


def test_request_loader_refuses_what_it_cannot_score(tmp_path):
    def write(lines):
        (tmp_path / "config.json").write_text(json.dumps({"task_config": {}}))
        with gzip.open(tmp_path / "requests.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)

    def request(doc_id, context, kind="loglikelihood"):
        return {
            "request_type": kind,
            "doc": {},
            "request": {"context": context, "continuation": " x"},
            "idx": 0,
            "doc_id": doc_id,
            "native_id": doc_id % 1_000_000,
            "label": 0,
        }

    write([request(0, "Q"), request(1_000_000, "Answer:")])
    assert [r["contexts"] for r in _load_requests(tmp_path)] == [["Q"]]  # the offset's default applies
    write([request(0, "Q"), request(1_000_000, "Q")])
    with pytest.raises(ValueError, match="doc_id 1000000 is past the unconditional offset 1000000 but its context"):
        _load_requests(tmp_path)
    write([request(0, "Q", "generate_until")])
    with pytest.raises(ValueError, match="request type 'generate_until'; ablate scores only 'loglikelihood'"):
        _load_requests(tmp_path)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [r["contexts"][0] + r["continuations"][0] for r in ablate_evals.TASKS["lambada"].rows()[:300]]
    texts += [r["contexts"][0] for name in BASIC_SKILLS for r in ablate_evals.TASKS[name].rows()[:20]]
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    assert tok.get_vocab_size() == VOCAB
    return tok


@pytest.fixture(scope="module")
def bigram(tokenizer):
    """log P(next | previous) counted over the scored LAMBADA items (passage + final word; a step into the final
    word counts 10 times, so that some final words, not all, are the greedy continuation), add-0.1 smoothed, with
    noise far below the counts' steps so no two tokens tie for the argmax."""
    counts = torch.full((VOCAB, VOCAB), 0.1, dtype=torch.float64)
    for item in ablate_evals.TASKS["lambada"].items(N_LAMBADA):
        context = len(tokenizer.encode(item.contexts[0]).ids)
        ids = tokenizer.encode(item.contexts[0] + item.continuations[0]).ids
        for j, (a, b) in enumerate(zip(ids, ids[1:])):
            counts[a, b] += 10 if j + 1 >= context else 1
    logp = (counts / counts.sum(1, keepdim=True)).log().float()
    logp += 1e-3 * torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0))
    model = Transformer(
        ModelConfig(vocab_size=VOCAB, d_model=VOCAB, n_layers=1, n_heads=4, ffn_hidden=32, tie_embeddings=False),
        max_seq_len=MAX_LEN,
    )
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # RMSNorm maps sqrt(V) * one-hot(x) to itself: the logits are logp[x]
        model.embed.weight.copy_(torch.eye(VOCAB) * math.sqrt(VOCAB))
        model.lm_head.weight.copy_(logp.T / math.sqrt(VOCAB))
        model.layers[0].attn.o_proj.weight.zero_()
        model.layers[0].ffn.down_proj.weight.zero_()
        model.norm.weight.fill_(1.0)
    return model.eval()


def test_lambada_metrics_equal_a_direct_computation(bigram, tokenizer):
    task = ablate_evals.TASKS["lambada"]
    result = suite.evaluate_task(
        engine.for_transformer(bigram), tokenizer, task, limit=N_LAMBADA, batch_size=4, log_samples=True
    )
    assert set(result.metrics) == set(CONTINUATION_METRICS) and result.chance == 0.0
    assert result.primary == "gold_bpb" and result.truncated == 0
    assert sum(s["type"] == "request" for s in result.samples) == N_LAMBADA  # no unconditional pass
    hits = 0
    for item, row in zip(task.items(N_LAMBADA), result.items):
        context, word = item.contexts[0], item.continuations[0]
        ctx = tokenizer.encode(context).ids
        whole = tokenizer.encode(context + word).ids
        assert whole[: len(ctx)] == ctx
        with torch.no_grad():
            logprobs = F.log_softmax(bigram(torch.tensor([whole[:-1]])).double(), -1)[0]
        targets = whole[len(ctx) :]
        steps = [logprobs[len(ctx) - 1 + j] for j in range(len(targets))]
        logprob = sum(step[t].item() for step, t in zip(steps, targets))
        greedy = all(step.argmax().item() == t for step, t in zip(steps, targets))
        hits += greedy
        assert row["id"] == item.id and row["acc_greedy"] == float(greedy)
        assert row["gold_logprob"] == pytest.approx(logprob, abs=1e-3)
        assert row["gold_bpb"] == pytest.approx(-logprob / (math.log(2) * len(word.encode())), abs=1e-4)
        assert row["correct_prob"] == pytest.approx(math.exp(logprob / len(word)), rel=1e-3)
    assert 0 < hits < N_LAMBADA  # the bigram model reproduces some final words, not all
    assert result.metrics["acc_greedy"] == pytest.approx(hits / N_LAMBADA)
    mcf = suite.evaluate_task(engine.for_transformer(bigram), tokenizer, task, "mcf", limit=N_LAMBADA)
    assert mcf.metrics == pytest.approx(result.metrics)  # no choices to letter: the same request in either format


def test_both_kinds_through_the_suite_files_and_table(bigram, tokenizer, tmp_path):
    lm = engine.for_transformer(bigram)
    results = suite.evaluate(lm, tokenizer, ["lambada", "basic_skills_pattern"], limit=6, batch_size=8)
    suite.write_results(tmp_path, 10, 1000, results)
    lines = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [(r["task"], r["primary"], r["chance"]) for r in lines] == [
        ("lambada", "gold_bpb", 0.0),
        ("basic_skills_pattern", "acc_per_token", pytest.approx(0.25, abs=0.05)),
    ]
    assert set(lines[0]["metrics"]) == set(CONTINUATION_METRICS) and set(lines[1]["metrics"]) == set(METRICS)
    items = [
        json.loads(x) for x in (tmp_path / "eval_items" / "step_0000010" / "lambada_cf.jsonl").read_text().splitlines()
    ]
    assert len(items) == 6 and set(items[0]) == {"id", "gold", *CONTINUATION_METRICS}
    table = suite.results_table(results).splitlines()
    assert "greedy" in table[0] and "ncprob" in table[0]
    lambada, pattern = table[2].split(), table[3].split()
    assert lambada[:5] == ["lambada", "cf", "6", "0.000", "gold_bpb"] and lambada.count("-") == 6
    assert pattern[0] == "basic_skills_pattern" and pattern.count("-") == 1  # acc_greedy only
    summary = suite.summary_entry(results)
    assert summary["lambada"]["value"] == results[0].metrics["gold_bpb"]


def save_hf(model: Transformer, tokenizer, out) -> str:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from ablate.eval.export import hf_config, hf_state_dict

    hf = AutoModelForCausalLM.from_config(
        hf_config(model.cfg, MAX_LEN, tokenizer.token_to_id(EOS)), dtype=torch.float32
    )
    hf.load_state_dict(hf_state_dict(model.state_dict(), model.cfg), strict=True)
    hf.save_pretrained(out)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, pad_token=EOS, model_max_length=MAX_LEN
    ).save_pretrained(out)
    return str(out)


@pytest.mark.slow
def test_agreement_with_lm_eval_hf(bigram, tokenizer, tmp_path):
    """ablate's engine on the ablate model vs lm-eval's HF backend on the exported model, with ablate's task configs:
    LAMBADA's (log-probability, is_greedy) per item, basic_skills' chosen answers in CF and MCF."""
    from ablate.eval import agreement

    hf_dir = save_hf(bigram, tokenizer, tmp_path / "hf")
    lm = engine.for_transformer(bigram)
    limit = 8
    ours = suite.evaluate(lm, tokenizer, ["lambada", *BASIC_SKILLS], limit=limit, batch_size=8, log_samples=True)
    reference = agreement.run_lm_eval_hf(hf_dir, ["lambada", *BASIC_SKILLS], limit=limit, batch_size=8)
    report = agreement.compare(ours, reference)
    lambada = report["lambada"]
    assert lambada["items"] == limit and lambada["same_greedy"] == 1.0 and lambada["max_logprob_diff"] < 1e-3
    assert lambada["acc_greedy_diff_points"] == 0.0 and 0 < ours[0].metrics["acc_greedy"] < 1, lambada
    for name in BASIC_SKILLS:
        row = report[name]
        assert row["items"] == limit and row["same_raw"] == 1.0 and row["same_per_char"] == 1.0, (name, row)
        assert row["acc_raw_diff_points"] == 0.0 and row["acc_per_char_diff_points"] == 0.0, (name, row)
    ours = suite.evaluate(lm, tokenizer, BASIC_SKILLS, "mcf", limit=limit, batch_size=8, log_samples=True)
    reference = agreement.run_lm_eval_hf(hf_dir, BASIC_SKILLS, "mcf", limit=limit, batch_size=8)
    for name, row in agreement.compare(ours, reference).items():
        assert row["items"] == limit and row["same_raw"] == 1.0 and row["acc_raw_diff_points"] == 0.0, (name, row)
