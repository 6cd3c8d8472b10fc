"""Training speed on this machine: matmul peak, then tokens/s and MFU of real training steps, in one process.

    python scripts/bench_train.py                      # the ~10M model (d256, 6 layers, vocab 16384, seq 512)
    python scripts/bench_train.py --quickstart         # the quickstart model (d128, 4 layers, vocab 8192, seq 256)
    python scripts/bench_train.py --steps 10 --modes fp32,bf16,bf16+compile
    python scripts/bench_train.py --smoke              # a tiny model, 1 step a mode, small matmuls: checks it runs

Each mode builds the real Trainer (FSDP2 on a 1-rank gloo group, the same code as `ablate run`) and times
`train_step()` after warm-up steps. MFU is model FLOPs (6N + attention) per second over the peak measured here for
the same dtype. Also reports the share of a step spent fetching the batch from the token memmap, which must stay
small: the data loader must never be what the step waits for. Run it on an idle machine: any other process on
the 2 cores slows every figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ablate.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from ablate.parallel import init_distributed, machine_key, measure_peak_flops, remember_peak  # noqa: E402
from ablate.trainer import Trainer  # noqa: E402


def bench_config(size: str, mode: str) -> RunConfig:
    documents = None
    if size == "smoke":
        model = ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4)
        seq_len, micro_batch, documents = 32, 4, 400
    elif size == "quickstart":
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
            compile="compile" in mode,
            peak_flops=1.0,
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quickstart", action="store_true", help="bench the quickstart model instead of the ~10M one")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per mode (compile happens here)")
    parser.add_argument("--modes", default="fp32,bf16", help="comma-separated: fp32, bf16, fp32+compile, bf16+compile")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 1 warm-up and 1 timed step per mode")
    args = parser.parse_args()
    size = "smoke" if args.smoke else "quickstart" if args.quickstart else "10M"
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

    rows = []
    with tempfile.TemporaryDirectory() as out:
        for mode in args.modes.split(","):
            run = bench_config(size, mode)
            trainer = Trainer(run, Path(out) / mode, d, callbacks=[])  # the step alone
            trainer.start_time = time.perf_counter()
            for _ in range(args.warmup):
                trainer.train_step()
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
                f"batch fetch {100 * rows[-1][4]:.2f}% of a step",
                flush=True,
            )
    if len(rows) > 1:
        base = rows[0]
        for mode, _, tps, _, _ in rows[1:]:
            print(f"ratio tokens/s {mode} / {base[0]}: {tps / base[2]:.2f}x")


if __name__ == "__main__":
    main()
