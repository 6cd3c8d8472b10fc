"""ablate's eval engine vs lm-eval's HF backend on the same exported model, tasks and items, in one process; and
the engine's time against the time its model FLOPs need at this machine's measured matmul peak.

    python scripts/bench_eval.py RUN_OR_CHECKPOINT [--tasks arc_easy,hellaswag,piqa] [--limit 200] [--repeats 2]
    python scripts/bench_eval.py RUN --smoke      # 4 items per task, lm-eval at ablate's batch size only: checks
                                                  # the script runs (its figures mean nothing)

Exports the checkpoint to a temporary transformers folder, then times each side end to end (model loading and
tokenizing included), the sides interleaved `--repeats` times (each side's best run counts, and its CPU time is
shown beside the wall time, so a busy machine shows): ablate's engine in fp32 and in bf16 (autocast), lm-eval's HF
backend in fp32 at ablate's batch size and (unless --skip-batch1) at its default, 1. The engine computes what
lm-eval reports, acc_raw and acc_per_char (`--metrics`), plus each task's primary; so it skips the unconditional
pass except for tasks whose primary is PMI. The fair comparison is fp32 against fp32: the same chosen answer per
item (100% expected), and the speed ratio. bf16 is shown apart, with its agreement to the engine's fp32.

Model FLOPs: what the engine's forward passes need, 2 x the non-embedding parameters (output projection apart)
per token through the model, 2 x d_model x vocab per position projected onto the vocabulary (the engine projects
only the scored ones), 4 x layers x heads x head_dim per (query, key) pair the attention masks allow; their time
at the matmul peak ablate measures once per machine ($ABLATE_CACHE/peak_flops.json). Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a run folder or its checkpoints/step_N")
    parser.add_argument("--tasks", default="arc_easy,hellaswag,piqa")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--format", default="cf")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--metrics", default="acc_raw,acc_per_char", help="what the engine computes ('all': all)")
    parser.add_argument("--repeats", type=int, default=1, help="times each side runs, interleaved; the best counts")
    parser.add_argument("--skip-batch1", action="store_true", help="skip lm-eval at batch size 1 (slow)")
    parser.add_argument("--smoke", action="store_true", help="4 items per task, no lm-eval run at batch size 1")
    args = parser.parse_args()
    if args.smoke:
        args.limit, args.skip_batch1, args.repeats = 4, True, 1

    import torch

    from ablate.eval import agreement, engine, suite
    from ablate.eval.export import export_hf
    from ablate.eval.load import load_model

    tasks = suite.parse_tasks(args.tasks)
    metrics = suite.parse_metrics(args.metrics)
    lm_eval_runs = [args.batch_size] + ([] if args.skip_batch1 else [1])

    def ablate_side(dtype: str):
        """End to end, as `ablate eval` runs: load, tokenize, score."""
        loaded = load_model(args.path)
        lm = engine.for_transformer(
            loaded.model, max_len=loaded.run.data.seq_len, autocast=engine.autocast_for(dtype, "cpu")
        )
        return suite.evaluate(
            lm, loaded.tokenizer(), tasks, args.format, args.limit, args.batch_size, log_samples=True, metrics=metrics
        )

    best, results, runs, scoring = {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as hf_dir:
        export_hf(args.path, hf_dir)
        for _ in range(args.repeats):
            sides = {"ablate fp32": lambda: ablate_side("fp32"), "ablate bf16": lambda: ablate_side("bf16")}
            for size in lm_eval_runs:
                sides[f"lm-eval hf, batch {size}"] = lambda size=size: agreement.run_lm_eval_hf(
                    hf_dir, tasks, args.format, args.limit, size
                )
            for name, side in sides.items():
                wall, cpu = time.perf_counter(), time.process_time()
                out = side()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
                (runs if name.startswith("lm-eval") else results)[name] = out
                if not name.startswith("lm-eval"):  # the engine's scoring alone (no loading or tokenizing)
                    scoring[name] = min(scoring.get(name, float("inf")), sum(r.seconds for r in out))

    loaded = load_model(args.path)
    threads = torch.get_num_threads()
    print(
        f"\nmodel {loaded.checkpoint} ({loaded.model.num_params() / 1e6:.2f}M params), tasks {','.join(tasks)}, "
        f"{args.limit} items each, format {args.format}, engine metrics {args.metrics} (+ each task's primary), "
        f"{threads} threads, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    reference = runs[f"lm-eval hf, batch {args.batch_size}"]
    print("\nagreement, ablate fp32 vs lm-eval hf fp32 (same chosen answer):")
    print_agreement(agreement.compare(results["ablate fp32"], reference))
    print("\nagreement, ablate bf16 vs ablate fp32:")
    print_bf16_agreement(results["ablate fp32"], results["ablate bf16"])

    work = engine_work(loaded, tasks, args.format, args.limit, args.batch_size, metrics)
    flops = model_flops(loaded.model, work)
    theirs = lm_eval_tokens(loaded.tokenizer(), tasks, args.format, args.limit, loaded.run.data.seq_len)
    peaks = matmul_peaks(args.smoke)
    print(
        f"\nwork: ablate runs {work['tokens']:,} tokens through the model ({work['padded_tokens']:,} with padding, "
        f"{work['passes']} forward passes) and projects {work['scored']:,} onto the vocabulary;\n      lm-eval runs "
        f"{theirs:,} tokens (conditional requests, a row each; one-token continuations share theirs) and projects "
        f"every one\nmodel FLOPs: {flops['body'] / 1e9:.1f} G through the layers + {flops['head'] / 1e9:.1f} G vocab "
        f"projection + {flops['attention'] / 1e9:.1f} G attention = {flops['total'] / 1e9:.1f} G"
    )
    flop_seconds = {name: flops["total"] / peak for name, peak in peaks.items()}
    for name, peak in peaks.items():
        print(
            f"model FLOPs time at the measured {name} matmul peak ({peak / 1e9:.0f} GFLOP/s): {flop_seconds[name]:.3f}s"
        )
    for name, (wall, cpu) in best.items():
        alone = f", of which scoring {scoring[name]:.2f}s" if name in scoring else ""
        print(f"{name}: {wall:.2f}s end to end (CPU {cpu:.2f}s){alone}")
    ours = best["ablate fp32"][0]
    for size in lm_eval_runs:
        theirs_seconds = best[f"lm-eval hf, batch {size}"][0]
        print(f"ratio time lm-eval hf, batch {size} / ablate engine: {theirs_seconds / ours:.2f}x")
    for dtype in ("fp32", "bf16"):
        seconds = scoring[f"ablate {dtype}"]
        print(
            f"ratio scoring time ablate {dtype} / model FLOPs at the {dtype} peak: {seconds / flop_seconds[dtype]:.2f}x"
        )


def print_agreement(rows: dict) -> None:
    print(f"{'task':<15}{'items':>6}{'same raw':>10}{'d acc raw':>11}{'same char':>11}{'d acc char':>12}")
    for task, row in rows.items():
        if "same_greedy" in row:  # a continuation task: the greedy flag and accuracy instead of a chosen answer
            print(
                f"{task:<15}{row['items']:>6}{100 * row['same_greedy']:>9.1f}%{row['acc_greedy_diff_points']:>10.2f}pt"
                f"  (greedy; largest log-probability difference {row['max_logprob_diff']:.2g})"
            )
            continue
        print(
            f"{task:<15}{row['items']:>6}{100 * row['same_raw']:>9.1f}%{row['acc_raw_diff_points']:>10.2f}pt"
            f"{100 * row.get('same_per_char', float('nan')):>10.1f}%"
            f"{row.get('acc_per_char_diff_points', float('nan')):>10.2f}pt"
        )


def print_bf16_agreement(fp32: list, bf16: list) -> None:
    """Per task: items whose raw and per-character choices are the same, and the log-likelihood differences."""
    print(f"{'task':<15}{'items':>6}{'same raw':>10}{'same char':>11}{'max |d ll|':>12}{'mean |d ll|':>13}")
    for a, b in zip(fp32, bf16):
        items_a = [s for s in a.samples if s["type"] == "item"]
        items_b = [s for s in b.samples if s["type"] == "item"]
        lls = [
            abs(x["logprob"] - y["logprob"])
            for x, y in zip(a.samples, b.samples)
            if x["type"] == y["type"] == "request"
        ]
        if "predictions" in items_a[0]:
            same = {
                k: sum(x["predictions"][k] == y["predictions"][k] for x, y in zip(items_a, items_b))
                for k in ("raw", "per_char")
            }
        else:
            same = {k: sum(x["greedy"] == y["greedy"] for x, y in zip(items_a, items_b)) for k in ("raw", "per_char")}
        n = len(items_a)
        print(
            f"{a.task:<15}{n:>6}{100 * same['raw'] / n:>9.1f}%{100 * same['per_char'] / n:>10.1f}%"
            f"{max(lls):>12.4f}{sum(lls) / len(lls):>13.4f}"
        )


def engine_work(loaded, tasks: list[str], fmt: str, limit: int, batch_size: int, metrics) -> dict[str, int]:
    """What the engine's forward passes ran, summed over the tasks (engine.work of the requests it scored)."""
    from ablate.eval import engine, suite

    total: dict[str, int] = {}
    tokenizer, known = loaded.tokenizer(), suite.all_tasks()
    for name in tasks:
        prepared = suite.prepared({}, tokenizer, known[name], fmt, limit, metrics)
        scored = [prepared.encoded[j] for j in suite.scored_requests(known[name], fmt, prepared, metrics)]
        for key, value in engine.work(scored, loaded.run.data.seq_len, True, batch_size).items():
            total[key] = total.get(key, 0) + value
    return total


def model_flops(model, work: dict[str, int]) -> dict[str, float]:
    cfg = model.cfg
    head = cfg.vocab_size * cfg.d_model
    body = model.num_params(exclude_embedding=True) - head  # the layers' matmuls (and norms), the head apart
    flops = {
        "body": 2 * body * work["tokens"],
        "head": 2 * head * work["scored"],
        "attention": 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * work["attention_pairs"],
    }
    return {**flops, "total": sum(flops.values())}


def matmul_peaks(smoke: bool) -> dict[str, float]:
    """The matmul peak (FLOP/s) that ablate keeps for this machine and thread count, per dtype; --smoke measures a
    rough one briefly and keeps nothing."""
    import torch

    from ablate.training.parallel import measure_peak_flops, peak_flops_for

    cpu = torch.device("cpu")
    if smoke:
        return {
            name: measure_peak_flops(cpu, dtype, sizes=(256,), seconds=0.05, rounds=1)
            for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        }
    return {"fp32": peak_flops_for(cpu, torch.float32), "bf16": peak_flops_for(cpu, torch.bfloat16)}


def lm_eval_tokens(tokenizer, tasks: list[str], fmt: str, limit: int, max_len: int) -> int:
    """Tokens lm-eval runs through the model: a row per conditional request, but requests whose context +
    continuation minus its last token are the same (one-token continuations after one context) share a row."""
    from ablate.eval import engine, suite
    from ablate.eval.tasks import requests_for

    theirs = 0
    for name in tasks:
        task = suite.all_tasks()[name]
        conditional = [r for item in task.items(limit) for r in requests_for(item, fmt, task.kind)[0]]
        rows = {tuple(c) + tuple(k[:-1]) for c, k in engine.encode(tokenizer, conditional)}
        theirs += sum(min(len(row), max_len) for row in rows)  # contexts too long are cut to max_len
    return theirs


if __name__ == "__main__":
    main()
