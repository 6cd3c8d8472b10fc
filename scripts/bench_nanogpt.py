"""ablate's real training step against a nanoGPT-style trainer of our own, both in one process, steps interleaved.

    python scripts/bench_nanogpt.py                     # a GPU: GPT-2 small, ~10M, ~350M; compiled, bf16; the targets
    python scripts/bench_nanogpt.py --device cpu        # nanoGPT's shape (d256, 6 layers, seq 512, 8 a step), eager
    python scripts/bench_nanogpt.py --shapes gpt2 --steps 32
    python scripts/bench_nanogpt.py --smoke             # toy shapes on CPU, seconds: every measurement runs

The reference is the plain loop nanoGPT's train.py runs, written here from its description: a GPT with learned
positions, pre-LayerNorm blocks, one fused QKV projection, causal SDPA, a 4x GELU MLP, the head tied to the
embedding, cross-entropy over the whole logits; the whole model and its loss compiled as one (torch.compile), AdamW
(0.9, 0.95, fused on CUDA) with weight decay on matrices only, gradient clipping at 1, bf16 by torch.autocast around
the forward; each batch random windows of the token file, pinned and copied without waiting.

ablate's side is its real step: the Trainer built as `ablate run` builds it (check_run, init_distributed, the
Trainer with its default callbacks, started as fit starts a run), then train_step(), on the nearest architecture
(GELU 4x MLP, LayerNorm, tied head; RoPE in place of learned positions, so the two models' FLOPs differ only by the
position embedding), compiled (train.compile=true, kernels "auto": what a compiled run does), reading the same token
file: the embedded corpus through ablate's BPE at the model's vocabulary.

Per shape, after warm-up steps (the compiles) on each side: blocks of steps alternate between the sides so that
whatever else the machine does slows both alike, and each side's step time is the median over its blocks. Printed:
ms a step, tokens/s, MFU (ablate's FLOPs per token for both; of the GPU's dense peak by name, else measured), and on
CUDA the peak memory each side adds (its resting state plus its step's transients, above what the process held
before: CUDA's cuBLAS workspaces, allocated first), the kernels one step launches (torch.profiler), and the host
syncs of each timed step (torch.cuda.set_sync_debug_mode("warn"), warnings counted), logging steps (train.log_every)
apart. Then the output projection + loss alone at GPT-2 small's shape: ablate.kernels.linear_cross_entropy with the
GPT-2 small run's model.loss_chunks against F.linear + F.cross_entropy.

Targets, judged on a GPU (on CPU and at toy sizes the same lines say INFO): ablate's tokens/s >= 1.0x the
reference's at GPT-2 small and ~10M; MFU >= 45% at GPT-2 small and >= 40% at ~350M (ablate alone: its target is
MFU, and a second compile of a 24-layer model would cost a lease a minute); no host sync on a non-logging step; head +
loss <= 1.0x the time of F.linear + F.cross_entropy and <= 25% of its peak memory. Verdict lines start with PASS,
FAIL or INFO (scripts/gpu_acceptance.py collects them); each comparison ends with a line `ratio tokens/s ablate /
nanoGPT-style, SHAPE DTYPE: X.XXx`. Exit 1 where a target fails, 2 where --device cuda finds no GPU.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_measure as measure  # noqa: E402

GiB = 2**30
# the targets (see the docstring); shapes not named here are measured without a target
RATIO_TARGETS = {"gpt2": 1.0, "10M": 1.0}  # ablate's tokens/s over the reference's, same process
MFU_TARGETS = {"gpt2": 0.45, "350M": 0.40}  # of the GPU's dense peak by its exact name
HEAD_LOSS_TIME, HEAD_LOSS_MEMORY = 1.0, 0.25  # ablate's head + loss over F.linear + F.cross_entropy's
VERDICTS: list[str] = []  # this run's, for its exit code


def verdict(ok: bool, judged: bool, check: str, figure: str) -> None:
    VERDICTS.append(measure.judge(ok, judged))
    measure.say(VERDICTS[-1], check, figure)


# ---------------------------------------------------------------------------------------------------------------
# the nanoGPT-style reference


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)  # with biases, as ablate's LayerNorm
        self.qkv, self.attn_out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.fc_out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        batch, seq, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, d)
        x = x + self.attn_out(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.token, self.position = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, inputs, targets):
        positions = torch.arange(inputs.shape[1], device=inputs.device)
        x = self.token(inputs) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.token.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class ReferenceTrainer:
    """nanoGPT's step: a batch, the forward under autocast (bf16) or not, backward, clip, AdamW, zero_grad. Its
    loss is never read while it trains (a read would wait for the device): nanoGPT reads it every log interval."""

    def __init__(self, spec: measure.ModelSpec, dtype: str, device: torch.device, tokens: np.ndarray, compile: bool):
        torch.manual_seed(0)
        self.spec, self.device, self.tokens, self.bf16 = spec, device, tokens, dtype == "bf16"
        with device:  # built where it trains: a GPT-2's init on the host would take seconds
            self.model = ReferenceGPT(spec.vocab, spec.d_model, spec.n_layers, spec.n_heads, spec.seq)
        self.forward = torch.compile(self.model) if compile else self.model
        matrices = [p for p in self.model.parameters() if p.dim() >= 2]
        vectors = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}]
        fused = device.type == "cuda"  # nanoGPT fuses AdamW where CUDA offers it
        self.optimizer = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=fused)
        self.rng = np.random.default_rng(0)
        self.tokens_per_step = spec.batch * spec.seq
        self.steps_taken, self.loss = 0, None

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self.spec.seq
        starts = self.rng.integers(0, len(self.tokens) - seq - 1, self.spec.batch)
        windows = torch.from_numpy(np.stack([np.asarray(self.tokens[s : s + seq + 1], dtype=np.int64) for s in starts]))
        if self.device.type == "cuda":  # pinned, so the copy runs while the host goes on
            windows = windows.pin_memory().to(self.device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]

    def step(self) -> None:
        inputs, targets = self.batch()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.forward(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss, self.steps_taken = loss.detach(), self.steps_taken + 1

    def logs_at(self, step: int) -> bool:
        return False  # nothing of its own around the step: every step is an ordinary one

    def final_loss(self) -> float:
        return self.loss.item()

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# one side's figures, and the interleaved measurement


@dataclass
class Side:
    name: str
    runner: object  # measure.RealStep or ReferenceTrainer: step(), logs_at(n), steps_taken, tokens_per_step
    warmup_seconds: float
    resting_bytes: int  # what it holds between steps (weights, optimizer state...), CUDA
    seconds: list[float] = field(default_factory=list)  # a step, per timed block
    transient_bytes: int = 0  # the most a step of it allocated above the resting state of both sides, CUDA
    syncs: dict[bool, list[int]] = field(default_factory=lambda: {False: [], True: []})  # logging step? -> per step
    kernels: int | None = None  # in one profiled non-logging step, CUDA

    @property
    def step_seconds(self) -> float:
        return statistics.median(self.seconds)


def warmed_side(name: str, make, warmup: int, device: torch.device) -> Side:
    """Build a side and take its warm-up steps (the compiles happen there): its warm-up time and resting memory."""
    measure.synchronize(device)
    before = measure.allocated(device)
    runner = make()
    start = time.perf_counter()
    for _ in range(warmup):
        runner.step()
    measure.synchronize(device)
    return Side(name, runner, time.perf_counter() - start, measure.allocated(device) - before)


def interleave(sides: list[Side], blocks: int, block: int, device: torch.device) -> None:
    """`blocks` rounds of `block` steps a side, the sides in turn; each step's host syncs counted (CUDA)."""
    for _ in range(blocks):
        for side in sides:
            measure.synchronize(device)
            before = measure.allocated(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            for _ in range(block):
                with measure.HostSyncs(device) as syncs:
                    side.runner.step()
                if syncs.count is not None:
                    side.syncs[side.runner.logs_at(side.runner.steps_taken)].append(syncs.count)
            measure.synchronize(device)
            side.seconds.append((time.perf_counter() - start) / block)
            side.transient_bytes = max(side.transient_bytes, measure.peak_memory(device) - before)


def count_kernels(side: Side, device: torch.device) -> None:
    """The kernels of one non-logging step under the profiler (a logging step first, untimed, if one is due)."""
    if side.runner.logs_at(side.runner.steps_taken + 1):
        side.runner.step()
    side.kernels = measure.kernels_launched(side.runner.step, device)


def warm_cublas(device: torch.device) -> int:
    """Allocate what every process holds once it has multiplied forward and backward (on Hopper, a 32 MiB cuBLAS
    workspace for the main thread and one for autograd's), so that neither side's memory counts it: the bytes."""
    if device.type != "cuda":
        return 0
    a = torch.randn(64, 64, device=device, requires_grad=True)
    (a @ a).sum().backward()
    del a
    measure.reset_memory(device)
    return measure.allocated(device)


# ---------------------------------------------------------------------------------------------------------------
# a shape: both sides built, warmed, measured, said


@dataclass
class Settings:
    device: torch.device
    compile: bool
    warmup: int
    blocks: int
    block: int
    judged: bool  # targets judged: a GPU, real sizes
    peaks: dict  # dtype -> (FLOP/s, how it was found)


def compare(key: str, dtype: str, with_reference: bool, s: Settings, d) -> dict:
    """One shape and dtype: ablate's real step (and the reference's); every figure said, the targets judged.
    Returns what later measurements need of it (the run's loss_chunks)."""
    spec = measure.SPECS[key]
    label = f"{spec.name} {dtype}"
    peak, peak_how = s.peaks[dtype]
    run = measure.run_config(
        spec, s.device, compile=s.compile, dtype=dtype, nanogpt=True, peak_flops=peak, name=f"{key}_{dtype}"
    )
    print(f"== {spec.describe()}, {dtype}, {'compiled' if s.compile else 'eager'}", flush=True)
    ablate = warmed_side("ablate", lambda: measure.RealStep(run, d), s.warmup, s.device)
    sides = [ablate]
    if with_reference:
        tokens = ablate.runner.trainer.data.train.tokens  # the same token file, read the nanoGPT way

        def reference():
            return ReferenceTrainer(spec, dtype, s.device, tokens, s.compile)

        sides.append(warmed_side("nanoGPT-style", reference, s.warmup, s.device))
    interleave(sides, s.blocks, s.block, s.device)
    for side in sides:
        count_kernels(side, s.device)
    flops = ablate.runner.flops_per_token  # the reference's differ only by its position embedding's lookup: none
    for side in sides:
        say_side(label, side, flops, peak, peak_how, s.device)
    judge_shape(key, label, sides, flops, peak, peak_how, s)
    kept = {"loss_chunks": getattr(ablate.runner.trainer.model, "loss_chunks", None)}
    for side in sides:
        side.runner.close()
    return kept


def say_side(label: str, side: Side, flops: float, peak: float, peak_how: str, device: torch.device) -> None:
    tokens_per_second = side.runner.tokens_per_step / side.step_seconds
    loss = side.runner.final_loss()  # read after the timed steps: a read waits for the device
    figures = [
        f"{1e3 * side.step_seconds:.1f} ms a step",
        f"{tokens_per_second:,.0f} tok/s",
        f"MFU {measure.percent(measure.mfu(tokens_per_second, flops, peak))} of {peak / 1e12:.3g} TFLOP/s ({peak_how})",
    ]
    if device.type == "cuda":
        non_logging, logging = side.syncs[False], side.syncs[True]
        figures += [
            f"peak memory {(side.resting_bytes + side.transient_bytes) / GiB:.2f} GiB "
            f"({side.resting_bytes / GiB:.2f} resting)",
            f"{side.kernels} kernels in one step",
            f"host syncs {sum(non_logging)} in {len(non_logging)} non-logging steps "
            f"({sum(logging)} in {len(logging)} logging steps)",
        ]
    else:
        figures.append("peak memory, kernels and host syncs: CUDA only, skipped on CPU")
    warm = f"{side.warmup_seconds:.1f} s of warm-up"
    measure.say("info", f"{label} {side.name}", f"{', '.join(figures)}; loss {loss:.3f}; {warm}")
    if not math.isfinite(loss):
        verdict(False, True, f"{label} {side.name}: a finite loss", f"{loss}")


def judge_shape(key: str, label: str, sides: list[Side], flops: float, peak: float, peak_how: str, s: Settings):
    """The shape's targets: tokens/s against the reference, MFU, host syncs on non-logging steps."""
    ablate = sides[0]
    ablate_tps = ablate.runner.tokens_per_step / ablate.step_seconds
    if len(sides) > 1:
        reference_tps = sides[1].runner.tokens_per_step / sides[1].step_seconds
        ratio, target = ablate_tps / reference_tps, RATIO_TARGETS.get(key)
        verdict(
            ratio >= (target or 0),
            s.judged and target is not None,
            f"{label}: ablate's tokens/s >= {target or 1.0:.1f}x the nanoGPT-style reference's, same process",
            f"{ratio:.2f}x ({ablate_tps:,.0f} vs {reference_tps:,.0f} tok/s)",
        )
    target = MFU_TARGETS.get(key)
    if target is not None:
        share = measure.mfu(ablate_tps, flops, peak)
        verdict(
            share >= target,
            s.judged and peak_how == "by name",
            f"{label}: ablate's MFU >= {target:.0%}",
            f"{measure.percent(share)} of {peak / 1e12:.3g} TFLOP/s ({peak_how})",
        )
    non_logging = ablate.syncs[False]
    figure = f"{sum(non_logging)} in {len(non_logging)} steps" if s.device.type == "cuda" else "CUDA only, skipped"
    verdict(sum(non_logging) == 0, s.judged, f"{label}: no host sync on a non-logging step", figure)
    if len(sides) > 1:
        print(f"ratio tokens/s ablate / nanoGPT-style, {label}: {ablate_tps / reference_tps:.2f}x", flush=True)


def head_loss(device: torch.device, smoke: bool, judged: bool, chunks: int | None) -> None:
    """The output projection + loss at GPT-2 small's shape (a toy one in the smoke), forward and backward."""
    gpt2 = measure.SPECS["gpt2"]
    rows, width, vocab = (64, 32, 512) if smoke else (gpt2.batch * gpt2.seq, gpt2.d_model, gpt2.vocab)
    r = measure.head_and_loss(device, rows, width, vocab, repeats=2 if smoke else 10, chunks=chunks)
    ours, theirs = r["ablate"], r["full_logits"]
    time_ratio = ours["seconds"] / theirs["seconds"]
    split = f"{r['chunks']} chunks (the GPT-2 small run's loss_chunks)" if r["chunks"] else "the kernel's own chunks"
    shape = f"{rows} tokens x d{width} -> vocab {vocab}, bf16, forward + backward, {split}"
    verdict(
        time_ratio <= HEAD_LOSS_TIME,
        judged,
        f"head + loss time, ablate.kernels.linear_cross_entropy vs F.linear + F.cross_entropy "
        f"(target <= {HEAD_LOSS_TIME:.1f}x)",
        f"{1e3 * ours['seconds']:.1f} ms vs {1e3 * theirs['seconds']:.1f} ms: {time_ratio:.2f}x ({shape})",
    )
    if device.type == "cuda":
        share = ours["memory_bytes"] / theirs["memory_bytes"] if theirs["memory_bytes"] else math.nan
        sizes = f"{ours['memory_bytes'] / GiB:.2f} GiB vs {theirs['memory_bytes'] / GiB:.2f} GiB"
        figure = f"{sizes}: {measure.percent(share)}"
    else:
        share, figure = math.nan, "CUDA only, skipped (scripts/bench_kernels.py measures it on CPU)"
    verdict(
        share <= HEAD_LOSS_MEMORY,
        judged,
        f"head + loss peak memory, vs full logits (target <= {HEAD_LOSS_MEMORY:.0%})",
        figure,
    )
    print(f"ratio time head + loss ablate / F.linear + F.cross_entropy: {time_ratio:.2f}x", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# the command


def peak_flops(device: torch.device, dtype: str, smoke: bool) -> tuple[float, str]:
    """The dense peak MFU is measured against: the GPU's by its exact name, else measured here."""
    from ablate.training.parallel import measure_peak_flops

    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    name, by_name = measure.named_peak(device, torch_dtype)
    if by_name:
        return by_name, "by name"
    sizes, seconds = ((256,), 0.05) if smoke else ((1024, 2048), 0.25)
    return measure_peak_flops(device, torch_dtype, sizes=sizes, seconds=seconds, rounds=2), f"measured on {name}"


def attempt(label: str, measurement, *args):
    """`measurement(*args)`, or None where it raised (an out-of-memory, a compile that fails): then it is a failed
    target, said with its error, and the measurements after it still run."""
    try:
        return measurement(*args)
    except Exception as error:
        traceback.print_exc()
        verdict(False, True, label, f"{type(error).__name__}: {error}"[:400])
        return None


def free(device: torch.device, compiled: bool) -> None:
    """Between shapes: the last sides' memory back, and a fresh compile cache (no recompile limit reached)."""
    if compiled:
        torch._dynamo.reset()
    measure.reset_memory(device)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA if visible")
    parser.add_argument("--shapes", help=f"of {', '.join(measure.SPECS)} (default: CUDA gpt2,10M,350M; CPU nanogpt)")
    parser.add_argument("--ablate-only", default="350M", help="shapes measured on ablate's side alone")
    parser.add_argument("--dtypes", help="comma-separated: fp32, bf16 (default: CUDA bf16; CPU fp32,bf16)")
    parser.add_argument("--compile", choices=("on", "off"), help="both sides (default: on on CUDA, off on CPU)")
    parser.add_argument("--steps", type=int, help="timed steps a side (default: CUDA 16, CPU 8)")
    parser.add_argument("--block", type=int, help="steps a side takes in a row (default: CUDA 4, CPU 1)")
    parser.add_argument("--warmup", type=int, help="untimed steps a side, the compiles among them (default 3; CPU 2)")
    parser.add_argument("--smoke", action="store_true", help="toy shapes on CPU, 2 steps a side: checks it all runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.device, args.shapes, args.dtypes, args.compile = "cpu", args.shapes or "smoke", "bf16", "off"
        args.steps, args.block, args.warmup = 2, 1, 1
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.device = "cuda" if cuda else "cpu"
    args.shapes = (args.shapes or ("gpt2,10M,350M" if cuda else "nanogpt")).split(",")
    args.dtypes = (args.dtypes or ("bf16" if cuda else "fp32,bf16")).split(",")
    args.compile = (args.compile or ("on" if cuda else "off")) == "on"
    args.block = args.block or (4 if cuda else 1)
    args.steps = max(args.steps or (16 if cuda else 8), args.block)
    args.warmup = args.warmup if args.warmup is not None else 3 if cuda else 2
    unknown = [key for key in args.shapes if key not in measure.SPECS]
    if unknown or not set(args.dtypes) <= {"fp32", "bf16"}:
        parser.error(f"--shapes {','.join(unknown)} / --dtypes: allowed {', '.join(measure.SPECS)} / fp32, bf16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_nanogpt.py --device cuda: no CUDA GPU is visible", file=sys.stderr)
        return 2
    measure.import_ablate_from_checkout()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    d = measure.device_setup(args.device)
    device = d.device
    name = measure.named_peak(device)[0]
    print(
        f"{name}; torch {torch.__version__}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    floor = warm_cublas(device)
    if floor:
        print(f"memory the process holds before either side (cuBLAS workspaces): {floor / 2**20:.0f} MiB", flush=True)
    settings = Settings(
        device=device,
        compile=args.compile,
        warmup=args.warmup,
        blocks=args.steps // args.block,
        block=args.block,
        judged=device.type == "cuda" and not args.smoke,
        peaks={dtype: peak_flops(device, dtype, args.smoke) for dtype in args.dtypes},
    )
    ablate_only = set(args.ablate_only.split(","))
    head_loss_after = "smoke" if args.smoke else "gpt2"  # its shape is GPT-2 small's; it takes that run's chunks
    for key in args.shapes:
        for dtype in args.dtypes:
            label = f"{measure.SPECS[key].name} {dtype}"
            kept = attempt(label, compare, key, dtype, key not in ablate_only, settings, d)
            free(device, args.compile)
        if key == head_loss_after:
            chunks = (kept or {}).get("loss_chunks")
            attempt("head + loss", head_loss, device, args.smoke, settings.judged, chunks)
    if head_loss_after not in args.shapes and device.type == "cuda":
        attempt("head + loss", head_loss, device, args.smoke, settings.judged, None)
    gc.collect()
    counts = {word: VERDICTS.count(word) for word in ("pass", "fail", "info")}
    print(f"targets: {counts['pass']} pass, {counts['fail']} fail ({counts['info']} figures not judged here)")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
