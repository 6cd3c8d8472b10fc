"""A stack's members scored by the eval engine in one stacked pass (training/stack_eval.py) against the same members
scored one after another, in one process.

    python scripts/bench_stack_eval.py                          # a GPU: ~10M and the quickstart's size, K = 2, 4, 8
    python scripts/bench_stack_eval.py --device cpu --sizes quickstart --members 2 4
    python scripts/bench_stack_eval.py --smoke                  # CPU, a toy model, K = 2: that the script runs

Per size and K: K models of that shape (each initialised by its own seed, torch kernels: what a stack runs) in one
training.stack.Stack, and cloze-shaped requests (--contexts contexts of ~--context-tokens random token ids, 4
continuations of 1 to 8 tokens each: the engine's shared-prefix rows) scored at --batch-size rows a pass. Both sides
score the same requests: member by member (engine.score on each member's own model, as a stack's evaluation ran
before) and stacked (engine.score_members on stack_eval.for_stack). First the equality: every member's summed
log-probabilities and greedy flags from the stacked pass against its own pass (bit for bit in fp32 on CPU; on a
GPU in bf16 the largest difference is said). Then the time: the sides alternate --repeats times, each side's best
counts. On a GPU the target (issue 58) is stacked >= 0.8 x K times member-by-member throughput at K = 8.
Each size and K ends with `ratio stacked / member-by-member requests a second, SIZE K=k: X.XXx`.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_measure as measure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def model_config(size: str):
    """The ModelConfig of `size` (quickstart: experiments/quickstart.py's baseline; else gpu_acceptance_measure's
    spec) with torch kernels (a stack's), and its sequence length."""
    from dataclasses import replace

    from ablate.config import ModelConfig
    from ablate.setup.experiment import load_experiment

    if size == "quickstart":
        run = load_experiment(REPO / "experiments" / "quickstart.py", only=["baseline"])[0]
        return replace(run.model, kernels="torch"), run.data.seq_len
    spec = measure.SPECS[size]
    cfg = ModelConfig(vocab_size=spec.vocab, d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads)
    return replace(cfg, kernels="torch"), spec.seq


def requests(vocab: int, contexts: int, context_tokens: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(contexts):
        length = max(1, context_tokens + (i % 9) - 4)  # lengths around the mean: rows that do not all align
        context = torch.randint(1, vocab, (length,), generator=g).tolist()
        out += [(context, torch.randint(1, vocab, (1 + (i + k) % 8,), generator=g).tolist()) for k in range(4)]
    return out


def measure_one(size: str, members: int, device: str, args) -> float:
    import torch

    from ablate.eval import engine
    from ablate.model import Transformer
    from ablate.training import stack_eval
    from ablate.training.stack import Stack

    cfg, seq = model_config(size)
    target = torch.device(device)
    models = []
    for seed in range(members):
        model = Transformer(cfg, max_seq_len=seq)
        model.init_weights(torch.Generator().manual_seed(seed))
        models.append(model.to(target))
    alone = [copy.deepcopy(m).eval() for m in models]
    stack = Stack(models)
    stack.loss_module.eval()
    autocast = engine.autocast_for("bf16" if target.type == "cuda" else "fp32", target)
    lone_lms = [engine.for_transformer(m, max_len=seq, device=target, autocast=autocast) for m in alone]
    stacked_lm = stack_eval.for_stack(stack, max_len=seq, device=target, autocast=autocast)
    asked = requests(cfg.vocab_size, args.contexts, args.context_tokens)

    def one_by_one():
        return [engine.score(lm, asked, args.batch_size) for lm in lone_lms]

    def stacked():
        return engine.score_members(stacked_lm, asked, args.batch_size)

    label = f"{size} K={members}"
    with torch.no_grad():
        want, got = one_by_one(), stacked()
        worst = max(abs(g.logprob - w.logprob) for gs, ws in zip(got, want) for g, w in zip(gs, ws))
        greedy_same = all(g.greedy == w.greedy for gs, ws in zip(got, want) for g, w in zip(gs, ws))
        exact = got == want
        on_gpu = target.type == "cuda"
        # bit for bit is the claim on one CPU thread: with more, a batched matmul splits its sums otherwise
        claimed = not on_gpu and torch.get_num_threads() == 1
        measure.say(
            measure.judge(exact, True) if claimed else "info",
            f"stacked scores equal member by member, {label}",
            f"{'bit for bit' if exact else f'largest log-probability difference {worst:.3g}'}; greedy flags "
            f"{'all equal' if greedy_same else 'differ'} ({len(asked)} requests x {members} members)",
        )
        best = {"member by member": float("inf"), "stacked": float("inf")}
        for _ in range(args.repeats):
            for name, side in (("member by member", one_by_one), ("stacked", stacked)):
                if on_gpu:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                side()
                if on_gpu:
                    torch.cuda.synchronize()
                best[name] = min(best[name], time.perf_counter() - start)
    rates = {name: members * len(asked) / seconds for name, seconds in best.items()}
    ratio = rates["stacked"] / rates["member by member"]
    figures = ", ".join(f"{name} {rate:,.0f} requests/s" for name, rate in rates.items())
    if members == 8:
        measure.say(
            measure.judge(ratio >= 0.8 * members, on_gpu),
            f"stacked >= 0.8 x K member by member, {label}",
            f"{ratio:.2f}x ({figures})",
        )
    else:
        measure.say("info", f"stacked against member by member, {label}", figures)
    print(f"ratio stacked / member-by-member requests a second, {label}: {ratio:.2f}x", flush=True)
    return ratio


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["10M", "quickstart"], choices=["quickstart", "10M", "smoke"])
    parser.add_argument("--members", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--contexts", type=int, default=128, help="contexts, 4 continuations each")
    parser.add_argument("--context-tokens", type=int, default=60, help="a context's mean length in tokens")
    parser.add_argument("--batch-size", type=int, default=32, help="rows a pass (eval.batch_size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="a toy model on CPU, K = 2: that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(sizes=["smoke"], members=[2], device="cpu", contexts=6, context_tokens=12, repeats=1)
    for size in args.sizes:
        for members in args.members:
            measure_one(size, members, args.device, args)


if __name__ == "__main__":
    main()
