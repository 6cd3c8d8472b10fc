"""The measurements of scripts/gpu_acceptance.py: training steps, the head and loss alone, the matmul peak, packing.

Needs torch, numpy and ablate's model code only (ablate.model, ablate.training.parallel, ablate.optim), read from this
checkout when ablate is not installed: no datasets, tokenizers or tensorboard, so it runs on a bare GPU machine. Its
data is a token file written beforehand on any machine (write_token_file).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import statistics
import sys
import time
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
# the token file: raw token ids, and a JSON header beside it


def write_token_file(path: Path, vocab_size: int, max_documents: int | None) -> dict:
    """Tokenize the embedded corpus with ablate's BPE of `vocab_size`; write its training split's ids to `path`
    (uint16 or uint32) and a header to path + .json."""
    import numpy as np

    from ablate.config import DataConfig
    from ablate.data.prepare import prepare_data

    prepared = prepare_data(DataConfig(source="default", max_documents=max_documents), vocab_size)
    dtype = np.uint16 if prepared.vocab_size <= 2**16 else np.uint32
    tokens = np.asarray(prepared.train.tokens).astype(dtype)
    tokens.tofile(path)
    header = {"vocab_size": prepared.vocab_size, "dtype": np.dtype(dtype).name, "tokens": int(tokens.size)}
    Path(f"{path}.json").write_text(json.dumps(header) + "\n")
    return header


class TokenFile:
    """Random windows of a token file, as (inputs, targets) batches on the device."""

    def __init__(self, path: Path, seed: int = 0):
        import numpy as np

        self.header = json.loads(Path(f"{path}.json").read_text())
        self.tokens = np.memmap(path, dtype=self.header["dtype"], mode="r")
        self.rng = np.random.default_rng(seed)

    @property
    def vocab_size(self) -> int:
        return self.header["vocab_size"]

    def batch(self, batch: int, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np

        starts = self.rng.integers(0, len(self.tokens) - seq - 1, batch)
        windows = torch.from_numpy(np.stack([self.tokens[s : s + seq + 1] for s in starts]).astype(np.int64))
        if device.type == "cuda":
            windows = windows.pin_memory().to(device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]


# ---------------------------------------------------------------------------------------------------------------
# models and their training step


@dataclass(frozen=True)
class ModelSpec:
    name: str
    d_model: int
    n_layers: int
    n_heads: int
    vocab: int
    seq: int
    batch: int  # sequences a step


SPECS = {
    "10M": ModelSpec("~10M", 256, 6, 8, 16384, 512, 32),
    "gpt2": ModelSpec("GPT-2 small", 768, 12, 12, 50304, 1024, 16),
    "350M": ModelSpec("~350M", 1024, 24, 16, 50304, 1024, 16),
    "smoke": ModelSpec("smoke", 32, 2, 4, 512, 32, 4),
}
# the three ways a step runs: (model.kernels, compiled blocks)
MODES = {"torch": ("torch", False), "triton": ("triton", False), "compiled": ("triton", True)}


def device_setup(device_choice: str):
    from ablate.training.parallel import init_distributed

    return init_distributed(device_choice)  # a 1-rank group (FSDP2 needs one), joined once per process


class Stepper:
    """One model of `spec` trained as `ablate run` trains it: FSDP2 with bf16 parameters over fp32 masters, ablate's
    optimizer (AdamW, its parameter groups), gradient clipping; fed random windows of the token file."""

    def __init__(self, spec: ModelSpec, mode: str, d, data: TokenFile, bf16: bool = True):
        from ablate.config import ModelConfig, OptimConfig
        from ablate.model import Transformer
        from ablate.optim import build_optimizer
        from ablate.training.parallel import parallelize

        kernels, compiled = MODES[mode]
        if spec.vocab < data.vocab_size:
            raise ValueError(f"{spec.name}: vocab {spec.vocab} < the token file's {data.vocab_size}")
        cfg = ModelConfig(
            vocab_size=spec.vocab, d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, kernels=kernels
        )
        self.spec, self.device, self.data = spec, d.device, data
        torch.manual_seed(0)
        with torch.device(d.device):
            self.model = Transformer(cfg, max_seq_len=spec.seq)
            self.model.init_weights()
        if compiled:
            torch._dynamo.reset()  # each model compiles afresh: no recompile limit reached across models
        parallelize(self.model, d, param_dtype=torch.bfloat16 if bf16 else None, compile_model=compiled)
        self.optimizer = build_optimizer(self.model, OptimConfig(lr=3e-4))
        self.flops_per_token = self.model.flops_per_token(spec.seq)

    @property
    def tokens_per_step(self) -> int:
        return self.spec.batch * self.spec.seq

    def step(self) -> None:
        inputs, targets = self.data.batch(self.spec.batch, self.spec.seq, self.device)
        loss, _ = self.model.loss(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed(self, steps: int) -> float:
        """Seconds for `steps` steps, the device drained before and after."""
        synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        synchronize(self.device)
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


def train_throughput(spec: ModelSpec, mode: str, d, data: TokenFile, warmup: int, steps: int) -> dict:
    """tokens/s, step time and peak memory of `steps` training steps after `warmup` (compile happens there)."""
    reset_memory(d.device)
    stepper = Stepper(spec, mode, d, data)
    compile_seconds = stepper.timed(warmup)
    seconds = stepper.timed(steps)
    result = {
        "tokens_per_second": steps * stepper.tokens_per_step / seconds,
        "step_ms": 1e3 * seconds / steps,
        "warmup_seconds": compile_seconds,
        "flops_per_token": stepper.flops_per_token,
        "peak_memory_bytes": peak_memory(d.device),
    }
    del stepper
    reset_memory(d.device)
    return result


# ---------------------------------------------------------------------------------------------------------------
# the peak: by the device's exact name, and measured


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


# Dense bf16 tensor-core peaks (FLOP/s) by torch.cuda.get_device_name, exactly: an H100 PCIe is not an H100 SXM.
# Used when ablate.training.parallel has no gpu_peak_flops(name, dtype) to ask.
DENSE_BF16_PEAKS = {
    "NVIDIA H100 80GB HBM3": 989e12,  # SXM
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA H100 NVL": 835e12,
    "NVIDIA H200": 989e12,
    "NVIDIA GH200 480GB": 989e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-PCIE-40GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA L40S": 362e12,
    "NVIDIA L40": 181e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10": 125e12,
    "NVIDIA GeForce RTX 4090": 165e12,
}


def named_peak(device: torch.device) -> tuple[str, float | None]:
    """(the device's name, its dense bf16 peak by exact name, or None where unknown)."""
    if device.type != "cuda":
        return "CPU", None
    name = torch.cuda.get_device_name(device)
    try:
        from ablate.training.parallel import gpu_peak_flops
    except ImportError:
        return name, DENSE_BF16_PEAKS.get(name)
    return name, gpu_peak_flops(name, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------------
# the head and loss alone


def head_and_loss(device: torch.device, rows: int, width: int, vocab: int, repeats: int) -> dict:
    """Forward and backward of the output projection plus the loss, bf16: ablate's chunked loss (model.kernels
    "triton" on a GPU) against F.linear + F.cross_entropy on whole logits (fp32 for the loss, as autocast does).
    Median seconds and peak memory above the inputs, each."""
    import torch.nn.functional as F

    from ablate import kernels

    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(rows, width, device=device, generator=g, dtype=torch.bfloat16).requires_grad_()
    weight = (0.02 * torch.randn(vocab, width, device=device, generator=g)).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), device=device, generator=g)
    choice = "triton" if device.type == "cuda" else "torch"

    def chunked():
        loss, _ = kernels.linear_cross_entropy(hidden, weight, targets, kernels=choice)
        loss.backward()

    def full_logits():
        loss = F.cross_entropy(F.linear(hidden, weight).float(), targets)
        loss.backward()

    result = {}
    for name, fn in (("chunked", chunked), ("full_logits", full_logits)):
        fn()  # compile and warm up
        hidden.grad = weight.grad = None
        reset_memory(device)
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        times = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times.append(time.perf_counter() - start)
            hidden.grad = weight.grad = None
        result[name] = {"seconds": statistics.median(times), "memory_bytes": peak_memory(device) - base}
    return result


# ---------------------------------------------------------------------------------------------------------------
# packing: one worker process per run


def packing_worker(job: dict) -> None:
    """One run of the packing measurement: build and warm up, say ready (a file), wait for the go file, train for
    job["seconds"], write tokens/s to job["result"]."""
    import_ablate_from_checkout()
    d = device_setup(job["device"])
    data = TokenFile(Path(job["tokens"]), seed=job["index"])
    stepper = Stepper(SPECS[job["spec"]], job["mode"], d, data)
    stepper.timed(job["warmup"])
    Path(job["ready"]).write_text("ready\n")
    deadline = time.time() + 600
    while not Path(job["go"]).exists():
        if time.time() > deadline:
            raise TimeoutError("no go file within 10 minutes")
        time.sleep(0.01)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < job["seconds"]:
        stepper.step()
        steps += 1
        if steps % 5 == 0:
            synchronize(d.device)
    synchronize(d.device)
    tokens_per_second = steps * stepper.tokens_per_step / (time.perf_counter() - start)
    Path(job["result"]).write_text(json.dumps({"tokens_per_second": tokens_per_second, "steps": steps}) + "\n")


def run_packed(k: int, job: dict, folder: Path, env: dict, timeout: float) -> float:
    """Aggregate tokens/s of `k` workers trained side by side (they start timing together): the sum of each one's."""
    import subprocess

    folder.mkdir(parents=True, exist_ok=True)
    go = folder / "go"
    procs, results = [], []
    for i in range(k):
        worker_job = {**job, "index": i, "go": str(go)}
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


def mfu(tokens_per_second: float, flops_per_token: float, peak: float | None) -> float:
    return tokens_per_second * flops_per_token / peak if peak else math.nan


# ---------------------------------------------------------------------------------------------------------------
# where a step's time goes


def step_breakdown(spec: ModelSpec, mode: str, d, data: TokenFile, steps: int) -> dict:
    """Milliseconds a step of each piece (the batch, forward + loss, backward, clip, optimizer), each drained
    apart, and under torch.profiler the share of a step's wall time the device spends in kernels, the ops with the
    most CPU time of their own and the kernels with the most device time: a step whose device is mostly idle is held
    back by the host; one whose device is busy, by its kernels."""
    stepper = Stepper(spec, mode, d, data)
    stepper.timed(3)
    pieces = {"batch": 0.0, "forward + loss": 0.0, "backward": 0.0, "clip": 0.0, "optimizer": 0.0}

    def timed(name, fn):
        synchronize(d.device)
        start = time.perf_counter()
        out = fn()
        synchronize(d.device)
        pieces[name] += time.perf_counter() - start
        return out

    for _ in range(steps):
        batch = timed("batch", lambda: stepper.data.batch(spec.batch, spec.seq, d.device))
        loss, _ = timed("forward + loss", lambda batch=batch: stepper.model.loss(*batch))
        timed("backward", loss.backward)
        timed("clip", lambda: torch.nn.utils.clip_grad_norm_(stepper.model.parameters(), 1.0))
        timed("optimizer", lambda: (stepper.optimizer.step(), stepper.optimizer.zero_grad(set_to_none=True)))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if d.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        wall = stepper.timed(steps)
    events = profile.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    kernels = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:8]
    return {
        "ms": {name: 1e3 * seconds / steps for name, seconds in pieces.items()},
        "step_ms": 1e3 * wall / steps,
        "device_busy": device_us / 1e6 / wall if d.device.type == "cuda" else math.nan,
        "top_cpu": [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in top],
        "top_device": [(e.key[:80], e.self_device_time_total / 1e3 / steps, e.count // steps) for e in kernels],
    }
