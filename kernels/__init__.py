"""Fused kernels for the model, and the one place that picks an implementation (installed as `ablate.kernels`).

rms_norm, swiglu, apply_rope and linear_cross_entropy take `kernels="auto" | "torch" | "triton"` (the model.kernels
switch; resolved decides, the one place that does). "triton" runs the Triton kernel when the tensor is on CUDA, or
on any device when TRITON_INTERPRET=1 (Triton's CPU interpreter, which the tests use); "auto" runs it on CUDA where
Triton is installed; otherwise the plain-torch reference of the same signature runs (reference.py). Triton is
imported only when a Triton kernel is about to run, so CPU users need not have it. Each Triton kernel is launched
from a torch.library.triton_op, so torch.compile traces the launch itself into its graph (no opaque op).

loss_chunks picks how many chunks the loss cuts its rows into on a device (a handful on a GPU); the default, None,
is the CPU's rule (reference.default_chunk_rows).

    reference.py              the references: the semantics, and what runs off CUDA
    rmsnorm_triton.py         RMSNorm forward/backward (weight gradient included)
    swiglu_triton.py          silu(gate) * up forward/backward
    rope_triton.py            rotary embedding of queries/keys forward/backward
    cross_entropy_triton.py   chunked linear + cross-entropy with z-loss and ignore-index
    launch.py                 traced: how a triton_op's body launches its kernel (wrap_triton)
    aot.py                    ahead-of-time builds of every kernel for sm_80/sm_90 (the CPU build check)
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch

from ablate.kernels import reference

KERNELS = ("auto", "torch", "triton")


def _interpreter_takes_scalar_bounds() -> None:
    """Under TRITON_INTERPRET=1, a kernel's scalar arguments are 1-element arrays, and a loop bounded by one calls
    int() on it: numpy 2 refuses that, so triton 3.6's interpreter (the GPU machines' version) fails every such loop.
    triton 3.7+ squeezes the array first; the same squeeze here, for the older ones."""
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "squeezes_scalars", False):
        return

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.squeezes_scalars = True
    interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None:
    _interpreter_takes_scalar_bounds()


_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # asked once: dynamo (torch 2.11) cannot trace it


def triton_installed() -> bool:
    return _TRITON_INSTALLED


def resolved(kernels: str, device_type: str) -> str:
    """What model.kernels runs on a device type, "triton" or "torch": the one place that decides (the kernels
    below, plans and run logs ask here)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels: got {kernels!r}; allowed: {', '.join(map(repr, KERNELS))}")
    if kernels == "triton":
        return "triton" if device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1" else "torch"
    return "triton" if kernels == "auto" and device_type == "cuda" and triton_installed() else "torch"


def use_triton(kernels: str, x: torch.Tensor) -> bool:
    """Whether an elementwise op (RMSNorm, SwiGLU, RoPE) runs its Triton kernel: "auto" inside torch.compile leaves
    them to Inductor, which fuses them with their neighbours (the loss keeps its Triton kernel there)."""
    if kernels == "auto" and torch.compiler.is_compiling():
        return False
    return resolved(kernels, x.device.type) == "triton"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kernels: str = "torch") -> torch.Tensor:
    if use_triton(kernels, x):
        from ablate.kernels import rmsnorm_triton

        return rmsnorm_triton.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor, kernels: str = "torch") -> torch.Tensor:
    if use_triton(kernels, gate):
        from ablate.kernels import swiglu_triton

        return swiglu_triton.swiglu(gate, up)
    return reference.swiglu(gate, up)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernels: str = "torch") -> torch.Tensor:
    if use_triton(kernels, x):
        from ablate.kernels import rope_triton

        return rope_triton.apply_rope(x, cos, sin)
    return reference.apply_rope(x, cos, sin)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    chunk_rows: int | None = None,
    kernels: str = "torch",
    chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy + z_loss * mean(logsumexp^2), mean cross-entropy detached) of hidden @ weight.T against
    targets, computed a chunk of rows at a time so the full logits are never held: `chunks` chunks of nearly equal
    rows if given (loss_chunks), else chunks of chunk_rows rows (None: reference.default_chunk_rows)."""
    # resolved, not use_triton: under torch.compile the loss keeps its Triton kernel with "auto" too
    if resolved(kernels, hidden.device.type) == "triton":
        from ablate.kernels import cross_entropy_triton

        return cross_entropy_triton.linear_cross_entropy(
            hidden, weight, targets, ignore_index, z_loss, chunk_rows, chunks
        )
    return reference.linear_cross_entropy(hidden, weight, targets, ignore_index, z_loss, chunk_rows, chunks=chunks)


# The GPU chunk policy (loss_chunks). A chunk's loss step holds rows x vocab logits and, in the torch reference's
# step, two fp32 temporaries of that size (the upcast and the softmax; the Triton step works in place, so it is
# over-provisioned by them, never short).
LOSS_STEP_FP32_BYTES = 8
MIN_GPU_CHUNKS = 4  # a chunk holds at most 1/4 of the whole loss step's (rows x vocab) working set
FREE_MEMORY_SHARE = 1 / 16  # ... and at most this share of the free memory, beside the step's activations
# Below this the whole working set is one chunk: chunking it would save less than a fraction of a percent of a GPU's
# memory and cost a dozen kernel launches per extra chunk (tiny models are launch-bound already).
ONE_CHUNK_BYTES = 256 * 2**20


def loss_chunks(
    rows: int,
    width: int,
    vocab: int,
    device_type: str,
    free_bytes: int,
    logit_bytes: int = 2,
    compiled: bool = False,
    members: int = 1,
) -> int | None:
    """How many chunks the loss cuts `rows` rows of width `width` into, for a vocabulary of `vocab`, on a device of
    `device_type` with `free_bytes` free (logits of `logit_bytes` bytes an element: bf16's 2). None on an eager CPU:
    the CPU rule (chunks of reference.default_chunk_rows rows, sized for the caches), bit for bit as before. A
    compiled loss on CPU takes the count below too: Inductor fuses a chunk's passes into a few loops of its own, and
    each chunk unrolled into the graph costs compile time.

    On CUDA, with W = rows x vocab x (logit_bytes + LOSS_STEP_FP32_BYTES) the whole loss step's working set:
    1 chunk if W <= ONE_CHUNK_BYTES (256 MiB), else at least MIN_GPU_CHUNKS (4: a chunk holds <= 25% of W); more
    while a chunk's share of W exceeds FREE_MEMORY_SHARE (1/16) of the free memory; never more chunks than the CPU
    rule cuts (chunks of >= 256 rows: thinner matmuls waste more time than they save). GPT-2 small's step (16 x 1024
    rows, vocab 50304, bf16: W = 7.7 GiB) gets 4 chunks with 80 GiB free, where the CPU rule gives 64.

    `members`: a stack's (training.stack), whose loss runs every member's chunk at once (batched over the members):
    the free-memory rule then takes members x W, while the fewest chunks and the cap stay a lone run's (a small
    model's stack keeps its one chunk, one pass of launches, where memory allows it; each member's matmul is as
    thin as a lone run's)."""
    if device_type != "cuda" and not compiled:
        return None
    member_working_set = rows * vocab * (logit_bytes + LOSS_STEP_FP32_BYTES)
    working_set = members * member_working_set
    fewest = 1 if member_working_set <= ONE_CHUNK_BYTES else MIN_GPU_CHUNKS
    for_memory = math.ceil(working_set / max(1.0, free_bytes * FREE_MEMORY_SHARE))
    most = math.ceil(rows / reference.default_chunk_rows(rows, width, vocab))
    return max(1, min(max(fewest, for_memory), most))


# Validation's per-position losses: no backward, so the torch chunk loop (a matmul, a logsumexp and a few row ops per
# chunk, the chunk whole off CPU) serves every device.
per_token_cross_entropy = reference.per_token_cross_entropy
