"""ablate's eval engine vs lm-eval's HF backend on the same exported model, tasks and items, in one run.

    python scripts/bench_eval.py RUN_OR_CHECKPOINT [--tasks arc_easy,hellaswag,piqa] [--limit 200]
    python scripts/bench_eval.py RUN --smoke      # 4 items per task, lm-eval at ablate's batch size only: checks
                                                  # the script runs

Exports the checkpoint to a temporary transformers folder, then times (end to end, model loading included):
ablate's engine on the ablate model; lm-eval's HF backend at its default batch size (1) and at ablate's batch size.
Prints per-task agreement (same chosen answer, accuracy difference) and the speed ratios. Run it on an idle machine.
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
    parser.add_argument("--skip-batch1", action="store_true", help="skip lm-eval at batch size 1 (slow)")
    parser.add_argument("--smoke", action="store_true", help="4 items per task, no lm-eval run at batch size 1")
    args = parser.parse_args()
    if args.smoke:
        args.limit, args.skip_batch1 = 4, True

    from ablate.eval import agreement, engine, suite
    from ablate.export import export_hf
    from ablate.load import load_model

    tasks = suite.parse_tasks(args.tasks)
    with tempfile.TemporaryDirectory() as hf_dir:
        export_hf(args.path, hf_dir)
        start = time.perf_counter()
        loaded = load_model(args.path)
        lm = engine.for_transformer(loaded.model, max_len=loaded.run.data.seq_len)
        results = suite.evaluate(
            lm, loaded.tokenizer(), tasks, args.format, args.limit, args.batch_size, log_samples=True
        )
        ablate_seconds = time.perf_counter() - start
        runs = {}
        if not args.skip_batch1:
            runs["lm-eval hf, batch 1"] = agreement.run_lm_eval_hf(hf_dir, tasks, args.format, args.limit, 1)
        runs[f"lm-eval hf, batch {args.batch_size}"] = agreement.run_lm_eval_hf(
            hf_dir, tasks, args.format, args.limit, args.batch_size
        )
    print(
        f"\nmodel {loaded.checkpoint} ({loaded.model.num_params() / 1e6:.2f}M params), tasks {','.join(tasks)}, "
        f"{args.limit} items each, format {args.format}, threads {os.environ.get('OMP_NUM_THREADS', 'default')}"
    )
    reference = next(iter(runs.values()))
    print(f"{'task':<15}{'items':>6}{'same raw':>10}{'d acc raw':>11}{'same char':>11}{'d acc char':>12}")
    for task, row in agreement.compare(results, reference).items():
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
    ours, theirs = work(loaded.tokenizer(), tasks, args.format, args.limit, loaded.run.data.seq_len)
    print(
        f"\nwork: ablate runs {ours['tokens']:,} tokens through the model (conditional and unconditional) and "
        f"projects {ours['scored']:,} onto the vocabulary;\n      lm-eval runs {theirs:,} tokens (conditional "
        f"only, a row per request but one-token continuations share theirs) and projects every one"
    )
    print(f"ablate engine, batch {args.batch_size}: {ablate_seconds:.1f}s")
    for name, run in runs.items():
        print(
            f"ratio time {name} / ablate engine: {run.seconds / ablate_seconds:.2f}x ({run.seconds:.1f}s; "
            f"{(run.seconds / theirs) / (ablate_seconds / ours['tokens']):.1f}x per token)"
        )


def work(tokenizer, tasks: list[str], fmt: str, limit: int, max_len: int) -> tuple[dict[str, int], int]:
    """Tokens each side runs through the model: ablate's packed rows, and lm-eval's rows of conditional requests (it
    does not run the unconditional pass that ablate's PMI and choices-only metrics need)."""
    from ablate.eval import engine, suite
    from ablate.eval.tasks import requests_for

    ours, theirs = {"tokens": 0, "scored": 0}, 0
    for name in tasks:
        conditional, unconditional = [], []
        task = suite.all_tasks()[name]
        for item in task.items(limit):
            c, u = requests_for(item, fmt, task.kind)
            conditional += c
            unconditional += u
        encoded = engine.encode(tokenizer, conditional + unconditional)
        rows, _ = engine.build_rows(engine.dedupe(encoded)[0], max_len, shares_prefix=True)
        ours["tokens"] += sum(len(r.tokens) for r in rows)
        ours["scored"] += sum(len(r.targets) for r in rows)
        # lm-eval runs one row per request, but requests whose context + continuation minus its last token are the
        # same (one-token continuations after one context) share a row (its "logits cache")
        rows_theirs = {tuple(c) + tuple(k[:-1]) for c, k in encoded[: len(conditional)]}
        theirs += sum(min(len(row), max_len) for row in rows_theirs)  # contexts too long are cut to max_len
    return ours, theirs


if __name__ == "__main__":
    main()
