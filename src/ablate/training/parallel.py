"""Parallelism applied from outside the model: process group, device mesh, FSDP2, seeds, compile.

World size 1 (one GPU, one CPU process): no process group, a plain module, bf16 by autocast over its fp32
parameters, the model with its loss compiled as one graph (`single_device`). World size N (torchrun): gloo on CPU or
NCCL on GPUs, fully_shard per block and root, per-block compile (`parallelize`; torchtitan also shards only above one
data-parallel rank). Both write one checkpoint format (DCP, by parameter name), so a run moves between them.
"""

from __future__ import annotations

import datetime
import functools
import gc
import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from ablate import rundir
from ablate.config import ConfigError
from ablate.rundir import write_json_atomic
from ablate.setup.checks import check_float8, resolve_device  # noqa: F401  (also imported from here)


@dataclass
class Dist:
    """This process's place in the run. At world size 1 there is no process group (`mesh` None) and every
    collective below is the identity: nothing is launched, nothing waits."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def mean(self, value: float) -> float:
        """Average a Python float over ranks."""
        if self.world == 1:
            return value
        return self.sum_tensor(torch.tensor(value, dtype=torch.float64, device=self.device)).item() / self.world

    def sum_tensor(self, value: torch.Tensor) -> torch.Tensor:
        """A tensor summed over ranks, on the device (no host read); `value` itself at world size 1."""
        if self.world == 1:
            return value
        value = value.clone()
        dist.all_reduce(value)
        return value

    def broadcast_object(self, obj):
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_objects(self, value) -> list:
        """Every rank's `value`, in rank order, on every rank."""
        if self.world == 1:
            return [value]
        gathered = [None] * self.world
        dist.all_gather_object(gathered, value)
        return gathered

    def first_of(self, value):
        """The lowest rank's non-None `value` (an error, say), the same on every rank: lets ranks agree before a
        collective that one of them would otherwise skip."""
        return next((v for v in self.gather_objects(value) if v is not None), None)


def init_distributed(device_choice: str = "auto") -> Dist:
    """Join the torchrun group if launched by torchrun (or use the group this process already has); a process on
    its own gets no group at all (world size 1: nothing to agree with, and no NCCL start-up). Idempotent. On CUDA
    the process's GPU is set before the group exists (NCCL binds to it: `device_id`)."""
    device = resolve_device(device_choice)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device.type == "cuda":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        torchrun = "TORCHELASTIC_RUN_ID" in os.environ
        device = torch.device("cuda", local_gpu_index(local_rank, local_world, torch.cuda.device_count(), torchrun))
        torch.cuda.set_device(device)
        apply_gpu_memory_share(device)
    if not dist.is_initialized() and "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        backend = "nccl" if device.type == "cuda" else "gloo"
        bound = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30), **bound)
    if not dist.is_initialized():
        return Dist(rank=0, world=1, local_rank=local_rank, device=device, mesh=None)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",)) if world > 1 else None
    return Dist(rank=rank, world=world, local_rank=local_rank, device=device, mesh=mesh)


def apply_gpu_memory_share(device: torch.device) -> None:
    """Cap this process's CUDA allocator on its GPU at its share (rundir.GPU_SHARE_ENV), so K runs that each fit their
    1/K cannot together run the GPU out of memory."""
    fraction = os.environ.get(rundir.GPU_SHARE_ENV)
    if fraction:
        torch.cuda.set_per_process_memory_fraction(float(fraction), device)


def local_gpu_index(local_rank: int, local_world: int, visible: int, torchrun: bool) -> int:
    """The GPU a process takes among the `visible` ones: its local rank where the node's GPUs are all visible, the
    only one where the launcher shows each process its own (SLURM's per-task GPU binding; torchrun never does).
    ConfigError where processes would share a GPU (torchrun with more processes per node than GPUs)."""
    if local_world <= visible:
        return local_rank
    if visible == 1 and not torchrun:  # one GPU per process, bound by the launcher
        return 0
    raise ConfigError(
        f"train.device: {local_world} processes on this node but {visible} GPU(s) visible to each; start at "
        f"most {visible} processes per node (torchrun --nproc_per_node), or use train.device=cpu"
    )


def free_memory(device: torch.device) -> None:
    """After a run, before the next in the same process (slot workers, one run after another): FSDP2's registered
    methods and states hold their modules in reference cycles, so the finished run's model and optimizer go only
    with a full garbage collection; then the GPU's cached blocks go back to the device."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch. Callers pass seed + rank where ranks must draw differently (dropout)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """The linears that get float8 matmuls: those inside blocks whose both dims are multiples of 16 (what float8
    kernels need). The output projection never does: the chunked loss uses its weight directly."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_float8(model: nn.Module) -> None:
    """Swap the blocks' linears for torchao's float8 training linears (dynamic scaling), in place."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model.layers, module_filter_fn=float8_filter)


# The model's entry points: what a training step, validation, the stability monitors and the eval engine call.
ENTRY_POINTS = ("forward", "loss", "per_token_loss", "stability_stats")


def parallelize(
    model: nn.Module,
    d: Dist,
    param_dtype: torch.dtype | None,
    compile_model: bool,
    float8: bool = False,
) -> nn.Module:
    """The model made ready for `d`'s world size: `single_device` at world size 1, `shard` above. `param_dtype`
    bf16 asks for bf16 compute (None: fp32 throughout)."""
    if float8:
        check_float8(d.device)
        apply_float8(model)
    if d.world == 1:
        return single_device(model, d.device, param_dtype, compile_model)
    return shard(model, d, param_dtype, compile_model)


def single_device(
    model: nn.Module, device: torch.device, compute_dtype: torch.dtype | None, compile_model: bool
) -> nn.Module:
    """World size 1: the model stays a plain module (no hooks, no DTensor, no gathers: a step launches only its
    own kernels). bf16 by autocast around each entry point, over the fp32 parameters the optimizer updates: matmuls
    in bf16, the residual stream, norms and loss in fp32. Compiled, the training loss (model and loss) is one graph
    (`fullgraph=True`: a graph break is an error, not a slow run). Its shapes never change at world size 1: every
    pass is train.micro_batch sequences (batches, a ramp's included, are whole micro-batches), so it compiles once;
    the learning rate lives in the optimizer, outside it."""
    if compute_dtype is not None:
        for name in ENTRY_POINTS:
            setattr(model, name, under_autocast(getattr(model, name), device.type, compute_dtype))
    if compile_model:
        model.loss = torch.compile(model.loss, fullgraph=True)
    return model


def under_autocast(method, device_type: str, dtype: torch.dtype):
    """`method` run under torch.autocast(device_type, dtype)."""

    @functools.wraps(method)
    def call(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype):
            return method(*args, **kwargs)

    return call


def shard(model: nn.Module, d: Dist, param_dtype: torch.dtype | None, compile_model: bool) -> nn.Module:
    """World size N: fully_shard each transformer block, then the root (embedding, final norm, output projection).
    FSDP2 gathers a module's parameters before its `forward` only: the model's other entry points (and the block
    method stability_stats calls) are registered to get the same gathers.

    Mixed precision is FSDP2's policy on every device: with param_dtype=bf16 the parameters stay fp32 shards (what
    the optimizer updates), each forward and backward gathers a bf16 copy, and gradients are reduced in fp32.
    None: fp32 throughout.
    """
    policy = (
        MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        if param_dtype
        else MixedPrecisionPolicy()
    )
    # A block's inputs stay as they come: its hidden states are already bf16 (the embedding's output), and the RoPE
    # tables must stay fp32 (cast_forward_inputs would round them to bf16 on the way in)
    block_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    for i, block in enumerate(model.layers):
        if compile_model:
            block = torch.compile(block)
            model.layers[i] = block
        # The last block's parameters are needed again at once by backward: keep them gathered.
        fully_shard(block, mesh=d.mesh, mp_policy=block_policy, reshard_after_forward=i < len(model.layers) - 1)
        register_fsdp_forward_method(block, "forward_with_logit_max")  # a compiled block passes it to the original
    fully_shard(model, mesh=d.mesh, mp_policy=policy)
    for method in ENTRY_POINTS[1:]:
        register_fsdp_forward_method(model, method)

    # FSDP2 keeps the root and the last block gathered after a forward, for the backward that follows. No backward
    # follows a no-grad entry point, and an optimizer step before the next forward (a before_update callback's
    # stability_stats, say) would update the shards only: that forward would run on the stale gathered copies.
    def then_reshard(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            finally:
                for module in model.modules():
                    if isinstance(module, FSDPModule):
                        module.reshard()

        return call

    for method in ("per_token_loss", "stability_stats"):
        setattr(model, method, then_reshard(getattr(model, method)))
    return model


def measure_peak_flops(
    device: torch.device,
    dtype: torch.dtype,
    sizes: tuple[int, ...] = (1024, 2048),
    seconds: float = 0.25,
    rounds: int = 3,
) -> float:
    """The best square-matmul throughput seen on `device` for `dtype` (FLOP/s): `rounds` rounds over a few sizes
    for `seconds` each, so that one busy moment does not set the peak that MFU is measured against (training logs
    and scripts/bench_train.py use the same). A size whose one matmul already takes longer than `seconds` is timed
    that once and then dropped with every larger size: bf16 on a CPU without bf16 units runs ~100x slower than
    fp32, and a fixed count of 2048^3 matmuls there took minutes before a run's first step."""
    import time

    def one_matmul_seconds(a: torch.Tensor, b: torch.Tensor) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    best, usable = 0.0, sorted(sizes)
    for _round in range(rounds):
        for size in list(usable):
            a = torch.randn(size, size, device=device).to(dtype)
            b = torch.randn(size, size, device=device).to(dtype)
            deadline = time.perf_counter() + seconds
            while True:
                took = one_matmul_seconds(a, b)
                best = max(best, 2 * size**3 / took)
                if took > seconds:  # too slow to repeat: this size and the larger ones are left out from here on
                    usable = [kept for kept in usable if kept < size]
                    break
                if time.perf_counter() >= deadline:
                    break
            if size not in usable:
                break
    return best


# Dense tensor-core peaks (FLOP/s) per device name exactly as torch.cuda.get_device_name gives it: bf16, and TF32
# (what fp32 matmuls run at: fp32 runs on a GPU allow TF32, see `enable_tf32`). From the vendors' datasheets, without
# sparsity. A name not listed is measured (a large matmul), as on CPU; train.peak_flops overrides either.
GPU_PEAKS = {
    # name: (bf16, tf32)
    "NVIDIA H100 80GB HBM3": (989e12, 495e12),  # SXM
    "NVIDIA H100 PCIe": (756e12, 378e12),
    "NVIDIA H100 NVL": (835e12, 418e12),
    "NVIDIA H200": (989e12, 495e12),
    "NVIDIA H200 NVL": (835e12, 418e12),
    "NVIDIA GH200 480GB": (989e12, 495e12),
    "NVIDIA B200": (2250e12, 1100e12),
    "NVIDIA A100-SXM4-80GB": (312e12, 156e12),
    "NVIDIA A100-SXM4-40GB": (312e12, 156e12),
    "NVIDIA A100 80GB PCIe": (312e12, 156e12),
    "NVIDIA A100-PCIE-40GB": (312e12, 156e12),
    "NVIDIA L40S": (362e12, 183e12),
    "NVIDIA L40": (181e12, 90.5e12),
    "NVIDIA L4": (121e12, 60e12),
    "NVIDIA A10": (125e12, 62.5e12),
    "NVIDIA GeForce RTX 4090": (165e12, 82.6e12),
}
PEAK_CACHE = "peak_flops.json"


def gpu_peak_flops(name: str, dtype: torch.dtype) -> float | None:
    """The datasheet's dense peak of the GPU named exactly `name` for a run computing in `dtype` (bf16; fp32 runs
    at TF32), or None for a name not in GPU_PEAKS."""
    peaks = GPU_PEAKS.get(name)
    if peaks is None:
        return None
    return peaks[0] if dtype == torch.bfloat16 else peaks[1]


def enable_tf32(device: torch.device) -> None:
    """fp32 runs on a GPU multiply in TF32 (10-bit mantissa inputs, fp32 sums): 2x and more over fp32 cores, as
    torchtitan and nanoGPT do. Never on CPU, where fp32 runs stay bit-exact."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def peak_flops_for(device: torch.device, dtype: torch.dtype) -> float:
    """A known GPU's peak, else the best measurement this machine has ever made (measured now, and remembered)."""
    if device.type == "cuda":
        known = gpu_peak_flops(torch.cuda.get_device_name(device), dtype)
        if known is not None:
            return known
    key = machine_key(device, dtype)
    kept = _kept_peaks().get(key)
    if isinstance(kept, (int, float)) and math.isfinite(kept) and kept > 0:
        return float(kept)  # measured here before: a run starts ~3 s sooner (bench_train.py measures again)
    return remember_peak(key, measure_peak_flops(device, dtype))


def peak_flops_source(device: torch.device, dtype: torch.dtype) -> str:
    """Where peak_flops_for's figure comes from: "datasheet" (a GPU in GPU_PEAKS) or "measured" (a large matmul on
    this machine, the best ever seen here: a rough peak, and a shared CPU's speed swings, so MFU against it is
    recorded but not printed)."""
    if device.type == "cuda" and gpu_peak_flops(torch.cuda.get_device_name(device), dtype) is not None:
        return "datasheet"
    return "measured"


def device_name(device: torch.device) -> str:
    """The chip a run ran on, as summary.json names it: the GPU's name, or the processor's."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def machine_key(device: torch.device, dtype: torch.dtype) -> str:
    """What a measured peak is valid for: this host, its processor, torch's thread count, the dtype."""
    import socket

    key = f"{socket.gethostname()}|{device_name(device)}|threads={torch.get_num_threads()}|{dtype}"
    return key.replace("torch.", "")


def _peak_cache_path() -> Path:
    return Path(os.path.expanduser(os.environ.get("ABLATE_CACHE") or "~/.cache/ablate")) / PEAK_CACHE


def _kept_peaks() -> dict:
    try:
        known = json.loads(_peak_cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def remember_peak(key: str, measured: float) -> float:
    """max(measured, the best kept for `key`), kept in $ABLATE_CACHE/peak_flops.json. A peak measured while the
    machine was busy is too low and would show MFU above 100%: the best value ever seen is the honest one. The
    file only ever goes up, and is replaced atomically (two runs racing at worst lose one update)."""
    path = _peak_cache_path()
    known = _kept_peaks()
    best = known.get(key)
    if isinstance(best, (int, float)) and math.isfinite(best) and best >= measured:
        return float(best)
    known[key] = measured
    try:
        write_json_atomic(path, known)
    except OSError:  # a read-only cache costs the memory of the best peak, not the run
        pass
    return measured


def mfu(tokens_per_second_per_device: float, flops_per_token: float, peak: float) -> float | None:
    """Model FLOPs utilisation, or None when it comes out above 1 (or not finite): then the peak was measured too
    low (a busy machine) and the figure would mislead."""
    value = tokens_per_second_per_device * flops_per_token / peak
    return value if 0 <= value <= 1 else None
