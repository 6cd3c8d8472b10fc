"""Training speed on this machine: matmul peak, then tokens/s and MFU of real training steps, in one process.

    python scripts/bench_train.py                      # the ~10M model (d256, 6 layers, vocab 16384, seq 512)
    python scripts/bench_train.py --reference          # the reference model (d128, 4 layers, vocab 8192, seq 256)
    python scripts/bench_train.py --steps 10 --modes fp32,bf16,bf16+compile,bf16+auto
    python scripts/bench_train.py --smoke              # a tiny model, 1 step a mode, small matmuls: checks it runs

Each mode builds the real Trainer (FSDP2 on a 1-rank gloo group, the same code as `ablate run`) and times
`train_step()` after warm-up steps. MFU is model FLOPs (6N + attention) per second over the peak measured here for
the same dtype. A mode's `+compile` sets train.compile=true, `+auto` train.compile="auto" (without either: eager).
Also reports the share of a step spent fetching the batch from the token memmap, which must stay small: the data
loader must never be what the step waits for.

The shape-limited peak: the step's own matmuls (every linear's forward and two backward products, the chunked
output projection's, attention's score and value products as batched matmuls), timed alone in bf16 at their real
shapes. Their FLOPs over their time is the best MFU this model's shapes allow on this machine, whatever the
elementwise work around them costs. Run it on an idle machine: any other process on the 2 cores slows every figure.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ablate.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from ablate.kernels.reference import default_chunk_rows  # noqa: E402
from ablate.setup.checks import check_run  # noqa: E402
from ablate.training.parallel import init_distributed, machine_key, measure_peak_flops, remember_peak  # noqa: E402
from ablate.training.trainer import Trainer  # noqa: E402


def bench_config(size: str, mode: str) -> RunConfig:
    documents = None
    if size == "smoke":
        model = ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4)
        seq_len, micro_batch, documents = 32, 4, 400
    elif size == "reference":
        model = ModelConfig(vocab_size=8192, d_model=128, n_layers=4, n_heads=4)
        seq_len, micro_batch = 256, 16
    else:
        model = ModelConfig(vocab_size=16384, d_model=256, n_layers=6, n_heads=8)
        seq_len, micro_batch = 512, 8
    dtype = "bf16" if "bf16" in mode else "fp32"
    return RunConfig(
        experiment="bench",
        name=mode,
        model=model,
        data=DataConfig(source="default", seq_len=seq_len, max_documents=documents),
        train=TrainConfig(
            max_steps=10_000,
            global_batch=micro_batch,
            micro_batch=micro_batch,
            dtype=dtype,
            compile=True if "+compile" in mode else "auto" if "+auto" in mode else False,
            peak_flops=1.0,
        ),
    )


def step_matmuls(run: RunConfig) -> dict[str, list[tuple[int, int, int, int, int]]]:
    """(count, batch, m, k, n) of every matmul of one forward + backward of `run`'s micro-batch, in two parts:
    each linear's x @ W.T, dY @ W and dY.T @ x with the output projection's chunks; and attention's Q K^T and P V
    (forward) and four products alike (backward) over every (sequence, head), as flops_per_token counts them."""
    m, seq = run.model, run.data.seq_len
    tokens, d, kv, f = run.train.micro_batch * seq, m.d_model, m.kv_heads * m.head_dim, m.ffn_dim
    linears = [(d, m.n_heads * m.head_dim), (d, kv), (d, kv), (m.n_heads * m.head_dim, d), (f, d), (d, f)]
    linears += [(d, f)] if m.ffn == "swiglu" else []
    dense = []
    for k, n in linears:
        dense += [(m.n_layers, 1, tokens, k, n), (m.n_layers, 1, tokens, n, k), (m.n_layers, 1, n, tokens, k)]
    rows = default_chunk_rows(tokens, d, m.vocab_size)
    chunks, vocab = tokens // rows, m.vocab_size
    dense += [(chunks, 1, rows, d, vocab), (chunks, 1, rows, vocab, d), (chunks, 1, vocab, rows, d)]
    heads = run.train.micro_batch * m.n_heads
    attention = [(3 * m.n_layers, heads, seq, m.head_dim, seq), (3 * m.n_layers, heads, seq, seq, m.head_dim)]
    return {"linears and output projection": dense, "attention": attention}


def shape_limited_peak(run: RunConfig, dtype: torch.dtype, rounds: int) -> dict[str, tuple[float, float]]:
    """{part: (FLOPs, seconds)} a step of the step's own matmuls (step_matmuls), each shape timed alone (the best
    of `rounds`), and their sum under "step"."""
    parts = {}
    for part, matmuls in step_matmuls(run).items():
        seconds = flops = 0.0
        for count, batch, m, k, n in matmuls:
            a, b = torch.randn(batch, m, k).to(dtype), torch.randn(batch, k, n).to(dtype)
            best = math.inf
            for _ in range(rounds):
                start = time.perf_counter()
                torch.bmm(a, b)
                best = min(best, time.perf_counter() - start)
            seconds += count * best
            flops += count * 2 * batch * m * k * n
        parts[part] = (flops, seconds)
    parts["step"] = tuple(sum(values) for values in zip(*parts.values()))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--reference",
        action="store_true",
        help="bench the reference model (experiments/reference.py) instead of the ~10M one",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode (compile happens here)")
    parser.add_argument(
        "--modes", default="fp32,bf16", help="comma-separated: fp32 or bf16, each alone (eager), +compile or +auto"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 1 warm-up and 1 timed step per mode")
    args = parser.parse_args()
    size = "smoke" if args.smoke else "reference" if args.reference else "10M"
    if args.smoke:
        args.steps, args.warmup = 1, 1

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    d = init_distributed("auto")
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if args.smoke:  # small matmuls, briefly: a rough figure, not kept
            peaks[name] = measure_peak_flops(d.device, dtype, sizes=(256,), seconds=0.05, rounds=2)
        else:  # the measurement `ablate run` makes once per machine; a higher one here raises the peak runs keep
            peaks[name] = remember_peak(machine_key(d.device, dtype), measure_peak_flops(d.device, dtype))
        print(f"matmul peak {name}: {peaks[name] / 1e9:.1f} GFLOP/s ({torch.get_num_threads()} threads)")
    shaped = bench_config(size, "bf16")
    shape_parts = shape_limited_peak(shaped, torch.bfloat16, rounds=2 if args.smoke else 5)
    for part, (flops, seconds) in shape_parts.items():
        print(
            f"shape-limited peak bf16, {part}: {flops / seconds / 1e9:.1f} GFLOP/s "
            f"({100 * flops / seconds / peaks['bf16']:.1f}% of the square peak), {seconds * 1e3:.1f} ms a step"
        )
    flops, seconds = shape_parts["step"]
    limit = flops / seconds
    step_tokens = shaped.train.micro_batch * shaped.data.seq_len
    print(f"  so at most {step_tokens / seconds:,.0f} tok/s: MFU {100 * limit / peaks['bf16']:.1f}% of the bf16 peak")

    rows = []
    with tempfile.TemporaryDirectory() as out:
        for mode in args.modes.split(","):
            run = bench_config(size, mode)
            trainer = Trainer(check_run(run, d.world), Path(out) / mode, d, callbacks=[])  # the step alone
            trainer.start_time = time.perf_counter()
            for _ in range(args.warmup):  # the first step pays the compile, if any
                trainer.train_step()
            warmup = time.perf_counter() - trainer.start_time
            step_times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                trainer.train_step()
                step_times.append(time.perf_counter() - start)
            fetch_times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                trainer.data.train.batch(trainer.sampler.take(run.train.micro_batch), run.data.seq_len)
                fetch_times.append(time.perf_counter() - start)
            step = statistics.median(step_times)
            tokens_per_second = trainer.last_step_tokens / step
            peak = peaks["bf16" if "bf16" in mode else "fp32"]
            mfu = tokens_per_second * trainer.flops_per_token / peak
            rows.append(
                (mode, trainer.model.num_params(), tokens_per_second, mfu, statistics.median(fetch_times) / step)
            )
            print(
                f"{mode:>14}: {trainer.model.num_params() / 1e6:.2f}M params, step {step * 1e3:.0f} ms, "
                f"{tokens_per_second:,.0f} tok/s, MFU {100 * mfu:.1f}% of the measured {mode.split('+')[0]} peak, "
                f"batch fetch {100 * rows[-1][4]:.2f}% of a step; {'compiled' if trainer.compiled else 'eager'}, "
                f"{args.warmup} warm-up steps {warmup:.1f} s",
                flush=True,
            )
    if len(rows) > 1:
        base = rows[0]
        for mode, _, tps, _, _ in rows[1:]:
            print(f"ratio tokens/s {mode} / {base[0]}: {tps / base[2]:.2f}x")
    print(f"ratio shape-limited peak / square-matmul peak, bf16: {limit / peaks['bf16']:.2f}x")


if __name__ == "__main__":
    main()
