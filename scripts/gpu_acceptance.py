"""The one command that proves a GPU machine: the GPU tier of the tests, then training speed, the head and loss
alone, and packing, each line saying pass or fail against its target (docs/performance.md, "On a GPU").

    python scripts/gpu_acceptance.py                       # every part, one after another (under 25 min on an H100)
    python scripts/gpu_acceptance.py --part 3              # one part (each under 9 min on an H100)
    python scripts/gpu_acceptance.py --list                # every part and check, with its target; no GPU needed
    python scripts/gpu_acceptance.py --write-tokens gpu_acceptance_tokens.bin   # on any machine with ablate installed
    python scripts/gpu_acceptance.py --cpu-smoke           # every measurement at toy sizes on CPU: checks the code

Runs from this checkout without installing ablate: beside torch and triton it needs numpy (the measurements) and
pytest (the GPU tier); the tier's whole-run tests need ablate's own dependencies too. Its data is a token file
(`--tokens`, default gpu_acceptance_tokens.bin in the repository) written beforehand by `--write-tokens`. Without a
CUDA GPU it exits 2; with one it exits 1 if any check failed, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_measure as measure  # noqa: E402

REPO = measure.REPO
DEFAULT_TOKENS = REPO / "gpu_acceptance_tokens.bin"
TIER_KERNEL_FILES = ["tests/test_on_gpu.py", "tests/test_gpu_kernels.py"]
GiB = 2**30


@dataclass
class Line:
    check: str
    figure: str
    verdict: str = "info"  # "pass", "fail", or "info" (a figure with no target)

    def __str__(self) -> str:
        return f"{self.verdict.upper():4}  {self.check}: {self.figure}"


@dataclass
class Settings:
    """What the parts measure with: the GPU's sizes, or the CPU smoke's toy ones."""

    device: torch.device
    tokens: Path
    smoke: bool
    lines: list[Line] = field(default_factory=list)

    def judge(self, ok: bool) -> str:
        """A target's verdict; the smoke's toy figures are held against no target."""
        return "info" if self.smoke else "pass" if ok else "fail"

    def say(self, line: Line) -> None:
        self.lines.append(line)
        print(line, flush=True)


@dataclass
class Part:
    number: int
    title: str
    minutes: int  # the budget on one H100
    checks: list[str]
    run: Callable[[Settings], None]


# ---------------------------------------------------------------------------------------------------------------
# parts 1 and 2: the GPU tier


def boot_folder() -> Path | None:
    """Where ablate is not installed: a folder for PYTHONPATH whose sitecustomize makes this checkout importable
    in pytest and in every process the tests start (`python -m ablate`, torchrun)."""
    if importlib.util.find_spec("ablate") is not None and importlib.util.find_spec("ablate.kernels") is not None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="gpu_acceptance_boot_"))
    (folder / "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'scripts')!r})\n"
        "import gpu_acceptance_measure\ngpu_acceptance_measure.import_ablate_from_checkout()\n"
    )
    return folder


def run_tier(s: Settings, name: str, files: list[str]) -> None:
    if s.smoke:
        s.say(Line(name, "not run in the CPU smoke (the tier needs a GPU; `pytest -m gpu` collects it anywhere)"))
        return
    import os

    env = dict(os.environ)
    boot = boot_folder()
    if boot is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(boot), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu", *files]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    output = result.stdout + result.stderr
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", output)}
    skips = re.findall(r"^SKIPPED \[(\d+)\] [^\n]*?: (.*)$", output, re.MULTILINE)
    # the float8 test's skip on GPUs below compute capability 8.9 is the only expected one
    unexpected = [f"{n} x {why}" for n, why in skips if "compute capability" not in why]
    ok = result.returncode == 0 and counts.get("passed", 0) > 0 and not unexpected
    figure = ", ".join(f"{n} {word}" for word, n in counts.items()) or "nothing ran"
    figure += f" in {time.perf_counter() - start:.0f} s" + (f"; skipped: {'; '.join(unexpected)}" if unexpected else "")
    if not ok:
        print(output[-6000:])
    s.say(Line(f"{name} (all pass, none skipped but float8 below capability 8.9)", figure, "pass" if ok else "fail"))


def tier_run_files() -> list[str]:
    return [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "tests").glob("test_gpu_*.py"))
        if str(p.relative_to(REPO)) not in TIER_KERNEL_FILES
    ]


def part_tier_kernels(s: Settings) -> None:
    run_tier(s, "GPU tier, kernels", TIER_KERNEL_FILES)


def part_tier_runs(s: Settings) -> None:
    run_tier(s, "GPU tier, whole runs", tier_run_files())


# ---------------------------------------------------------------------------------------------------------------
# parts 3 and 4: training speed, the head and loss


def peaks(s: Settings) -> tuple[str, float | None, float]:
    """(device name, its dense bf16 peak by exact name or None, the bf16 matmul peak measured now)."""
    name, by_name = measure.named_peak(s.device)
    size = 256 if s.smoke else 8192
    measured = measure.matmul_peak(s.device, size, 0.2 if s.smoke else 3.0)
    named = f"{by_name / 1e12:.0f} TFLOP/s dense bf16 by name" if by_name else "no known peak for this exact name"
    s.say(Line("bf16 peak", f"{name}: {named}; measured {measured / 1e12:.3f} TFLOP/s ({size}^3 matmuls)"))
    return name, by_name, measured


def train_speed(s: Settings, specs: list[str], mfu_target: tuple[str, str] | None = None) -> None:
    name, by_name, measured = peaks(s)
    data = measure.TokenFile(s.tokens)
    d = measure.device_setup("cpu" if s.smoke else "cuda")
    for key in specs[:1] if s.smoke else specs:  # the smoke has one toy size
        spec = measure.SPECS["smoke" if s.smoke else key]
        big = spec.n_layers >= 24
        for mode in ("torch", "triton") if s.smoke else measure.MODES:
            check = f"train {measure.SPECS[key].name} bf16 {mode}"
            try:
                r = measure.train_throughput(
                    spec, mode, d, data, 1 if s.smoke else 4, 2 if s.smoke else (10 if big else 20)
                )
            except Exception as error:  # an out-of-memory, a kernel that does not build: this line fails, not the part
                s.say(Line(check, f"{type(error).__name__}: {str(error)[:300]}", "fail"))
                continue
            by_name_mfu = measure.mfu(r["tokens_per_second"], r["flops_per_token"], by_name)
            by_measured_mfu = measure.mfu(r["tokens_per_second"], r["flops_per_token"], measured)
            figure = (
                f"{r['tokens_per_second']:,.0f} tok/s, {r['step_ms']:.1f} ms a step, MFU {percent(by_name_mfu)} "
                f"of the named peak, {percent(by_measured_mfu)} of the measured; peak memory "
                f"{r['peak_memory_bytes'] / GiB:.2f} GiB; warm-up {r['warmup_seconds']:.1f} s"
            )
            if mfu_target == (key, mode):
                if "H100" in name:
                    s.say(Line(f"{check} (target: MFU >= 40% on an H100)", figure, s.judge(by_name_mfu >= 0.40)))
                else:
                    s.say(Line(f"{check} (the 40% MFU target is an H100's; this is {name})", figure))
            else:
                s.say(Line(check, figure))


def percent(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{100 * share:.1f}%"


def part_speed_small(s: Settings) -> None:
    train_speed(s, ["10M", "gpt2"], mfu_target=("gpt2", "compiled"))


def part_speed_large(s: Settings) -> None:
    train_speed(s, ["350M"])
    rows, width, vocab = (64, 32, 512) if s.smoke else (16384, 768, 50304)
    r = measure.head_and_loss(s.device, rows, width, vocab, repeats=2 if s.smoke else 10)
    ours, theirs = r["chunked"], r["full_logits"]
    time_ratio = ours["seconds"] / theirs["seconds"]
    memory_ratio = ours["memory_bytes"] / theirs["memory_bytes"] if theirs["memory_bytes"] else math.nan
    shape = f"{rows} tokens x d{width} -> vocab {vocab}, bf16, forward + backward"
    s.say(
        Line(
            "head + loss time, chunked vs F.linear + F.cross_entropy (target <= 1.2x)",
            f"{1e3 * ours['seconds']:.1f} ms vs {1e3 * theirs['seconds']:.1f} ms: {time_ratio:.2f}x ({shape})",
            s.judge(time_ratio <= 1.2),
        )
    )
    s.say(
        Line(
            "head + loss memory, chunked vs full logits (target <= 25%)",
            f"{ours['memory_bytes'] / GiB:.2f} GiB vs {theirs['memory_bytes'] / GiB:.2f} GiB: {percent(memory_ratio)}",
            s.judge(memory_ratio <= 0.25),
        )
    )


# ---------------------------------------------------------------------------------------------------------------
# part 5: packing


def start_mps(folder: Path) -> tuple[dict | None, str]:
    """Start an MPS control daemon of our own (its pipe and log folders under `folder`): (the environment its
    clients need, "MPS"), or (None, why not)."""
    import os

    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return None, "no MPS: nvidia-cuda-mps-control is not on PATH"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    result = subprocess.run([control, "-d"], env=env, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return None, f"no MPS: nvidia-cuda-mps-control -d failed ({(result.stderr or result.stdout).strip()[:200]})"
    return env, "MPS"


def stop_mps(env: dict) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, text=True, timeout=60, capture_output=True)


def part_packing(s: Settings) -> None:
    import os

    job = {
        "spec": "smoke" if s.smoke else "10M",
        "mode": "torch" if s.smoke else "triton",
        "device": "cpu" if s.smoke else "cuda",
        "tokens": str(s.tokens),
        "warmup": 1 if s.smoke else 5,
        "seconds": 1.0 if s.smoke else 20.0,
    }
    counts = (1, 2) if s.smoke else (1, 2, 4, 8)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_packing_") as tmp:
        root = Path(tmp)
        results = {}  # (runs, "MPS" | "no MPS") -> aggregate tokens/s
        for k in counts:
            results[k, "no MPS"] = measure.run_packed(k, job, root / f"plain{k}", env, timeout=600)
        mps_env, mps_state = (None, "no MPS: not tried in the CPU smoke") if s.smoke else start_mps(root / "mps")
        if mps_env is not None:
            try:
                for k in counts[1:]:
                    results[k, "MPS"] = measure.run_packed(k, job, root / f"mps{k}", {**mps_env, **env}, timeout=600)
            except RuntimeError as error:
                mps_state = f"MPS started, but a run under it failed ({str(error)[:200]})"
            finally:
                stop_mps(mps_env)
    one = results[1, "no MPS"]
    for (k, how), tokens_per_second in results.items():
        s.say(
            Line(
                f"packing {k} run(s) a GPU, {how}",
                f"{tokens_per_second:,.0f} tok/s, {tokens_per_second / one:.2f}x one run",
            )
        )
    if mps_env is None or mps_state != "MPS":
        s.say(Line("packing with MPS", mps_state))
    (k, how), best = max(results.items(), key=lambda item: item[1])
    s.say(
        Line(
            "best packing of ~10M runs >= 1.5x one run's tokens/s",
            f"{best / one:.2f}x with {k} a GPU, {how}",
            s.judge(best >= 1.5 * one),
        )
    )


# ---------------------------------------------------------------------------------------------------------------

PARTS = [
    Part(
        1,
        "GPU tier: every kernel against its reference",
        3,
        ["pytest -m gpu " + " ".join(TIER_KERNEL_FILES)],
        part_tier_kernels,
    ),
    Part(
        2, "GPU tier: whole runs through the CLI", 7, ["pytest -m gpu tests/test_gpu_*.py (the runs)"], part_tier_runs
    ),
    Part(
        3,
        "training speed: ~10M and GPT-2 small",
        5,
        [
            "bf16 peak: by exact device name, and a measured 8192^3 matmul",
            "~10M (d256, 6 layers, vocab 16384, seq 512, 32 a step) bf16: torch, triton, compiled",
            "GPT-2 small (d768, 12 layers, 12 heads, seq 1024, vocab 50304, 16 a step) bf16: torch, triton, compiled",
            "GPT-2 small compiled bf16: MFU >= 40% of the named peak on an H100",
        ],
        part_speed_small,
    ),
    Part(
        4,
        "training speed ~350M; the head and loss alone",
        5,
        [
            "~350M (d1024, 24 layers, 16 heads, seq 1024, vocab 50304, 16 a step) bf16: torch, triton, compiled",
            "head + loss (16384 x d768 -> 50304, bf16) vs F.linear + F.cross_entropy: time <= 1.2x",
            "head + loss vs F.linear + F.cross_entropy: memory <= 25%",
        ],
        part_speed_large,
    ),
    Part(
        5,
        "packing: ~10M runs side by side on one GPU",
        4,
        ["aggregate tokens/s of 1, 2, 4, 8 runs a GPU, without and (where it starts) with MPS: best >= 1.5x one run"],
        part_packing,
    ),
]


def list_parts() -> None:
    for part in PARTS:
        print(f"part {part.number}: {part.title} (about {part.minutes} min on an H100)")
        for check in part.checks:
            print(f"    {check}")
    print(f"all parts: about {sum(p.minutes for p in PARTS)} min (estimates: no GPU has run them yet)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", type=int, choices=[p.number for p in PARTS], help="run this part alone")
    parser.add_argument("--list", action="store_true", help="name every part and check, with its target")
    parser.add_argument("--tokens", type=Path, default=DEFAULT_TOKENS, help="the token file (default: %(default)s)")
    parser.add_argument(
        "--write-tokens", type=Path, metavar="PATH", help="write the token file (needs ablate installed)"
    )
    parser.add_argument("--vocab", type=int, default=16384, help="--write-tokens: the BPE's vocabulary")
    parser.add_argument("--max-documents", type=int, help="--write-tokens: the corpus's first N documents")
    parser.add_argument("--cpu-smoke", action="store_true", help="every measurement at toy sizes on CPU")
    parser.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)  # one packing run (run_packed)
    args = parser.parse_args(argv)
    if args.worker:
        measure.packing_worker(json.loads(args.worker))
        return 0
    if args.list:
        list_parts()
        return 0
    measure.import_ablate_from_checkout()
    if args.write_tokens:
        header = measure.write_token_file(args.write_tokens, args.vocab, args.max_documents)
        print(
            f"wrote {args.write_tokens} ({header['tokens']:,} tokens, {header['dtype']}, vocab {header['vocab_size']})"
        )
        return 0
    if args.cpu_smoke:
        return run_parts(args, torch.device("cpu"), smoke=True)
    if not torch.cuda.is_available():
        print("gpu_acceptance.py needs a CUDA GPU, and none is visible (--list names the checks)", file=sys.stderr)
        return 2
    return run_parts(args, torch.device("cuda"), smoke=False)


def run_parts(args, device: torch.device, smoke: bool) -> int:
    tokens = args.tokens
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_smoke_") as tmp:
        if smoke:  # a token file of 400 documents at vocab 512: the smoke models' sizes
            tokens = Path(tmp) / "tokens.bin"
            measure.write_token_file(tokens, 512, 400)
        elif not Path(f"{tokens}.json").exists():
            print(
                f"no token file {tokens}: write one with --write-tokens {tokens} (any machine with ablate)",
                file=sys.stderr,
            )
            return 2
        s = Settings(device=device, tokens=tokens, smoke=smoke)
        for part in PARTS:
            if args.part in (None, part.number):
                print(f"== part {part.number}: {part.title}", flush=True)
                start = time.perf_counter()
                part.run(s)
                print(f"   part {part.number} took {time.perf_counter() - start:.0f} s", flush=True)
    failed = [line for line in s.lines if line.verdict == "fail"]
    print(f"{len(s.lines)} lines, {sum(line.verdict == 'pass' for line in s.lines)} pass, {len(failed)} fail")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
