"""The acceptance of a GPU machine, planned for short leases: parts of at most one 10-minute command, each a few
steps with their own time limits, ordered by what they prove (docs/performance.md, "On a GPU").

    python scripts/gpu_acceptance.py --bundle gpu_bundle    # on a connected machine: what the GPU machine lacks
    source gpu_bundle/boot.sh                              # on the GPU machine, from the repository root
    python3 scripts/gpu_acceptance.py --preflight --part 1 --out OUT   # lease 1, one command: the benchmark, the
                                                           # kernels, the runs
    python3 scripts/gpu_acceptance.py --part 2 --out OUT   # a later lease: each mode's speed, packing
    python3 scripts/gpu_acceptance.py --part 3 --out OUT   # a later lease: where the step goes, the rest
    python3 scripts/gpu_acceptance.py --list               # the parts, their steps, limits and targets
    python3 scripts/gpu_acceptance.py --cpu-smoke          # every measurement at toy sizes on CPU

Each step runs in its own process under its own time limit; what it prints streams to the console and to
OUT/partN.log as it goes (every line stamped with its second), so a run cut short still returns what it did. Every
verdict line starts with PASS, FAIL (against a target) or INFO (a figure with no target); OUT/partN.json keeps
them. Every training step measured is ablate's real one (scripts/gpu_acceptance_measure.py: the Trainer with its
default callbacks, train_step). Exit: 0 all pass, 1 a failure, 2 no CUDA GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_measure as measure  # noqa: E402
import gpu_acceptance_stacks as stacks  # noqa: E402
import gpu_bundle  # noqa: E402

stack_bench_plans = stacks.stack_bench_plans  # tests/test_bench_scripts.py checks every row

REPO = measure.REPO
VERDICT = re.compile(r"^(PASS|FAIL|INFO)  ")
GiB = 2**30


@dataclass(frozen=True)
class Step:
    name: str
    seconds: int  # its time limit on one H100 (each step's time is in OUT/partN.log: set them from it)
    what: str  # the check and its target, for --list
    tests: tuple[str, ...] = ()  # a pytest step: the node ids (marked gpu) it runs; else a measurement (--step NAME)


@dataclass(frozen=True)
class Part:
    number: int
    title: str
    steps: tuple[Step, ...]

    @property
    def seconds(self) -> int:
        return sum(step.seconds for step in self.steps)


RUNS = "tests/test_gpu_runs.py::"
PARTS = (
    Part(
        1,
        "the first lease, one command: ablate's step against the nanoGPT-style reference; the kernels and runs",
        (
            Step(
                "bench",
                300,
                "scripts/bench_nanogpt.py: ablate's real step against a compiled nanoGPT-style reference, steps "
                "interleaved in one process, at GPT-2 small, ~10M (and ~350M, ablate alone): tokens/s >= 1.0x the "
                "reference's at GPT-2 small and ~10M; MFU >= 45% at GPT-2 small, >= 40% at ~350M; no host sync on "
                "a non-logging step; head + loss time <= 1.0x F.linear + F.cross_entropy's, memory <= 25%",
            ),
            Step(
                "kernels",
                120,
                "every Triton kernel against its reference, bf16 and fp32, forward and backward, at real shapes; "
                "the loss's CUDA kernel count (tests/test_gpu_kernels.py, tests/test_on_gpu.py): all pass",
                (
                    "tests/test_gpu_kernels.py",
                    "tests/test_on_gpu.py::test_compiled_kernels_match_their_references",
                    "tests/test_on_gpu.py::test_linear_cross_entropy_matches_its_reference",
                ),
            ),
            Step(
                "runs",
                150,
                "tiny bf16 runs torch vs triton vs compiled, a run killed and resumed, a CPU-written checkpoint "
                "resumed on the GPU, runs-per-gpu 2 (ablate run, a process each; the four side by side); no host "
                "sync in an ordinary step, eager and compiled (sync debug mode 'error'): all pass",
                (
                    "tests/test_on_gpu.py::test_an_ordinary_step_never_waits_for_the_gpu",
                    RUNS + "test_tiny_bf16_run_with_triton_or_compile_follows_the_torch_run",
                    RUNS + "test_a_run_killed_on_the_gpu_resumes_and_follows_the_uninterrupted_run",
                    RUNS + "test_a_checkpoint_written_on_cpu_resumes_on_the_gpu",
                    RUNS + "test_runs_per_gpu_2_gives_each_of_three_runs_its_own_peak_memory",
                ),
            ),
        ),
    ),
    Part(
        2,
        "a later lease: each mode's speed, packing",
        (
            Step(
                "speed_gpt2",
                90,
                "bf16 peak (by exact name; a measured 8192^3 matmul); GPT-2 small (d768, 12 layers, seq 1024, vocab "
                "50304, 16 a step; ablate's default SwiGLU and RMSNorm) bf16, the real step compiled, torch, triton",
            ),
            Step(
                "packing",
                130,
                "aggregate tokens/s of 1, 2, 4 ~10M runs side by side on one GPU; with MPS where its daemon starts "
                "within 10 s: best >= 1.5x one run",
            ),
            Step(
                "speed_10M", 60, "~10M (d256, 6 layers, vocab 16384, seq 512, 32 a step) bf16: compiled, torch, triton"
            ),
            Step(
                "speed_350M",
                150,
                "~350M (d1024, 24 layers, 16 heads, seq 1024, 16 a step) bf16: compiled, torch, triton",
            ),
        ),
    ),
    Part(
        3,
        "a later lease: where the step goes, the rest of the GPU tier",
        (
            Step(
                "profile_gpt2",
                60,
                "where GPT-2 small's real step goes (triton, compiled): the device's busy share, kernels a step, the "
                "ops with the most CPU time, the kernels with the most device time",
            ),
            Step(
                "runs_rest",
                150,
                "MLA + MoE + document masks vs CPU, ablate eval --device cuda vs CPU, float8 compiled (skips below "
                "capability 8.9 or without torchao), an fp32 run vs CPU: all pass",
                (
                    RUNS + "test_mla_moe_and_document_masks_on_the_gpu_follow_the_cpu",
                    RUNS + "test_eval_on_cuda_scores_as_on_cpu",
                    RUNS + "test_float8_compiled_trains_three_steps",
                    "tests/test_on_gpu.py::test_a_short_fp32_run_on_the_gpu_follows_the_cpu_run",
                ),
            ),
        ),
    ),
    Part(
        4,
        "a later lease: stacks of runs (issue 45)",
        (
            Step(
                "stack_runs",
                150,
                "tiny bf16 stacks of 3 and 4 seeds, eager and compiled (ablate run --stack K), against the same runs "
                "alone: every member finishes, its losses finite and within bf16's reach of its lone run's: all pass",
                ("tests/test_gpu_stack.py",),
            ),
            Step(
                "stack_bench",
                240,
                "scripts/bench_stack.py: ~10M and the quickstart's size, K = 1, 2, 3, 4, 8, 16, eager (what "
                "train.compile=auto picks for them); then ~10M compiled at K = 4, 8: K stacked runs >= 90% of one run "
                "at K x batch, and above K processes side by side (measured at K = 2, 4)",
            ),
            Step(
                "quickstart_stacked",
                60,
                "the quickstart's 9 runs as 3 stacks (ablate run experiments/quickstart.py --stack 3): <= 10 s of "
                "training (each stack's wall time, summed)",
            ),
        ),
    ),
    Part(
        5,
        "a later lease: CUDA graphs, the K = 3 stack, stacked evaluation (issue 58)",
        (
            Step(
                "cuda_graphs",
                330,
                "scripts/bench_cuda_graphs.py: ~10M and GPT-2 small, compiled and eager, train.cuda_graphs=True "
                "against False: losses and grad norms bit for bit over 10 steps (then auto may list this GPU in "
                "setup.auto.CUDA_GRAPHS_PROVEN_ON), and the step time of each; then eager stacks (the quickstart's "
                "size at K = 8, ~10M at K = 4) graphed against un-graphed: every member bit for bit, the step time",
            ),
            Step(
                "stack_k3",
                150,
                "the K = 3 divergence's suspects: ~10M bf16 eager stacks of 3 in a fresh process, after a stack of 8 "
                "in the same one, and at loss chunk counts 1, 4 and 7 (uneven rows), 8 steps each: every member's "
                "loss and grad norm finite, the chunk count said",
            ),
            Step(
                "stack_eval",
                90,
                "scripts/bench_stack_eval.py: ~10M and the quickstart's size, K = 2, 4, 8 models scored in one "
                "stacked pass against member by member: >= 0.8 x K the throughput at K = 8",
            ),
        ),
    ),
)
# one command's wall-clock limit on the lent machines, and what a part leaves of it for Python's start and preflight
COMMAND_SECONDS, COMMAND_MARGIN = 600, 30
STEPS = {step.name: step for part in PARTS for step in part.steps}


say, judge, percent = measure.say, measure.judge, measure.percent


# ---------------------------------------------------------------------------------------------------------------
# the measurements, one process each (--step NAME)


def step_bench(smoke: bool) -> None:
    """scripts/bench_nanogpt.py in this process: its verdict lines are the step's."""
    import bench_nanogpt

    bench_nanogpt.main(["--smoke"] if smoke else ["--device", "cuda"])


def step_speed(key: str, smoke: bool) -> None:
    """The bf16 peak, then the real step of `key`'s model in each mode (compiled first: what a long run does)."""
    import torch

    device = torch.device("cpu" if smoke else "cuda")
    name, by_name = measure.named_peak(device)
    size = 256 if smoke else 8192
    measured = measure.matmul_peak(device, size, 0.2 if smoke else 2.0)
    named = f"{by_name / 1e12:.0f} TFLOP/s dense bf16 by name" if by_name else "no known peak for this exact name"
    say("info", "bf16 peak", f"{name}: {named}; measured {measured / 1e12:.3f} TFLOP/s ({size}^3 matmuls)")
    d = measure.device_setup(device.type)
    spec = measure.SPECS["smoke" if smoke else key]
    modes = ("torch", "triton") if smoke else sorted(measure.MODES, key=lambda m: m != "compiled")
    for mode in modes:
        check = f"train {measure.SPECS[key].name} bf16 {mode}"
        try:
            r = measure.train_throughput(spec, mode, d, 1 if smoke else 4, 2 if smoke else 15, by_name or measured)
        except Exception as error:  # an out-of-memory, a kernel that does not build: this line fails, not the step
            say("fail", check, f"{type(error).__name__}: {str(error)[:300]}")
            continue
        by_name_mfu = measure.mfu(r["tokens_per_second"], r["flops_per_token"], by_name)
        by_measured_mfu = measure.mfu(r["tokens_per_second"], r["flops_per_token"], measured)
        say(
            "info",
            check,
            f"{r['tokens_per_second']:,.0f} tok/s, {r['step_ms']:.1f} ms a step, MFU {percent(by_name_mfu)} "
            f"of the named peak, {percent(by_measured_mfu)} of the measured; peak memory "
            f"{r['peak_memory_bytes'] / GiB:.2f} GiB; warm-up {r['warmup_seconds']:.1f} s",
        )


def start_mps(folder: Path) -> tuple[dict | None, str]:
    """An MPS control daemon of our own (pipe and log folders under `folder`) if it starts within 10 s: (the
    environment its clients need, "MPS"), or (None, why not)."""
    import shutil

    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return None, "no MPS: nvidia-cuda-mps-control is not on PATH"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    try:
        result = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None, "no MPS: nvidia-cuda-mps-control -d did not return within 10 s"
    if result.returncode != 0:
        return None, f"no MPS: nvidia-cuda-mps-control -d failed ({(result.stderr or result.stdout).strip()[:200]})"
    return env, "MPS"


def stop_mps(env: dict) -> None:
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, timeout=10, capture_output=True)
    except subprocess.TimeoutExpired:
        print("the MPS daemon did not quit within 10 s", flush=True)


def step_packing(smoke: bool, seconds: float) -> None:
    """1, 2, 4 real ~10M runs side by side without MPS, then with it while the step's time lasts (each group ~25 s).
    This process never touches CUDA (MPS's daemon must start before its clients do)."""
    import torch

    deadline = time.time() + seconds
    job = {
        "spec": "smoke" if smoke else "10M",
        "mode": "torch" if smoke else "triton",
        "device": "cpu" if smoke else "cuda",
        "peak_flops": 1e12 if smoke else None,  # MFU is not read here: on CPU a given peak spares each worker its own
        "warmup": 1 if smoke else 3,
        "seconds": 1.0 if smoke else 8.0,
    }
    spec = measure.SPECS[job["spec"]]
    measure.prepare(measure.run_config(spec, torch.device(job["device"])))  # tokenized once, before the workers
    counts = (1, 2) if smoke else (1, 2, 4)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = {}  # (runs, "MPS" | "no MPS") -> aggregate tokens/s
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_packing_") as tmp:
        root = Path(tmp)
        for k in counts:
            results[k, "no MPS"] = measure.run_packed(k, job, root / f"plain{k}", env, timeout=deadline - time.time())
            say("info", f"packing {k} run(s) a GPU, no MPS", f"{results[k, 'no MPS']:,.0f} tok/s")
        mps_env, mps_state = (None, "not tried in the CPU smoke") if smoke else start_mps(root / "mps")
        if mps_env is not None:
            try:
                for k in counts[1:]:
                    if deadline - time.time() < 30:
                        mps_state = f"MPS started; {k} runs with it not measured: the step's time was spent"
                        break
                    packed = measure.run_packed(k, job, root / f"mps{k}", {**mps_env, **env}, deadline - time.time())
                    results[k, "MPS"] = packed
                    say("info", f"packing {k} run(s) a GPU, MPS", f"{packed:,.0f} tok/s")
            except RuntimeError as error:
                mps_state = f"MPS started, but a run under it failed ({str(error)[:200]})"
            finally:
                stop_mps(mps_env)
    one = results[1, "no MPS"]
    if mps_state != "MPS":
        say("info", "packing with MPS", mps_state)
    (k, how), best = max(results.items(), key=lambda item: item[1])
    ratios = ", ".join(f"{n} {h}: {v / one:.2f}x" for (n, h), v in results.items())
    say(
        judge(best >= 1.5 * one, not smoke),
        "best packing of ~10M runs >= 1.5x one run's tokens/s",
        f"{best / one:.2f}x with {k} a GPU, {how} ({ratios})",
    )


def step_profile(key: str, smoke: bool) -> None:
    import torch

    device = torch.device("cpu" if smoke else "cuda")
    d = measure.device_setup(device.type)
    spec = measure.SPECS["smoke" if smoke else key]
    peak = measure.named_peak(device)[1] or 1e12  # the runs' MFU is not read here
    for mode in ("torch", "triton") if smoke else ("triton", "compiled"):
        kernels, compiled = measure.MODES[mode]
        real = measure.RealStep(measure.run_config(spec, device, kernels=kernels, compile=compiled, peak_flops=peak), d)
        try:
            real.timed(3)  # the compiles
            r = measure.step_profile(real, 2 if smoke else 10)
        finally:
            real.close()
        check = f"step of {measure.SPECS[key].name} bf16 {mode}"
        say(
            "info",
            check,
            f"{r['step_ms']:.1f} ms (under the profiler); device busy {percent(r['device_busy'])} of the step; "
            f"{r['kernels_per_step']:.0f} kernels a step",
        )
        ops = "; ".join(f"{name} {ms:.2f} ms x{count}" for name, ms, count in r["top_cpu"])
        say("info", f"{check}, most CPU time of their own a step", ops)
        if not smoke:
            top = "; ".join(f"{name} {ms:.2f} ms x{count}" for name, ms, count in r["top_device"])
            say("info", f"{check}, most device time a step", top)


MEASUREMENTS = {
    "bench": step_bench,
    "speed_gpt2": lambda smoke: step_speed("gpt2", smoke),
    "speed_10M": lambda smoke: step_speed("10M", smoke),
    "speed_350M": lambda smoke: step_speed("350M", smoke),
    "packing": lambda smoke: step_packing(smoke, STEPS["packing"].seconds - 5 if not smoke else 120),
    "profile_gpt2": lambda smoke: step_profile("gpt2", smoke),
    "stack_bench": stacks.step_stack_bench,
    "quickstart_stacked": stacks.step_quickstart_stacked,
    "cuda_graphs": stacks.step_cuda_graphs,
    "stack_k3": stacks.step_stack_k3,
    "stack_eval": stacks.step_stack_eval,
}


def run_step(name: str, smoke: bool) -> None:
    if name not in MEASUREMENTS:
        raise ValueError(f"--step {name}: not a measurement; allowed: {', '.join(MEASUREMENTS)}")
    MEASUREMENTS[name](smoke)


# ---------------------------------------------------------------------------------------------------------------
# the parent: each step a process under its time limit, its output streamed to the console and the log


def stream(command: list[str], seconds: float, log, env: dict) -> tuple[int | None, list[str]]:
    """Run `command` in its own process group, each line to stdout and `log` as it comes; killed at `seconds`.
    (exit code or None where it was killed, every line)."""
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )
    lines: list[str] = []
    timer, start = _Killer(proc, seconds), time.perf_counter()
    for line in proc.stdout:
        print(line, end="", flush=True)
        log.write(f"[{time.perf_counter() - start:6.1f} s] {line}")  # when each test ended, for the next plan
        log.flush()
        lines.append(line.rstrip("\n"))
    proc.wait()
    timer.cancel()
    return (None if timer.fired else proc.returncode), lines


class _Killer:
    """Kills a process group once `seconds` have passed (its children too: torchrun, ablate run, packing workers)."""

    def __init__(self, proc: subprocess.Popen, seconds: float):
        import threading

        self.fired = False
        self.proc = proc
        self.timer = threading.Timer(seconds, self._kill)
        self.timer.daemon = True
        self.timer.start()

    def _kill(self) -> None:
        self.fired = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        self.timer.cancel()


def pytest_verdict(step: Step, code: int | None, lines: list[str], seconds: float) -> str:
    output = "\n".join(lines)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", output)}
    skips = re.findall(r"^SKIPPED \[(\d+)\] [^\n]*?: (.*)$", output, re.MULTILINE)
    # float8's skip below compute capability 8.9, or without torchao, is the only expected one
    unexpected = [f"{n} x {why}" for n, why in skips if "compute capability" not in why and "torchao" not in why]
    figure = ", ".join(f"{n} {word}" for word, n in counts.items() if word != "deselected") or "nothing ran"
    if code is None:
        figure = f"killed at its {step.seconds} s limit; {len(re.findall(' PASSED', output))} passed before"
    figure += f" in {seconds:.0f} s" + (f"; skipped: {'; '.join(unexpected)}" if unexpected else "")
    ok = code == 0 and counts.get("passed", 0) > 0 and not unexpected
    return f"{'PASS' if ok else 'FAIL'}  {step.name}: {step.what}: {figure}"


def run_part(part: Part, out: Path, smoke: bool) -> list[str]:
    """Every step of `part`; its verdict lines (also in out/partN.json)."""
    out.mkdir(parents=True, exist_ok=True)
    verdicts, started = [], time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(out / f"part{part.number}.log", "a") as log:
        for step in part.steps:
            header = f"== part {part.number}, step {step.name} (limit {step.seconds} s): {step.what}"
            print(header, flush=True)
            log.write(header + "\n")
            start = time.perf_counter()
            if step.tests:
                if smoke:
                    verdicts.append(f"INFO  {step.name}: not run in the CPU smoke (a pytest step needs a GPU)")
                    print(verdicts[-1], flush=True)
                    continue
                command = [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "-m", "gpu"]
                if importlib.util.find_spec("xdist"):  # the tests compile kernels and start runs: CPU-bound, 4 at once
                    command += ["-n", "4"]
                code, lines = stream([*command, *step.tests], step.seconds, log, env)
                verdicts.append(pytest_verdict(step, code, lines, time.perf_counter() - start))
                print(verdicts[-1], flush=True)
            else:
                command = [sys.executable, __file__, "--step", step.name]
                limit = step.seconds if not smoke else 600
                code, lines = stream([*command, *(["--cpu-smoke"] if smoke else [])], limit, log, env)
                verdicts += [line for line in lines if VERDICT.match(line)]
                if code != 0 and not any(line.startswith("FAIL") for line in lines):
                    why = f"killed at its {limit} s limit" if code is None else f"exited {code}"
                    verdicts.append(f"FAIL  {step.name}: {why} after {time.perf_counter() - start:.0f} s")
                    print(verdicts[-1], flush=True)
            log.write(f"   step {step.name} took {time.perf_counter() - start:.0f} s\n")
    took = time.perf_counter() - started
    record = {"part": part.number, "seconds": round(took), "lines": verdicts}
    (out / f"part{part.number}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"   part {part.number} took {took:.0f} s", flush=True)
    if 0 < part.number < len(PARTS) and not smoke:
        print(f"next: python3 scripts/gpu_acceptance.py --part {part.number + 1} --out {out}")
    return verdicts


def list_parts() -> None:
    for part in PARTS:
        print(f"part {part.number}: {part.title} (limits add up to {part.seconds} s)")
        for step in part.steps:
            print(f"    {step.name} ({step.seconds} s): {step.what}")
    print(
        "lease 1: the machine's start, then one command: --preflight --part 1 --out OUT; a later lease: part 2 and "
        f"part 3, a command each (every part within one {COMMAND_SECONDS} s command, {COMMAND_MARGIN} s to spare)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", type=int, choices=[p.number for p in PARTS], help="run this part (default: all)")
    parser.add_argument("--steps", help="run these steps alone, from any part (a,b,...): a rerun of what failed")
    parser.add_argument("--out", type=Path, default=Path("gpu_acceptance_out"), help="logs and verdicts go here")
    parser.add_argument("--list", action="store_true", help="name every part and step, with its limit and target")
    parser.add_argument("--bundle", type=Path, metavar="DIR", help="write what an offline GPU machine needs")
    parser.add_argument("--python-version", default=gpu_bundle.GPU_PYTHON, help="--bundle: the wheels' Python")
    parser.add_argument(
        "--preflight", action="store_true", help="imports, GPU, memory, versions, data: a verdict (then --part/--steps)"
    )
    parser.add_argument("--cpu-smoke", action="store_true", help="every measurement at toy sizes on CPU")
    parser.add_argument("--step", help=argparse.SUPPRESS)  # one measurement, in its own process (run_part)
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)  # one packing run (run_packed)
    args = parser.parse_args(argv)
    unknown = [name for name in (args.steps or "").split(",") if name and name not in STEPS]
    if unknown:
        parser.error(f"--steps: no step {', '.join(unknown)}; allowed: {', '.join(STEPS)}")
    if args.list:
        list_parts()
        return 0
    measure.import_ablate_from_checkout()
    if args.worker:
        measure.packing_worker(json.loads(args.worker))
        return 0
    if args.step:
        run_step(args.step, args.cpu_smoke)
        return 0
    if args.bundle:
        manifest = gpu_bundle.make_bundle(args.bundle, args.python_version)
        total = manifest["bytes"] + gpu_bundle.tree_bytes()
        print(
            f"wrote {args.bundle}: {manifest['bytes'] / 2**20:.1f} MiB; with the tree {total / 2**20:.1f} MiB "
            f"(limit {gpu_bundle.LIMIT_BYTES / 2**20:.0f} MiB)"
        )
        print(f"next, on the GPU machine from the repository root: source {args.bundle}/boot.sh")
        return 0 if total <= gpu_bundle.LIMIT_BYTES else 1
    if args.preflight:
        ready = gpu_bundle.preflight()
        sys.stdout.flush()  # before the parts' lines, which stream
        if ready == 2 or not (args.part or args.steps):  # without a GPU no part runs; with one, the parts say more
            return ready
    if args.cpu_smoke:
        return run_parts(args, smoke=True)
    import torch

    if not torch.cuda.is_available():
        print("gpu_acceptance.py needs a CUDA GPU, and none is visible (--list names the checks)", file=sys.stderr)
        return 2
    return run_parts(args, smoke=False)


def run_parts(args, smoke: bool) -> int:
    verdicts = []
    chosen = [Part(0, "rerun", tuple(STEPS[name] for name in args.steps.split(",")))] if args.steps else PARTS
    for part in chosen:
        if args.part in (None, part.number) or args.steps:
            verdicts += run_part(part, args.out, smoke)
    failed = [line for line in verdicts if line.startswith("FAIL")]
    passed = sum(line.startswith("PASS") for line in verdicts)
    print(f"{len(verdicts)} lines, {passed} pass, {len(failed)} fail")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
