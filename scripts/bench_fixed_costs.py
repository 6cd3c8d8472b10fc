"""A run's fixed costs: where the wall time of `ablate run` goes besides the runs' steps, for the quickstart as
stacks (--stack K) and as lone runs, each in a process of its own as a user starts it.

    python scripts/bench_fixed_costs.py [--steps 1,50] [--stack 3] [--repeats 3] [--device cuda]
    python scripts/bench_fixed_costs.py --compile-cache   # also: a tiny compiled run's compile, cold vs warm cache
    python scripts/bench_fixed_costs.py --smoke           # 2 seeds of the baseline, 1 step: checks the script runs

Each measurement is `python -m ablate run experiments/quickstart.py --stack K --set train.max_steps=N` in a fresh
process (its own --out, the data cache warm), with timers around the functions a run passes through, counted
exclusively (validation inside a step is validation's, an import inside the model build is the import's):

  python start        the interpreter's start, to this script's first line in the child
  imports             every outermost import (which modules, and who imported each first: --imports N lists them)
  experiment, parse   the parser, loading and checking the experiment file, and what is not timed below
  data                the data cache found (prepare_all, then each run's prepare_data) and opened
  model build + init  each run's Transformer, built and initialised (its reference weights on rank 0)
  optimizer           each run's optimizer built
  trainer setup       the rest of each Trainer (callbacks, sampler, figures)
  stack setup         a stack's shared storage and its vmapped loss (StackedTrainer)
  run folder          lock, config.json, status and source (training.run._decide), summary.json written
  start               resume check, metrics.jsonl and TensorBoard opened (Trainer.start)
  first step          the first step (with compile, a compile's warm-up), without its callbacks below
  later steps         every other step, without its callbacks below
  validation          held-out loss (every val_every steps and the last; a stack's members due together in one pass)
  monitors            the stability monitors' logit statistics (a forward of a batch, at the log cadence)
  checkpoint          the DCP save (every ckpt_every steps and the last)
  summary             summary.json's figures (the tokenizer's figures on the validation documents)
  free memory         the full garbage collection after each run or stack
  teardown            from the command's end to the process's exit (the interpreter's teardown, or none)

Then `ratio fixed costs / wall time, stacks`: the share of the stacked command's wall time that is not its steps.
On a GPU (--device cuda) every timer synchronises the device at its ends, so a step's kernels are the step's.
Run it on an idle machine; --repeats gives each figure's median.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "experiments" / "quickstart.py"
PHASES = [
    "python start",
    "imports",
    "experiment, parse",
    "data",
    "model build + init",
    "optimizer",
    "trainer setup",
    "stack setup",
    "run folder",
    "start",
    "first step",
    "later steps",
    "validation",
    "monitors",
    "checkpoint",
    "summary",
    "free memory",
    "teardown",
]
STEPS = ("first step", "later steps")
# heavy modules: each one's import (with what it imports first) and who imported it first, at any depth
WATCHED = (
    "torch",
    "numpy",
    "torch.distributed.tensor",
    "torch.distributed.checkpoint",
    "torch._dynamo",
    "torch._inductor",
    "torch.utils.tensorboard",
    "sympy",
    "triton",
    "tokenizers",
    "scipy",
    "matplotlib",
    "pandas",
    "datasets",
    "transformers",
)
COMPILE_EXPERIMENT = """
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant
base = RunConfig(
    experiment="compile_cache",
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    data=DataConfig(source="default", max_documents=400, seq_len=32, val_sequences=8),
    train=TrainConfig(max_steps=2, global_batch=8, micro_batch=8, val_every=0, ckpt_every=0, compile=True),
)
runs = [variant(base, "compiled")]
"""


# ---------------------------------------------------------------------------------------------------------------
# the child: one `ablate run`, timed from inside


class Timers:
    """Exclusive seconds per phase: a phase's time less the phases (and imports) that ran inside it."""

    def __init__(self, sync: bool):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.stack: list[list] = []  # [phase, start, time of the phases inside]
        self.sync = sync
        self.imports: dict[str, list] = {}  # outermost import -> [seconds, first importer]
        self.watched: dict[str, list] = {}  # a WATCHED module -> [seconds, first importer]
        self.gc = [0.0, 0]  # full collections: seconds, count
        self.first_steps: list[float] = []  # each run's (or stack's) first step, in order
        self.gc_phases: dict[str, int] = {}  # full collections per phase

    def collected(self, phase: str, info: dict) -> None:
        """gc.callbacks: the seconds and count of full collections (generation 2), inside whichever phase."""
        if info["generation"] != 2:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc[0] += time.perf_counter() - self._gc_start
            self.gc[1] += 1
            phase = self.stack[-1][0] if self.stack else "?"
            self.gc_phases[phase] = self.gc_phases.get(phase, 0) + 1

    def _synchronize(self) -> None:
        if self.sync:
            torch = sys.modules.get("torch")
            if torch is not None and torch.cuda.is_initialized():
                torch.cuda.synchronize()

    def enter(self, phase: str) -> None:
        self._synchronize()
        self.stack.append([phase, time.perf_counter(), 0.0])

    def leave(self) -> float:
        self._synchronize()
        phase, start, inner = self.stack.pop()
        spent = time.perf_counter() - start
        self.seconds[phase] = self.seconds.get(phase, 0.0) + spent - inner
        if phase == "first step":
            self.first_steps.append(spent - inner)
        self.calls[phase] = self.calls.get(phase, 0) + 1
        if self.stack:
            self.stack[-1][2] += spent
        return spent

    def wrap(self, owner, name: str, phase) -> None:
        """owner.name timed as `phase` (a name, or a function of the call's arguments giving one)."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            self.enter(phase(*args) if callable(phase) else phase)
            try:
                return original(*args, **kwargs)
            finally:
                self.leave()

        setattr(owner, name, timed)

    def hook_imports(self) -> None:
        """Every outermost import timed (importlib's _find_and_load, which the import statement calls)."""
        import importlib._bootstrap as bootstrap

        original, depth, waiting = bootstrap._find_and_load, [0], _installers(self)

        def find_and_load(name, import_):
            if name in WATCHED and name not in sys.modules and name not in self.watched:
                self.watched[name] = [time.perf_counter(), _importer()]
                try:
                    return find_and_load_outermost(name, import_)
                finally:
                    self.watched[name][0] = time.perf_counter() - self.watched[name][0]
            return find_and_load_outermost(name, import_)

        def find_and_load_outermost(name, import_):
            if depth[0] or name in sys.modules:
                return original(name, import_)
            depth[0] += 1
            self.enter("imports")
            try:
                return original(name, import_)
            finally:
                spent = self.leave()
                depth[0] -= 1
                entry = self.imports.setdefault(name, [0.0, _importer()])
                entry[0] += spent
                for module in [m for m in waiting if m in sys.modules]:
                    waiting.pop(module)(sys.modules[module])

        bootstrap._find_and_load = find_and_load


HOOKS = ("find_and_load", "find_and_load_outermost", "_importer")


def _importer() -> str:
    """The first frame outside importlib: who imported."""

    def machinery(code) -> bool:
        return "importlib" in code.co_filename or code.co_filename.startswith("<") or code.co_name in HOOKS

    frame = sys._getframe(1)
    while frame is not None and machinery(frame.f_code):
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    for root in (str(REPO / "src") + os.sep, str(REPO) + os.sep, "site-packages" + os.sep):
        name = name.split(root, 1)[-1]
    return f"{name}:{frame.f_lineno}"


def child(report: str, started: float, sync: bool, argv: list[str]) -> None:
    """Run `ablate run argv` here as its console script does (so its own exit path), timed; `report` gets the
    figures from an exit handler, which runs however the process ends."""
    timers = Timers(sync)
    timers.seconds["python start"] = time.time() - started
    timers.hook_imports()
    timers.enter("experiment, parse")  # the outermost phase: what no other timer claims

    def write() -> None:
        while len(timers.stack) > 1:  # the command ended inside a phase (an error): close it
            timers.leave()
        timers.leave()
        imports = sorted(timers.imports.items(), key=lambda kv: -kv[1][0])
        Path(report).write_text(
            json.dumps(
                {
                    "seconds": timers.seconds,
                    "calls": timers.calls,
                    "imports": imports,
                    "watched": timers.watched,
                    "gc": timers.gc,
                    "gc_phases": timers.gc_phases,
                    "first_steps": timers.first_steps,
                    "ended": time.time(),
                }
            )
        )

    atexit.register(write)
    gc.callbacks.append(timers.collected)
    sys.argv = ["ablate", "run", *argv]
    from ablate.cli import main

    code = main()
    sys.exit(code)


def _installers(timers: Timers) -> dict:
    """module -> what puts the timers around its functions, done once the module is imported by the command
    itself (so the import table says who imports what, as in a plain run)."""

    def step_phase(trainer, *_):
        if timers.stack and timers.stack[-1][0] in STEPS:  # a stack's member stepping alone: the stack's step
            return timers.stack[-1][0]
        if getattr(trainer, "_bench_stepped", False):
            return "later steps"
        trainer._bench_stepped = True  # each run's (or stack's) first step
        return "first step"

    def sweep(m):
        timers.wrap(m, "prepare_all", "data")

    def trainer(m):
        timers.wrap(m, "prepare_data", "data")
        timers.wrap(m.Trainer, "_build_model", "model build + init")
        timers.wrap(m, "build_optimizer", "optimizer")
        timers.wrap(m.Trainer, "__init__", "trainer setup")
        timers.wrap(m.Trainer, "start", "start")
        timers.wrap(m.Trainer, "train_step", step_phase)
        timers.wrap(m.Trainer, "summary", "summary")

    def stack(m):
        timers.wrap(m.StackedTrainer, "__init__", "stack setup")
        timers.wrap(m.StackedTrainer, "train_step", step_phase)

    def run(m):
        timers.wrap(m, "_decide", "run folder")
        timers.wrap(m, "_write_finished", "run folder")
        timers.wrap(m, "free_memory", "free memory")

    return {
        "ablate.launch.sweep": sweep,
        "ablate.training.trainer": trainer,
        "ablate.training.stack": stack,
        "ablate.training.run": run,
        "ablate.training.callbacks.validation": lambda m: timers.wrap(m.Validation, "validate", "validation"),
        "ablate.training.stack_eval": lambda m: timers.wrap(m, "validate_together", "validation"),
        "ablate.training.callbacks.stability": lambda m: timers.wrap(m.StabilityMonitors, "logit_stats", "monitors"),
        "ablate.training.callbacks.checkpointing": lambda m: timers.wrap(m, "save_checkpoint", "checkpoint"),
    }


# ---------------------------------------------------------------------------------------------------------------
# the parent: fresh processes, medians, the table


def measure(argv: list[str], env: dict, sync: bool, keep: Path | None = None) -> dict:
    """One `ablate run argv` in a fresh process: its phases' seconds, calls and imports, and its wall time; its
    runs written under `keep` (else a temporary folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        out = keep or Path(tmp) / "runs"
        started = time.time()
        command = [sys.executable, __file__, "--child", str(report), str(started), str(int(sync)), "--"]
        result = subprocess.run([*command, *argv, "--out", str(out)], env=env, capture_output=True, text=True)
        ended = time.time()
        if result.returncode or not report.exists():
            raise SystemExit(f"ablate run {' '.join(argv)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        figures = json.loads(report.read_text())
    figures["seconds"]["teardown"] = ended - figures["ended"]
    figures["wall"] = ended - started
    return figures


def median_of(samples: list[dict]) -> dict:
    seconds = {p: statistics.median(s["seconds"].get(p, 0.0) for s in samples) for p in PHASES}
    return {
        "seconds": seconds,
        "gc": [statistics.median(s["gc"][0] for s in samples), samples[0]["gc"][1], samples[0]["gc_phases"]],
        "calls": samples[0]["calls"],
        "wall": statistics.median(s["wall"] for s in samples),
        "imports": samples[0]["imports"],
        "watched": samples[0]["watched"],
    }


def table(results: dict[str, dict], imports: int) -> None:
    names = list(results)
    print(f"{'phase':<20}" + "".join(f"{n:>22}" for n in names))
    for phase in PHASES:
        cells = []
        for n in names:
            seconds, calls = results[n]["seconds"][phase], results[n]["calls"].get(phase)
            cells.append(f"{seconds:8.2f} s" + (f" ({calls}x)" if calls and calls > 1 else ""))
        print(f"{phase:<20}" + "".join(f"{c:>22}" for c in cells))
    print(f"{'wall time':<20}" + "".join(f"{results[n]['wall']:8.2f} s".rjust(22) for n in names))
    fixed = {n: results[n]["wall"] - sum(results[n]["seconds"][p] for p in STEPS) for n in names}
    print(f"{'fixed (not steps)':<20}" + "".join(f"{fixed[n]:8.2f} s".rjust(22) for n in names))
    cells = [f"{results[n]['gc'][0]:8.2f} s ({results[n]['gc'][1]}x)".rjust(22) for n in names]
    print(f"{'full collections':<20}" + "".join(cells) + "   (inside the phases above)")
    for n in names:
        where = ", ".join(f"{phase} {count}" for phase, count in results[n]["gc"][2].items())
        print(f"  {n}: full collections in {where or 'no phase'}")
    if imports:
        first = results[names[0]]
        print(f"\nthe {imports} slowest outermost imports ({names[0]}): seconds, module, first imported at")
        for name, (seconds, where) in first["imports"][:imports]:
            print(f"  {seconds:6.2f} s  {name:<40} {where}")
        print(f"\nheavy modules ({names[0]}): seconds of their import (with what they import first), first imported at")
        for name in WATCHED:
            seconds, where = first["watched"].get(name, (None, "not imported"))
            print(f"  {'' if seconds is None else f'{seconds:6.2f} s':>8}  {name:<40} {where}")


def compile_cache(env: dict, repeats: int) -> None:
    """Two seeds of a tiny compiled run, in one process, twice in fresh processes sharing one empty
    TORCHINDUCTOR_CACHE_DIR: the first process compiles cold (Inductor's FX graph and AOTAutograd caches empty), the
    second finds them warm (dynamo still traces in each process); each process's second run reuses its first's."""
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as tmp:
        exp = Path(tmp) / "compile_cache.py"
        exp.write_text(COMPILE_EXPERIMENT)
        for k in range(repeats):
            cache = Path(tmp) / f"inductor{k}"
            run_env = {**env, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
            cold.append(measure([str(exp), "--seeds", "0,1"], run_env, sync=False)["first_steps"])
            warm.append(measure([str(exp), "--seeds", "0,1"], run_env, sync=False)["first_steps"])
    c, w = (statistics.median(s[0] for s in side) for side in (cold, warm))
    again = statistics.median(s[1] for s in cold)  # the second run of the process: dynamo's own cache
    print(
        f"\ncompile cache, a tiny compiled run (fresh processes, one TORCHINDUCTOR_CACHE_DIR): first step (its "
        f"compile) {c:.2f} s cold, {w:.2f} s warm; a second run of the shape in the same process {again:.2f} s"
    )
    print(f"ratio first step cold / warm inductor cache: {c / w:.2f}x")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        report, started, sync = sys.argv[2], float(sys.argv[3]), bool(int(sys.argv[4]))
        return child(report, started, sync, sys.argv[sys.argv.index("--") + 1 :])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="1", help="comma-separated train.max_steps values (default 1)")
    parser.add_argument("--stack", type=int, default=3, help="K of the stacked side (default 3)")
    parser.add_argument("--repeats", type=int, default=1, help="processes per figure; the median is shown")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--imports", type=int, default=10, help="list the N slowest outermost imports")
    parser.add_argument("--no-lone", action="store_true", help="measure the stacks only")
    parser.add_argument("--compile-cache", action="store_true", help="also a compile's time, cold vs warm cache")
    parser.add_argument("--smoke", action="store_true", help="2 seeds of the baseline, 1 step, 8 val sequences")
    parser.add_argument("--keep", type=Path, help="keep each measurement's runs under KEEP/<side>_<steps>_<k>")
    args = parser.parse_args()

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if args.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    base = [str(QUICKSTART), "--set", f"train.device={args.device}"]
    if args.smoke:
        base += ["--only", "baseline", "--seeds", "0,1", "--set", "data.val_sequences=8"]
        args.stack, args.steps, args.repeats = 2, "1", 1
    sync = args.device == "cuda"
    warm_cache = [*base, "--only", "baseline", "--seeds", "0", "--set", "train.max_steps=1"]
    measure(warm_cache, env, sync)  # the data cache built (or found) before anything is timed
    stacked = None
    for steps in [int(s) for s in args.steps.split(",")]:
        argv = [*base, "--set", f"train.max_steps={steps}"]
        sides = {f"stacks of {args.stack}": [*argv, "--stack", str(args.stack)]}
        if not args.no_lone:
            sides["lone runs"] = [*argv, "--stack", "1"]
        results = {}
        for name, side in sides.items():
            keep = [
                args.keep / f"{name.replace(' ', '_')}_{steps}_{k}" if args.keep else None for k in range(args.repeats)
            ]
            results[name] = median_of([measure(side, env, sync, keep[k]) for k in range(args.repeats)])
        print(f"\n== train.max_steps={steps}, {args.device}, median of {args.repeats} process(es) a figure")
        table(results, args.imports)
        stacked = stacked or results[next(iter(results))]
    fixed = stacked["wall"] - sum(stacked["seconds"][p] for p in STEPS)
    print(f"\nratio fixed costs / wall time, stacks: {fixed / stacked['wall']:.2f}x")
    if args.compile_cache:
        compile_cache(env, args.repeats)


if __name__ == "__main__":
    main()
