"""Benchmark the fused kernels (ablate.kernels).

On a GPU: time and peak memory of each kernel's forward+backward, Triton against the torch reference in eager
mode and under torch.compile (and, for the loss, against plain full-logits cross-entropy), then the peak memory of
the Triton loss against full logits as a ratio.
On CPU: the peak memory of the chunked linear + cross-entropy against full logits + cross-entropy, at vocab 50k
and 8 x 1024 tokens, printed as a ratio (the target is <= 0.25). Each CPU measurement runs in a fresh process, and
its peak is the peak resident memory above what the process held before the forward pass.

    python scripts/bench_kernels.py                 # GPU table if CUDA is visible, else the CPU memory ratio
    python scripts/bench_kernels.py --cpu-memory    # the CPU memory ratio, even on a GPU machine
    python scripts/bench_kernels.py --smoke         # the CPU memory ratio at 2048 tokens x 64 -> vocab 8192, on any
                                                    # machine: checks the script runs (the GPU table is not run)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

TOKENS, WIDTH, VOCAB = 8 * 1024, 768, 50257  # GPT-2 small's width and vocabulary
SMOKE_SHAPE = 2048, 64, 8192  # (tokens, width, vocab): full logits of 64 MiB, well above malloc's noise


# ---------------------------------------------------------------------------------------------------------------
# CPU: peak memory of the loss, chunked against full logits


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read())[1])


def _measure_loss_memory(kind: str, shape: tuple[int, int, int]) -> None:
    """(child process) Print the peak resident bytes that forward+backward of the loss adds."""
    from ablate.kernels import reference

    tokens, width, vocab = shape
    torch.manual_seed(0)
    hidden = torch.randn(tokens, width).requires_grad_()
    weight = torch.empty(vocab, width).normal_(0, 0.02).requires_grad_()  # in place: no temporary copy
    targets = torch.randint(0, vocab, (tokens,))
    small = slice(0, 8)  # warm up the code paths on a few rows, so their one-off allocations are in the baseline
    reference.linear_cross_entropy(hidden[small], weight, targets[small])[0].backward()
    hidden.grad = weight.grad = None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    before = _status_kib("VmRSS")
    if kind == "naive":
        loss = F.cross_entropy(hidden @ weight.T, targets)
    else:
        loss, _ = reference.linear_cross_entropy(hidden, weight, targets)
    loss.backward()
    print((_status_kib("VmHWM") - before) * 1024)


def cpu_memory_ratio(smoke: bool) -> None:
    shape = SMOKE_SHAPE if smoke else (TOKENS, WIDTH, VOCAB)
    peaks = {}
    for kind in ("naive", "chunked"):
        cmd = [sys.executable, __file__, "--child", kind, *(["--smoke"] if smoke else [])]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        peaks[kind] = int(out.stdout.split()[-1])
        print(
            f"{kind:8} linear+cross-entropy forward+backward, {shape[0]} tokens x {shape[1]} -> vocab {shape[2]}: "
            f"peak +{peaks[kind] / 2**20:.0f} MiB"
        )
    ratio = peaks["chunked"] / max(peaks["naive"], 1)
    print(
        f"ratio peak memory chunked/naive: {ratio:.3f}x (target <= 0.25) "
        f"[{peaks['chunked'] / 2**20:.0f} MiB vs {peaks['naive'] / 2**20:.0f} MiB]"
    )


# ---------------------------------------------------------------------------------------------------------------
# GPU: time and peak memory of each kernel against torch eager and torch.compile


def _gpu_cases(device, dtype):
    """(name, {implementation: fn}, input factory) per kernel, at the shapes of a ~125M-parameter model."""
    from ablate import kernels
    from ablate.kernels import reference
    from ablate.model import rope_tables

    batch, seq, heads, head_dim, ffn = 8, 1024, 12, 64, 2048

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, device=device) * scale).to(dtype).requires_grad_()

    cos, sin = (t.to(device) for t in rope_tables(head_dim, head_dim, seq, 10000.0))
    targets = torch.randint(0, VOCAB, (batch * seq,), device=device)

    def naive_loss(h, w):
        return F.cross_entropy((h @ w.T).float(), targets)

    # the chunks a run's loss takes on this device (kernels.loss_chunks, as the trainer asks it)
    free = torch.cuda.mem_get_info(device)[0]
    chunks = kernels.loss_chunks(batch * seq, WIDTH, VOCAB, "cuda", free, logit_bytes=torch.finfo(dtype).bits // 8)

    return [
        (
            "rms_norm",
            {
                "torch": lambda x, w: reference.rms_norm(x, w, 1e-5),
                "triton": lambda x, w: kernels.rms_norm(x, w, 1e-5, kernels="triton"),
            },
            lambda: (leaf(batch * seq, WIDTH), leaf(WIDTH)),
        ),
        (
            "swiglu",
            {"torch": reference.swiglu, "triton": lambda g, u: kernels.swiglu(g, u, kernels="triton")},
            lambda: (leaf(batch * seq, ffn), leaf(batch * seq, ffn)),
        ),
        (
            "rope",
            {
                "torch": lambda q: reference.apply_rope(q, cos, sin),
                "triton": lambda q: kernels.apply_rope(q, cos, sin, kernels="triton"),
            },
            lambda: (leaf(batch, seq, heads, head_dim).transpose(1, 2),),
        ),
        (
            "linear_cross_entropy",
            {
                "torch full logits": naive_loss,
                "torch": lambda h, w: reference.linear_cross_entropy(h, w, targets, chunks=chunks)[0],
                "triton": lambda h, w: kernels.linear_cross_entropy(h, w, targets, kernels="triton", chunks=chunks)[0],
            },
            lambda: (leaf(batch * seq, WIDTH), leaf(VOCAB, WIDTH, scale=0.02)),
        ),
    ]


def _time_and_memory(fn, make_inputs):
    from triton.testing import do_bench

    inputs = make_inputs()
    leaves = [x if x.is_leaf else x._base for x in inputs]

    def step():
        out = fn(*inputs)
        out.backward(torch.ones_like(out))

    step()  # compile / autotune outside the measurements
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    ms = do_bench(step, grad_to_none=leaves)
    return ms, peak


def gpu_table() -> None:
    device, dtype = torch.device("cuda"), torch.bfloat16
    print(f"{torch.cuda.get_device_name(device)}, bf16, forward+backward")
    print(f"{'kernel':22} {'implementation':22} {'ms':>8} {'peak MiB':>9}")
    loss_peaks = {}
    for name, impls, make_inputs in _gpu_cases(device, dtype):
        impls = {**impls, **{f"{k} + compile": torch.compile(f) for k, f in impls.items() if k != "triton"}}
        for impl, fn in impls.items():
            ms, peak = _time_and_memory(fn, make_inputs)
            print(f"{name:22} {impl:22} {ms:8.3f} {peak / 2**20:9.1f}", flush=True)
            if name == "linear_cross_entropy":
                loss_peaks[impl] = peak
    ratio = loss_peaks["triton"] / max(loss_peaks["torch full logits"], 1)
    print(f"ratio peak memory linear_cross_entropy triton/torch full logits: {ratio:.3f}x (target <= 0.25)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-memory", action="store_true", help="the CPU memory ratio, even with a GPU")
    parser.add_argument("--smoke", action="store_true", help="the CPU memory ratio at small shapes, on any machine")
    parser.add_argument("--child", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _measure_loss_memory(args.child, SMOKE_SHAPE if args.smoke else (TOKENS, WIDTH, VOCAB))
    elif torch.cuda.is_available() and not (args.cpu_memory or args.smoke):
        gpu_table()
    else:
        cpu_memory_ratio(args.smoke)


if __name__ == "__main__":
    main()
