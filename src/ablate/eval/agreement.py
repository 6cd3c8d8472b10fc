"""ablate's scores against lm-eval's HF backend on the same exported model and items (the agreement test and
scripts/bench_eval.py use this)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ablate.eval.suite import TaskResult


@dataclass
class LmEvalRun:
    items: dict[str, dict[str, dict]]  # task -> item id -> {"lls": [...], "greedy": [...], "lengths": [...],
    # "multiple_input": bool}
    accuracy: dict[str, dict[str, float]]  # task -> {"acc": ..., "acc_norm": ...} (a continuation task: "acc")
    seconds: float


def run_lm_eval_hf(
    hf_dir: str, tasks: list[str], fmt: str = "cf", limit: int | None = None, batch_size: int | str = 1
) -> LmEvalRun:
    """lm-eval's own HF backend on ablate's lm-eval task configs; per-item log-likelihoods from its samples."""
    import lm_eval
    import lm_eval.models.huggingface  # noqa: F401  (imports transformers: outside the timing, as ablate's imports are)
    from lm_eval.tasks import TaskManager

    from ablate_evals import TASKS
    from ablate_evals.lm_eval_tasks import PATH
    from ablate_evals.lm_eval_tasks.utils import doc_to_choice

    # a continuation task has one config: its one request is the same in either format
    names = {f"ablate_{t}" + ("_mcf" if fmt == "mcf" and TASKS[t].kind == "choice" else ""): t for t in tasks}
    start = time.perf_counter()
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_dir},dtype=float32",
        tasks=list(names),
        limit=limit,
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
        task_manager=TaskManager(include_path=str(PATH), include_defaults=False),
    )
    seconds = time.perf_counter() - start
    items, accuracy = {}, {}
    for lm_name, task in names.items():
        per_item = {}
        for sample in out["samples"][lm_name]:
            doc = sample["doc"]
            per_item[doc["id"]] = {
                "lls": [float(r[0]) for r in sample["filtered_resps"]],
                "greedy": [bool(r[1]) for r in sample["filtered_resps"]],
                "lengths": [len(c) for c in doc_to_choice(doc)],
                "multiple_input": len(doc["contexts"]) > 1,
            }
        items[task] = per_item
        res = out["results"][lm_name]
        accuracy[task] = {name: res[f"{name},none"] for name in ("acc", "acc_norm") if f"{name},none" in res}
    return LmEvalRun(items, accuracy, seconds)


def compare(results: list[TaskResult], reference: LmEvalRun) -> dict[str, dict[str, float]]:
    """Per task: share of items whose chosen answer is the same (raw and per-char argmax; raw only where choices
    differ in context), and accuracy differences in points; a continuation task: see _compare_continuations."""
    report = {}
    for r in results:
        ref = reference.items[r.task]
        if any(s["type"] == "item" and "greedy" in s for s in r.samples):  # a continuation task's item samples
            report[r.task] = _compare_continuations(r, ref, reference.accuracy[r.task]["acc"])
            continue
        mine = {str(s["id"]): s["predictions"] for s in r.samples if s["type"] == "item"}
        gold = {str(s["id"]): s["gold"] for s in r.samples if s["type"] == "item"}
        same_raw, same_char, n_char = 0, 0, 0
        for item_id, ref_item in ref.items():
            lls = np.asarray(ref_item["lls"])
            same_raw += mine[item_id]["raw"] == int(np.argmax(lls))
            if not ref_item["multiple_input"]:  # lm-eval's acc_norm divides by the contexts' lengths there
                n_char += 1
                same_char += mine[item_id]["per_char"] == int(np.argmax(lls / np.asarray(ref_item["lengths"])))
        row = {
            "items": len(ref),
            "same_raw": same_raw / len(ref),
            "acc_raw_diff_points": 100 * abs(_accuracy(r, "acc_raw", mine, gold) - reference.accuracy[r.task]["acc"]),
        }
        if n_char:
            row.update(
                same_per_char=same_char / n_char,
                acc_per_char_diff_points=100
                * abs(_accuracy(r, "acc_per_char", mine, gold) - reference.accuracy[r.task]["acc_norm"]),
            )
        report[r.task] = row
    return report


def _accuracy(r: TaskResult, metric: str, chosen: dict[str, dict], gold: dict[str, int]) -> float:
    """The task's figure, or, when that metric was not computed, the mean over its items (no groups)."""
    name = metric.removeprefix("acc_")
    return r.metrics.get(metric, sum(chosen[i][name] == gold[i] for i in chosen) / max(len(chosen), 1))


def _compare_continuations(r: TaskResult, ref: dict[str, dict], ref_acc: float) -> dict[str, float]:
    """A continuation task (one request per item): share of items whose greedy flag is the same, the largest
    log-probability difference, and the greedy accuracy difference in points."""
    mine = {str(s["id"]): s for s in r.samples if s["type"] == "request"}
    same = sum(mine[item_id]["greedy"] == ref_item["greedy"][0] for item_id, ref_item in ref.items())
    diff = max(abs(mine[item_id]["logprob"] - ref_item["lls"][0]) for item_id, ref_item in ref.items())
    acc_greedy = sum(s["greedy"] for s in mine.values()) / max(len(mine), 1)  # asked for or not, from the samples
    return {
        "items": len(ref),
        "same_greedy": same / len(ref),
        "max_logprob_diff": diff,
        "acc_greedy_diff_points": 100 * abs(acc_greedy - ref_acc),
    }
