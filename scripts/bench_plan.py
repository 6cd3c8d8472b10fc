"""ablate plan's per-rank memory estimate against the peak measured over a few real training steps.

    python scripts/bench_plan.py                      # every case below, 1 process, then 2 under torchrun
    python scripts/bench_plan.py --cases small-fp32 --world 1 --rss
    python scripts/bench_plan.py --measure RUN.json --steps 2 --out OUT.json   # one measurement (the test's call)
    python scripts/bench_plan.py --smoke              # a tiny case, 1 process, 2 steps: checks the script runs
    python scripts/bench_plan.py --world 1 --stack 1,2,4   # K seeds as one stack (training.stack), against
                                                           # ablate plan --stack's estimate_stack_memory

What is measured: the trainer itself (training.trainer.Trainer, no callbacks) builds the model and optimizer and runs
`--steps` steps on real data (the second step is the first with optimizer state). On GPU the peak is
torch.cuda.max_memory_allocated. On CPU there is no such counter, so c10's CPU allocator is told to count every
allocation and free, on every thread, and torch's profiler (profile_memory=True) records that count at each
allocation: its highest point during the steps, above what was live before the model was built, is the CPU
counterpart of max_memory_allocated, the bytes of live tensors, which is what the estimate models. (Counting on
every thread matters: gloo frees collective buffers on its own threads, and a count kept on the main thread alone
drifts up step after step.)

With --rss a second run of each case, without the profiler, reports the RSS high-water mark over the same span
(VmHWM after a reset, minus the RSS before the model): what the OS charges. It is an upper bound of the live bytes,
not a measure of them: it adds the pages malloc keeps after frees, oneDNN's buffers, gloo's own buffers and lazily
imported code, so plan for RAM above the estimate on CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Big enough that the measurement is not noise (tens of MiB of parameters and of activations), small enough for a
# few steps in seconds on two cores.
CASES = {
    "small-fp32": {
        "model": {"vocab_size": 8192, "d_model": 384, "n_layers": 6, "n_heads": 6},
        "train": {"micro_batch": 8, "global_batch": 8},
        "data": {"seq_len": 128},
    },
    "wide-fp32-accum": {
        "model": {"vocab_size": 8192, "d_model": 640, "n_layers": 4, "n_heads": 10},
        "train": {"micro_batch": 2, "global_batch": 8},
        "data": {"seq_len": 128},
    },
    "long-bf16": {
        "model": {"vocab_size": 8192, "d_model": 256, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2},
        "train": {"micro_batch": 8, "global_batch": 8, "dtype": "bf16"},
        "data": {"seq_len": 512},
    },
    "doc-mask-gelu": {
        "model": {
            "vocab_size": 8192,
            "d_model": 320,
            "n_layers": 4,
            "n_heads": 5,
            "ffn": "gelu",
            "tie_embeddings": False,
            "qk_norm": True,
        },
        "train": {"micro_batch": 4, "global_batch": 8},
        "data": {"seq_len": 256, "doc_mask": True},
    },
    "muon-small-batch": {
        "model": {"vocab_size": 8192, "d_model": 512, "n_layers": 4, "n_heads": 8},
        "train": {"micro_batch": 2, "global_batch": 2},
        "data": {"seq_len": 64},
        "optim": {"name": "muon"},
    },
    "muon-wide": {
        "model": {"vocab_size": 1024, "d_model": 768, "n_layers": 2, "n_heads": 12},
        "train": {"micro_batch": 1, "global_batch": 1},
        "data": {"seq_len": 32},
        "optim": {"name": "muon"},
    },
}


# --smoke's case: too small for the figure to mean anything (allocator noise is most of it), quick to run
SMOKE_CASE = {
    "model": {"vocab_size": 512, "d_model": 64, "n_layers": 2, "n_heads": 4},
    "train": {"micro_batch": 2, "global_batch": 2},
    "data": {"seq_len": 32},
}


def case_config(name: str, world: int = 1) -> dict:
    """A run config (dict) for a case; the global batch grows with the world so each rank's micro-batch is the
    same. Fixed peak_flops: no matmul benchmark before the steps. Eager (compile off): what the estimate models
    (train.compile="auto" compiles bf16 on CPU, which saves less: the estimate is then an upper bound)."""
    case = SMOKE_CASE if name == "smoke" else CASES[name]
    train = {"max_steps": 3, "log_every": 1, "peak_flops": 1e11, "seed": 0, "compile": False, **case["train"]}
    train["global_batch"] *= world
    return {
        "experiment": "bench_plan",
        "name": name,
        "model": case["model"],
        "train": train,
        "optim": case.get("optim", {}),
        "data": {"source": "default", "max_documents": 300, "val_sequences": 2, **case["data"]},
    }


# ---------------------------------------------------------------------------------------------------------------
# one measurement, in its own process (every rank under torchrun)


def _rss_kib(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def count_every_thread() -> None:
    """Make c10's CPU allocator count every allocation and free, on any thread, in the running total that the
    profiler's memory events carry (c10's flag caffe2_report_cpu_memory_usage, set through its exported symbol).
    Off, a free on another thread is never subtracted, and the total drifts up step after step."""
    import torch

    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
    ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def _live_bytes_peak(profiler, since_marker: str) -> int:
    """The highest count of live CPU allocator bytes after `since_marker` began: bytes allocated since counting
    began and not yet freed."""
    from torch._C._profiler import _EventType

    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)

    nodes = list(walk(profiler.profiler.kineto_results.experimental_event_tree()))
    boundary = min(n.start_time_ns for n in nodes if n.name == since_marker)
    return max(
        (
            n.extra_fields.total_allocated
            for n in nodes
            if n.tag == _EventType.Allocation and n.extra_fields.device.type == "cpu" and n.start_time_ns >= boundary
        ),
        default=0,
    )


def measure(run_dict: dict, steps: int, out_dir: str, rss: bool = False, stack: int = 1) -> dict:
    """The per-rank peak of `steps` training steps of the run: live tensor bytes, or with `rss` (no profiler) the
    RSS high-water mark. Every rank measures itself; the rank that needs the most is returned. `stack` > 1: that
    many seeds of the run as one stack (training.stack.StackedTrainer), at world size 1."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from ablate.config import RunConfig
    from ablate.data.prepare import prepare_data
    from ablate.setup.checks import check_run
    from ablate.training.parallel import init_distributed
    from ablate.training.run import Trainer
    from ablate.training.stack import StackedTrainer

    run = RunConfig.from_dict(run_dict)
    d = init_distributed(run.train.device)
    prepare_data(run.data, run.model.vocab_size, is_main=d.is_main, share=d.broadcast_object)  # the cache exists
    run_dir = Path(out_dir) / f"rank{d.rank}"
    run_dir.mkdir(parents=True, exist_ok=True)
    on_gpu = d.device.type == "cuda"
    profiler = None
    if rss:
        rss_before = _rss_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    elif on_gpu:
        torch.cuda.reset_peak_memory_stats(d.device)
        before = torch.cuda.memory_allocated(d.device)
    else:
        count_every_thread()  # from here on, what is counted is this measurement's
        profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        profiler.start()
    start = time.perf_counter()
    members = [
        Trainer(check_run(seeded(run, seed), d.world), run_dir / f"seed{seed}", d, callbacks=[])
        for seed in range(stack)
    ]
    for member in members:
        member.model.train()
    step = StackedTrainer(members).train_step if stack > 1 else members[0].train_step
    with record_function("bench_plan_steps"):
        for _ in range(steps):
            step()
    seconds = time.perf_counter() - start
    if rss:
        peak = _rss_kib("VmHWM") * 1024 - rss_before
    elif on_gpu:
        peak = torch.cuda.max_memory_allocated(d.device) - before
    else:
        profiler.stop()
        peak = _live_bytes_peak(profiler, "bench_plan_steps")
    result = {
        "rank": d.rank,
        "world": d.world,
        "peak_bytes": peak,
        "seconds": seconds,
        "device": d.device.type,
        "what": "rss" if rss else "live",
    }
    return max(d.gather_objects(result), key=lambda r: r["peak_bytes"])


def measure_in_subprocess(
    run_dict: dict, world: int = 1, steps: int = 2, rss: bool = False, timeout: float = 600, stack: int = 1
) -> dict:
    """`measure` in a fresh process (torchrun with `world` processes when > 1), so nothing of this process's memory
    enters the figure."""
    with tempfile.TemporaryDirectory() as tmp:
        config, out = Path(tmp) / "run.json", Path(tmp) / "measured.json"
        config.write_text(json.dumps(run_dict))
        launcher = (
            [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
            if world > 1
            else [sys.executable]
        )
        cmd = [
            *launcher,
            str(Path(__file__).resolve()),
            "--measure",
            str(config),
            "--steps",
            str(steps),
            "--out",
            str(out),
            *(["--rss"] if rss else []),
            *(["--stack", str(stack)] if stack > 1 else []),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return json.loads(out.read_text())


def _child(args) -> int:
    run_dict, out_dir = json.loads(Path(args.measure).read_text()), str(Path(args.out).parent)
    result = measure(run_dict, args.steps, out_dir, args.rss, args.stack[0])
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps(result))
    from ablate.training.parallel import shutdown_distributed

    shutdown_distributed()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# the comparison


def seeded(run, seed: int):
    """`run` (a RunConfig) with train.seed `seed`."""
    return dataclasses.replace(run, train=dataclasses.replace(run.train, seed=seed))


def compare(name: str, world: int, steps: int, rss: bool, stack: int = 1) -> dict:
    from ablate.config import RunConfig
    from ablate.cost.memory import estimate_memory, estimate_stack_memory
    from ablate.setup.checks import check_run

    run_dict = case_config(name, world)
    run = RunConfig.from_dict(run_dict)
    members = [check_run(seeded(run, seed), world) for seed in range(stack)]
    estimate = estimate_stack_memory(members, "cpu") if stack > 1 else estimate_memory(members[0], world, "cpu")
    return {
        "estimate": estimate,
        "live": measure_in_subprocess(run_dict, world, steps, stack=stack),
        "rss": measure_in_subprocess(run_dict, world, steps, rss=True, stack=stack) if rss else None,
    }


def _sizes(text: str) -> list[int]:
    """A comma-separated list of positive whole numbers (--world, --stack), refused by argparse otherwise."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive whole numbers separated by commas, e.g. 1,2,4")
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument(
        "--world", type=_sizes, default="1,2", help="world sizes to measure at (2: torchrun, 2 gloo processes)"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rss", action="store_true", help="also the RSS high-water mark (a run without profiler)")
    parser.add_argument("--smoke", action="store_true", help="a tiny case in 1 process, 2 steps (with --rss too)")
    parser.add_argument(
        "--stack", type=_sizes, default="1", help="stack sizes (K seeds as one stacked model; world 1 only)"
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return _child(args)
    if args.smoke:
        args.cases, args.world, args.steps = "smoke", [1], 2
    unknown = sorted(set(args.cases.split(",")) - set(CASES) - {"smoke"})
    if unknown:
        parser.error(f"--cases: {', '.join(unknown)} unknown; choose from {', '.join(CASES)}")
    from ablate.cost.memory import format_bytes

    print(
        f"{'case':16s} {'world':>5s} {'K':>2s} {'estimate':>10s} {'measured':>10s} {'est/meas':>8s}"
        + (f" {'RSS':>10s} {'est/RSS':>7s}" if args.rss else "")
        + "  peak moment (estimate)"
    )
    ratios = []  # estimate / measured live bytes, per row
    sizes = [(world, k) for world in args.world for k in args.stack]
    for world, k in sizes:
        if world > 1 and k > 1:
            continue  # a stack trains on one device
        for name in args.cases.split(","):
            row = compare(name, world, args.steps, args.rss, k)
            estimate, live, rss = row["estimate"], row["live"]["peak_bytes"], row["rss"]
            ratios.append(estimate.total / live)
            line = (
                f"{name:16s} {world:5d} {k:2d} {format_bytes(estimate.total):>10s} {format_bytes(live):>10s} "
                f"{estimate.total / live:8.3f}"
            )
            if rss:
                line += f" {format_bytes(rss['peak_bytes']):>10s} {estimate.total / rss['peak_bytes']:7.3f}"
            print(f"{line}  {estimate.moment} ({row['live']['seconds']:.1f}s)", flush=True)
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(f"ratio estimate/measured furthest from 1, of {len(ratios)} rows: {worst:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
