"""Every "auto" of a run decided in one place: the device, the compute dtype, the kernels, compile, and the eval
device. Training (training.trainer), `ablate plan`, `ablate eval` and sweeps all ask here, so what a plan shows is
what a run does.

    device    "auto": the GPU where CUDA is visible, else the CPU
    dtype     "auto": bf16 mixed precision on GPU, fp32 on CPU (fp32 runs on CPU are bit-exact across resumes)
    kernels   "auto": Triton on CUDA (where Triton is installed), the torch references elsewhere (ablate.kernels)
    compile   "auto": on CPU for bf16 runs long enough to repay a first compile (measured: 1.2-1.3x a step); on GPU
              when the compile's estimated time is under a tenth of the run's, and always with float8
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import ConfigError, RunConfig
from ablate.kernels import resolved as resolved_kernels


def device(choice: str) -> torch.device:
    """train.device (or `ablate eval --device`) as a torch device; ConfigError for 'cuda' where no GPU is visible
    (checked before any compute, where experiments load, by checks.check_this_machine)."""
    choice = device_type(choice)
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' but no CUDA device is visible here; allowed here: 'auto', 'cpu'")
    return torch.device(choice)


def device_type(choice: str) -> str:
    """train.device's type as device() resolves it, without requiring it here: 'cuda' stays 'cuda' where no GPU is
    visible (`ablate plan` plans a GPU run on a CPU machine)."""
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def uses_bf16(dtype: str, on: torch.device) -> bool:
    """train.dtype resolved: bf16 mixed precision (FSDP2 gathers bf16 copies of fp32 shards) or fp32 throughout."""
    return dtype == "bf16" or (dtype == "auto" and on.type == "cuda")


# CPU: "auto" compiles a bf16 run only when its model FLOPs need at least this long at the measured bf16 peak (at the
# ~15% MFU of an eager bf16 step here, ~3 minutes of training): compiled steps were 1.2-1.3x faster on the ~10M model
# of bench_train.py, but a first compile in a fresh cache took ~40 s, which a shorter run never earns back.
AUTO_COMPILE_SECONDS_AT_PEAK = 30.0
# GPU: a first compile of a model's blocks (one graph, reused by every block) is taken as this long, and an eager
# step as this share of the peak; compile is on when the compile costs under a tenth of the run.
GPU_COMPILE_SECONDS = 60.0
GPU_EAGER_MFU = 0.3
GPU_COMPILE_SHARE = 0.1


@dataclass(frozen=True)
class Choice:
    """An "auto" setting resolved (train.compile, train.cuda_graphs)."""

    on: bool
    why: str  # said once at the run's start when "auto" decided


def compile_blocks(
    setting: bool | str, on: torch.device, bf16: bool, seconds_at_peak: float, float8: bool = False
) -> Choice:
    """train.compile resolved. `seconds_at_peak`: the run's model FLOPs over the device's peak."""
    if setting != "auto":
        return Choice(bool(setting), "")
    if on.type == "cuda":
        if float8:
            return Choice(True, "compiled: float8 matmuls are slower than bf16 without compile")
        run_seconds = seconds_at_peak / GPU_EAGER_MFU
        if GPU_COMPILE_SECONDS < GPU_COMPILE_SHARE * run_seconds:
            return Choice(
                True,
                f"compiled: a first compile (~{GPU_COMPILE_SECONDS:.0f} s) is under "
                f"{GPU_COMPILE_SHARE:.0%} of the run (~{run_seconds:.0f} s eager)",
            )
        return Choice(False, f"eager: the run (~{run_seconds:.0f} s) is too short to repay a first compile")
    # fp32 on CPU stays eager: compile changes fp32 losses in their last digits, eager runs stay bit-identical
    return Choice(bf16 and seconds_at_peak >= AUTO_COMPILE_SECONDS_AT_PEAK, "")


@dataclass(frozen=True)
class RunChoices:
    device: torch.device
    bf16: bool
    kernels: str  # what runs: "triton" or "torch"
    compile: Choice
    inductor_blocks: bool = False  # compiled blocks with kernels="auto": RMSNorm, SwiGLU, RoPE fused by Inductor
    cuda_graphs: Choice = Choice(False, "")  # train.cuda_graphs resolved (training.graphs)

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32

    def describe(self) -> str:
        kernels = f"{self.kernels} kernels"
        if self.inductor_blocks:  # kernels.use_triton: "auto" under compile leaves the blocks to Inductor
            kernels = "Triton loss, Inductor-fused blocks"
        precision = "bf16" if self.bf16 else "fp32"
        return f"{self.device.type}, {precision}, {kernels}, {'compiled' if self.compile.on else 'eager'}"


def for_run(
    run: RunConfig,
    on: torch.device | None = None,
    seconds_at_peak: float | None = None,
    graphs_refusal: str | None = "not asked",
) -> RunChoices:
    """Every auto of `run` on device `on` (train.device resolved when None). `seconds_at_peak` (the run's FLOPs
    over the peak) decides compile "auto"; None: taken as long enough (plans, which know no peak yet).
    `graphs_refusal`: why this run's step cannot be captured (setup.checks.cuda_graphs_refusal), None if it can;
    the default keeps CUDA graphs off (plans)."""
    on = on or device(run.train.device)
    bf16 = uses_bf16(run.train.dtype, on)
    seconds = float("inf") if seconds_at_peak is None else seconds_at_peak
    compiled = compile_blocks(run.train.compile, on, bf16, seconds, run.train.float8)
    kernels = resolved_kernels(run.model.kernels, on.type)
    inductor = compiled.on and run.model.kernels == "auto" and kernels == "triton"
    graphs = cuda_graphs(run.train.cuda_graphs, on, graphs_refusal)
    return RunChoices(on, bf16, kernels, compiled, inductor, graphs)


# The GPUs (by the start of torch.cuda.get_device_name) on which a lease found a graphed step's losses bit for bit
# those of the same step un-graphed (scripts/gpu_acceptance.py, part cuda_graphs): train.cuda_graphs="auto" turns
# them on there only. None yet: no lease has run that part.
CUDA_GRAPHS_PROVEN_ON: tuple[str, ...] = ()


def cuda_graphs(setting: bool | str, on: torch.device, refusal: str | None) -> Choice:
    """train.cuda_graphs resolved; `refusal`: why the step cannot be captured, None if it can. True where it
    cannot is a ConfigError (setup.checks refuses it before any compute; this is the last guard)."""
    if setting is True:
        if refusal is not None:
            raise ConfigError(f"train.cuda_graphs=True: {refusal}; allowed here: False or 'auto'")
        return Choice(True, "")
    if setting is False or on.type != "cuda":
        return Choice(False, "")  # "auto" on a CPU: nothing to say
    if refusal is not None:
        return Choice(False, f"off: {refusal}")
    name = torch.cuda.get_device_name(on)
    if not name.startswith(CUDA_GRAPHS_PROVEN_ON) or not CUDA_GRAPHS_PROVEN_ON:
        return Choice(False, f"off: not yet proven bit for bit on {name} (scripts/gpu_acceptance.py measures it)")
    return Choice(True, f"on: a graphed step's losses were found bit for bit the eager step's on {name}")


def eval_device(choice: str) -> torch.device:
    """`ablate eval --device`: "auto" scores on the GPU where one is visible (same as training)."""
    try:
        return device(choice)
    except ConfigError:
        raise ConfigError("--device: 'cuda' but no CUDA device is visible here; allowed here: 'auto', 'cpu'") from None
