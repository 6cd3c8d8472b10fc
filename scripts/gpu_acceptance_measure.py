"""The measurements of scripts/gpu_acceptance.py and scripts/bench_nanogpt.py: ablate's real training step (RealStep),
the head and loss alone, the matmul peak, packing runs side by side, and what one step launches and waits for.

Every training step measured here is the one `ablate run` takes: the Trainer built through the public path
(check_run, init_distributed, Trainer with its default callbacks), started as Trainer.fit starts a fresh run, then
train_step(). Its data is the embedded corpus through ablate's BPE, prepared once per machine into the data cache
(seconds; on the offline GPU machine the bundle's copy of the corpus, $ABLATE_DEFAULT_CORPUS). Needs what a run
needs (torch, numpy, tokenizers, tensorboard) and ablate, read from this checkout where it is not installed: no
datasets, lm-eval or corpus package, so it runs on the bare GPU machine.
"""

from __future__ import annotations

import gc
import importlib.util
import inspect
import json
import math
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def import_ablate_from_checkout() -> None:
    """Make `import ablate` (ablate.kernels, ablate_evals too) work from this checkout where it is not installed: what
    pip's package-dir mapping does for an installed copy (scripts/ablate_checkout.py)."""
    if importlib.util.find_spec("ablate") is None or importlib.util.find_spec("ablate_evals") is None:
        sys.path.insert(0, str(REPO / "scripts"))
        import ablate_checkout

        ablate_checkout.map_checkout(str(REPO))
    import ablate.kernels  # noqa: F401


# ---------------------------------------------------------------------------------------------------------------
# verdict lines: what scripts/gpu_acceptance.py collects from every step's output


def say(verdict: str, check: str, figure: str) -> None:
    """One verdict line: PASS or FAIL (against a target) or INFO (a figure with no target, or not judged here)."""
    print(f"{verdict.upper():4}  {check}: {figure}", flush=True)


def judge(ok: bool, judged: bool) -> str:
    """A target's verdict; where it is not judged (toy sizes, a CPU), the figure is only said."""
    return "info" if not judged else "pass" if ok else "fail"


def percent(share: float | None) -> str:
    return "n/a" if share is None or math.isnan(share) else f"{100 * share:.1f}%"


# ---------------------------------------------------------------------------------------------------------------
# models, and ablate's real step


@dataclass(frozen=True)
class ModelSpec:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    vocab: int
    seq: int
    batch: int  # sequences a step

    def describe(self) -> str:
        return (
            f"{self.name} (d{self.d_model}, {self.n_layers} layers, {self.n_heads} heads, vocab {self.vocab}, "
            f"seq {self.seq}, {self.batch} a step)"
        )


SPECS = {
    "10M": ModelSpec("~10M", 256, 6, 8, 16384, 512, 32),
    "gpt2": ModelSpec("GPT-2 small", 768, 12, 12, 50304, 1024, 16),
    "350M": ModelSpec("~350M", 1024, 24, 16, 50304, 1024, 16),
    "nanogpt": ModelSpec("nanoGPT's shape", 256, 6, 8, 16384, 512, 8),  # bench_nanogpt.py's CPU default
    "smoke": ModelSpec("smoke", 32, 2, 4, 512, 32, 4),
}
SMOKE_DOCUMENTS = 400  # the toy models read the first documents of the corpus only: tokenized in a second
# the three ways the acceptance's speed steps run a step: (model.kernels, train.compile). "compiled" is what a run
# with train.compile=true does with the default kernels="auto" (ablate.setup.auto decides what that means there)
MODES = {"torch": ("torch", False), "triton": ("triton", False), "compiled": ("auto", True)}
# the measured runs are long ones (the lr schedule's warm-up, the cadences): none of their steps is near the last
LONG_RUN_STEPS = 10_000


def device_setup(device_choice: str):
    from ablate.training.parallel import init_distributed

    return init_distributed(device_choice)  # joined once per process


def run_config(
    spec: ModelSpec,
    device: torch.device,
    *,
    kernels: str = "auto",
    compile: bool | str = "auto",
    dtype: str = "bf16",
    nanogpt: bool = False,
    peak_flops: float | None = None,
    name: str = "measured",
):
    """The RunConfig of a long run of `spec`'s model on the embedded corpus. `nanogpt`: the architecture nearest
    nanoGPT's (GELU 4x MLP, LayerNorm; the head tied, as every ablate model's); else ablate's defaults (SwiGLU,
    RMSNorm). Validation and checkpoints only at the (never reached) last step: what is timed is the step and the
    callbacks every step runs, with the default log_every, so most steps are non-logging ones, as in a run."""
    from ablate.config import DataConfig, ModelConfig, RunConfig, TrainConfig

    architecture = {"ffn": "gelu", "norm": "layernorm"} if nanogpt else {}
    model = ModelConfig(
        vocab_size=spec.vocab,
        d_model=spec.d_model,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        kernels=kernels,
        **architecture,
    )
    documents = SMOKE_DOCUMENTS if spec.name == "smoke" else None
    train = TrainConfig(
        max_steps=LONG_RUN_STEPS,
        global_batch=spec.batch,
        micro_batch=spec.batch,
        device=device.type,
        dtype=dtype,
        compile=compile,
        peak_flops=peak_flops,  # given: no peak measured on CPU for each run (seconds)
        val_every=0,
        ckpt_every=0,
    )
    data = DataConfig(source="default", seq_len=spec.seq, max_documents=documents)
    return RunConfig(experiment="gpu_measure", name=name, model=model, data=data, train=train)


def prepare(run) -> None:
    """Tokenize `run`'s data into the cache once (a parent before its workers, so they do not race to build it)."""
    from ablate.data.prepare import prepare_data

    prepare_data(run.data, run.model.vocab_size)


class RealStep:
    """ablate's training step as `ablate run` takes it: the Trainer built for this process's world (check_run,
    its default callbacks), started as Trainer.fit starts a fresh run, then train_step(). Nothing is stripped: the
    sampler, the pinned copies, the callbacks' verdicts and post_step hooks all run. Without `run_dir`, the run's
    folder (metrics.jsonl, TensorBoard) is a temporary one, gone at close()."""

    def __init__(self, run, d, run_dir: Path | None = None):
        from ablate.setup.checks import check_run
        from ablate.training.trainer import Trainer

        self._tmp = None if run_dir else tempfile.TemporaryDirectory(prefix="ablate_measure_")
        run_dir = Path(run_dir or self._tmp.name)
        run_dir.mkdir(parents=True, exist_ok=True)  # what a run's start (ablate.training.run) makes first
        self.device = d.device
        self.trainer = Trainer(check_run(run, d.world), run_dir, d)
        self.log_every = run.train.log_every
        self.tokens_per_step = run.train.global_batch * run.data.seq_len
        self.flops_per_token = self.trainer.flops_per_token
        self.compiled = getattr(self.trainer, "compiled", None)
        self._begin()

    def _begin(self) -> None:
        """What Trainer.fit does before its first step of a fresh run (nothing to resume): the clock, the seeds,
        the metrics channel, then Trainer.begin (every callback's pre_train, train mode)."""
        from ablate.training.parallel import seed_everything

        t = self.trainer
        t.start_time = time.perf_counter()
        seed_everything(t.run.train.seed + t.dist.rank)
        t.channel.open(t.step)
        t.begin()

    def step(self) -> None:
        self.trainer.train_step()

    def logs_at(self, step: int) -> bool:
        """Whether `step` (counted from 1, as trainer.step counts it after the step) is a logging step."""
        from ablate.training.callbacks.base import due

        return due(step, self.log_every, self.trainer.max_steps)

    @property
    def steps_taken(self) -> int:
        return self.trainer.step

    def final_loss(self) -> float:
        return self.trainer.last_loss  # a host read: only after the timed steps

    def timed(self, steps: int) -> float:
        """Seconds for `steps` steps, the device drained before and after."""
        return timed_steps(self.step, self.device, steps)

    def close(self) -> None:
        """The run's files closed (Trainer.end, as fit's end); its folder removed if it was a temporary one."""
        self.trainer.end()
        if self._tmp is not None:
            self._tmp.cleanup()


def timed_steps(step, device: torch.device, steps: int) -> float:
    """Seconds for `steps` calls of `step`, the device drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return time.perf_counter() - start


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_memory(device: torch.device) -> None:
    gc.collect()  # FSDP2's hooks hold the last model in reference cycles
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0


def allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def train_throughput(spec: ModelSpec, mode: str, d, warmup: int, steps: int, peak_flops: float | None) -> dict:
    """tokens/s, step time and peak memory of `steps` real training steps after `warmup` (compile happens there)."""
    kernels, compiled = MODES[mode]
    reset_memory(d.device)
    real = RealStep(run_config(spec, d.device, kernels=kernels, compile=compiled, peak_flops=peak_flops), d)
    try:
        compile_seconds = real.timed(warmup)
        seconds = real.timed(steps)
        return {
            "tokens_per_second": steps * real.tokens_per_step / seconds,
            "step_ms": 1e3 * seconds / steps,
            "warmup_seconds": compile_seconds,
            "flops_per_token": real.flops_per_token,
            "peak_memory_bytes": peak_memory(d.device),
        }
    finally:
        real.close()
        del real
        reset_memory(d.device)


# ---------------------------------------------------------------------------------------------------------------
# what one step launches and waits for (CUDA)

SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's text in sync debug mode "warn"


class HostSyncs:
    """Counts the host syncs torch flags in the block (torch.cuda.set_sync_debug_mode("warn"): .item(), .tolist(), a
    blocking copy to the host, nonzero, a stream's synchronize...); what torch does not flag (a pinned allocation,
    a collective's wait) is not counted. CUDA only: on CPU `count` stays None."""

    def __init__(self, device: torch.device):
        self.on = device.type == "cuda"
        self.count: int | None = None

    def __enter__(self) -> HostSyncs:
        if self.on:
            self._catching = warnings.catch_warnings(record=True)
            self._caught = self._catching.__enter__()
            warnings.simplefilter("always")  # every sync, not once per source line
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if self.on:
            torch.cuda.set_sync_debug_mode("default")
            self._catching.__exit__(*exc)
            self.count = sum(SYNC_WARNING in str(w.message) for w in self._caught)


def kernels_launched(step, device: torch.device) -> int | None:
    """Device kernels one call of `step` launches (memory copies and sets not counted), under torch.profiler; None
    on CPU."""
    if device.type != "cuda":
        return None
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    synchronize(device)
    with torch.profiler.profile(activities=activities) as profile:
        step()
        synchronize(device)
    return sum(
        1
        for e in profile.events()
        if e.device_type.name == "CUDA" and not e.name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset"))
    )


# ---------------------------------------------------------------------------------------------------------------
# the peak: by the device's exact name (ablate.training.parallel.GPU_PEAKS, the one table), and measured


def matmul_peak(device: torch.device, size: int, seconds: float) -> float:
    """The best bf16 FLOP/s of size x size matmuls over `seconds`, 10 at a time."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        synchronize(device)
        best = max(best, 10 * 2 * size**3 / (time.perf_counter() - start))
    return best


def named_peak(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[str, float | None]:
    """(the device's name, its dense peak for `dtype` by exact name, or None where unknown or on CPU)."""
    from ablate.training.parallel import gpu_peak_flops

    if device.type != "cuda":
        return "CPU", None
    name = torch.cuda.get_device_name(device)
    return name, gpu_peak_flops(name, dtype)


def mfu(tokens_per_second: float, flops_per_token: float, peak: float | None) -> float:
    return tokens_per_second * flops_per_token / peak if peak else math.nan


# ---------------------------------------------------------------------------------------------------------------
# the head and loss alone


def head_and_loss(device: torch.device, rows: int, width: int, vocab: int, repeats: int, chunks=None) -> dict:
    """Forward and backward of the output projection plus the loss, bf16: ablate.kernels.linear_cross_entropy as
    a run calls it (kernels="auto"; `chunks`, a run's model.loss_chunks, where the kernel takes it) against
    F.linear + F.cross_entropy on whole logits (fp32 for the loss, as autocast does). Median seconds and, on CUDA,
    peak memory above the inputs, each; and the chunks passed (None: the kernel's own rule)."""
    import torch.nn.functional as F

    from ablate import kernels

    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(rows, width, device=device, generator=g, dtype=torch.bfloat16).requires_grad_()
    weight = (0.02 * torch.randn(vocab, width, device=device, generator=g)).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), device=device, generator=g)
    takes_chunks = "chunks" in inspect.signature(kernels.linear_cross_entropy).parameters
    extra = {"chunks": chunks} if takes_chunks and chunks is not None else {}

    def ablate_loss():
        loss, _ = kernels.linear_cross_entropy(hidden, weight, targets, kernels="auto", **extra)
        loss.backward()

    def full_logits():
        loss = F.cross_entropy(F.linear(hidden, weight).float(), targets)
        loss.backward()

    result = {"chunks": extra.get("chunks")}
    for name, fn in (("ablate", ablate_loss), ("full_logits", full_logits)):
        fn()  # compile and warm up
        hidden.grad = weight.grad = None
        reset_memory(device)
        base = allocated(device)
        times = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - start)
            hidden.grad = weight.grad = None
        memory = peak_memory(device) - base if device.type == "cuda" else None
        result[name] = {"seconds": statistics.median(times), "memory_bytes": memory}
    return result


# ---------------------------------------------------------------------------------------------------------------
# packing: one worker process per run


def packing_worker(job: dict) -> None:
    """One run of the packing measurement: build and warm up, say ready (a file), wait for the go file, train for
    job["seconds"], write tokens/s to job["result"]."""
    import_ablate_from_checkout()
    d = device_setup(job["device"])
    kernels, compiled = MODES[job["mode"]]
    run = run_config(SPECS[job["spec"]], d.device, kernels=kernels, compile=compiled, peak_flops=job["peak_flops"])
    real = RealStep(run, d, Path(job["run_dir"]))
    real.timed(job["warmup"])
    Path(job["ready"]).write_text("ready\n")
    deadline = time.time() + 600
    while not Path(job["go"]).exists():
        if time.time() > deadline:
            raise TimeoutError("no go file within 10 minutes")
        time.sleep(0.01)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < job["seconds"]:
        real.step()
        steps += 1
        if steps % 5 == 0:
            synchronize(d.device)
    synchronize(d.device)
    tokens_per_second = steps * real.tokens_per_step / (time.perf_counter() - start)
    Path(job["result"]).write_text(json.dumps({"tokens_per_second": tokens_per_second, "steps": steps}) + "\n")
    real.close()


def run_packed(k: int, job: dict, folder: Path, env: dict, timeout: float) -> float:
    """Aggregate tokens/s of `k` workers trained side by side (they start timing together): the sum of each one's."""
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    go = folder / "go"
    procs, results = [], []
    for i in range(k):
        worker_job = {**job, "index": i, "go": str(go), "run_dir": str(folder / f"run{i}")}
        worker_job.update(ready=str(folder / f"ready{i}"), result=str(folder / f"result{i}.json"))
        results.append(Path(worker_job["result"]))
        command = [sys.executable, str(REPO / "scripts" / "gpu_acceptance.py"), "--worker", json.dumps(worker_job)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        deadline = time.time() + timeout
        while not all((folder / f"ready{i}").exists() for i in range(k)):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed or time.time() > deadline:
                output = failed[0].communicate()[0][-2000:] if failed else "timed out"
                raise RuntimeError(f"a packing worker failed before it was ready: {output}")
            time.sleep(0.05)
        go.write_text("go\n")
        for p in procs:
            output = p.communicate(timeout=timeout)[0]
            if p.returncode != 0:
                raise RuntimeError(f"a packing worker failed: {output[-2000:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return sum(json.loads(r.read_text())["tokens_per_second"] for r in results)


# ---------------------------------------------------------------------------------------------------------------
# where a step's time goes


def step_profile(real: RealStep, steps: int) -> dict:
    """`steps` real steps under torch.profiler: the share of their wall time the device spends in kernels, the ops
    with the most CPU time of their own, the kernels with the most device time, and kernels launched a step. A step
    whose device is mostly idle is held back by the host; one whose device is busy, by its kernels."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    on_gpu = real.device.type == "cuda"
    if on_gpu:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        wall = real.timed(steps)
    events = profile.key_averages()
    device_events = [e for e in events if e.device_type.name == "CUDA"]
    device_us = sum(e.self_device_time_total for e in device_events)
    launched = sum(e.count for e in device_events if not e.key.startswith(("Memcpy", "Memset")))
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    kernels = sorted(device_events, key=lambda e: e.self_device_time_total, reverse=True)[:8]
    return {
        "step_ms": 1e3 * wall / steps,
        "device_busy": device_us / 1e6 / wall if on_gpu else math.nan,
        "kernels_per_step": launched / steps if on_gpu else math.nan,
        "top_cpu": [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in top],
        "top_device": [(e.key[:80], e.self_device_time_total / 1e3 / steps, e.count // steps) for e in kernels],
    }
