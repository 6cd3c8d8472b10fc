"""What one evaluation of a task suite costs beside the training it scores, measured side by side in one process.

    python scripts/bench_eval_cost.py RUN_OR_CHECKPOINT [--tasks small] [--limit 1000] [--evals-per-run 1]
    python scripts/bench_eval_cost.py RUN --smoke          # a few items and steps: checks the script runs

Loads the checkpoint, times one evaluation of the tasks (tokenizing apart from scoring, as in training, where the
requests are tokenized once), then times training steps of the same model at the run's micro-batch and sequence
length (forward, backward, AdamW) and scales them to the run's tokens. Prints the seconds of each, the tokens the
evaluation runs through the model, and the share of training time that in-training evaluation takes at
`--evals-per-run` evaluations (1: the default cadence, at the end only). Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a run folder or its checkpoints/step_N")
    parser.add_argument("--tasks", default="small")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--train-steps", type=int, default=6)
    parser.add_argument("--evals-per-run", type=int, default=1)
    parser.add_argument("--metrics", default="all", help="the metrics computed (all: as training does by default)")
    parser.add_argument("--smoke", action="store_true", help="2 items per task, 2 training steps")
    args = parser.parse_args()
    if args.smoke:
        args.limit, args.train_steps = 2, 2

    import torch

    from ablate.eval import engine, suite
    from ablate.eval.load import load_model

    loaded = load_model(args.path)
    run, tokenizer = loaded.run, loaded.tokenizer()
    tasks = suite.parse_tasks(args.tasks)
    known = suite.all_tasks()
    start = time.perf_counter()
    metrics = suite.parse_metrics(args.metrics)
    prepared: dict = {}
    for name in tasks:  # what the training hook's cache holds after its first evaluation
        suite.prepared(prepared, tokenizer, known[name], "cf", args.limit, metrics)
    tokenize_seconds = time.perf_counter() - start
    # the matmuls as the run trained them (its train.dtype, auto: fp32 on CPU), as the in-training evals run
    autocast = engine.autocast_for(engine.eval_dtype(None, run.train.dtype, "cpu"), "cpu")
    lm = engine.for_transformer(loaded.model, max_len=run.data.seq_len, autocast=autocast)
    start = time.perf_counter()
    results = suite.evaluate(lm, tokenizer, tasks, "cf", args.limit, args.batch_size, cache=prepared, metrics=metrics)
    eval_seconds = time.perf_counter() - start
    eval_tokens = sum(min(len(c) + len(x), run.data.seq_len) for p in prepared.values() for c, x in p.encoded)

    model = loaded.model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    micro, seq = run.train.micro_batch, run.data.seq_len
    inputs = torch.randint(0, run.model.vocab_size, (micro, seq + 1), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        loss, _ = model.loss(inputs[:, :-1], inputs[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocator and first-call costs
    start = time.perf_counter()
    for _ in range(args.train_steps):
        step()
    seconds_per_token = (time.perf_counter() - start) / (args.train_steps * micro * seq)
    run_tokens = run.train.max_tokens or run.train.max_steps * run.train.global_batch * seq
    train_seconds = seconds_per_token * run_tokens
    items = sum(r.n for r in results)
    print(f"model {loaded.checkpoint} ({loaded.model.num_params() / 1e6:.2f}M params), seq_len {seq}")
    print(
        f"one evaluation: {len(tasks)} tasks, {items:,} items (limit {args.limit}), {eval_tokens:,} request "
        f"tokens (before prefix sharing): {eval_seconds:.1f}s scoring + {tokenize_seconds:.1f}s tokenizing once"
    )
    print(
        f"training: {seconds_per_token * 1e6:.1f} us/token x {run_tokens:,} tokens = {train_seconds:.1f}s "
        f"(measured over {args.train_steps} steps of {micro}x{seq})"
    )
    share = args.evals_per_run * eval_seconds / train_seconds
    print(
        f"ratio in-training evaluation/training time, {args.evals_per_run} evaluation(s) per run: {share:.3f}x "
        f"({100 * share:.1f}% of training time)"
    )


if __name__ == "__main__":
    main()
