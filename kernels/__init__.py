"""Fused kernels for the model, and the one place that picks an implementation (installed as `ablate.kernels`).

rms_norm, swiglu, apply_rope and linear_cross_entropy take `kernels="auto" | "torch" | "triton"` (the model.kernels
switch; use_triton decides, the one place that does). "triton" runs the Triton kernel when the tensor is on CUDA, or
on any device when TRITON_INTERPRET=1 (Triton's CPU interpreter, which the tests use); "auto" runs it on CUDA where
Triton is installed; otherwise the plain-torch reference of the same signature runs (reference.py). Triton is
imported only when a Triton kernel is about to run, so CPU users need not have it.

    reference.py              the references: the semantics, and what runs off CUDA
    rmsnorm_triton.py         RMSNorm forward/backward (weight gradient included)
    swiglu_triton.py          silu(gate) * up forward/backward
    rope_triton.py            rotary embedding of queries/keys forward/backward
    cross_entropy_triton.py   chunked linear + cross-entropy with z-loss and ignore-index
    aot.py                    ahead-of-time builds of every kernel for sm_80/sm_90 (the CPU build check)
"""

from __future__ import annotations

import functools
import importlib.util
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


@functools.cache
def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolved(kernels: str, device_type: str) -> str:
    """What model.kernels runs on a device type, "triton" or "torch": the one place that decides (the kernels
    below, plans and run logs ask here)."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels: got {kernels!r}; allowed: {', '.join(map(repr, KERNELS))}")
    if kernels == "triton":
        return "triton" if device_type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1" else "torch"
    return "triton" if kernels == "auto" and device_type == "cuda" and triton_installed() else "torch"


def use_triton(kernels: str, x: torch.Tensor) -> bool:
    # "auto" inside torch.compile (compiled blocks) leaves the elementwise ops to Inductor, which fuses them with
    # their neighbours; the loss, outside the blocks, keeps its Triton kernel
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy + z_loss * mean(logsumexp^2), mean cross-entropy detached) of hidden @ weight.T against
    targets, computed a chunk of rows at a time so the full logits are never held."""
    if use_triton(kernels, hidden):
        from ablate.kernels import cross_entropy_triton

        return cross_entropy_triton.linear_cross_entropy(hidden, weight, targets, ignore_index, z_loss, chunk_rows)
    return reference.linear_cross_entropy(hidden, weight, targets, ignore_index, z_loss, chunk_rows)


# Validation's per-position losses: no backward, so the torch chunk loop (a matmul, a logsumexp and a few row ops per
# chunk, the chunk whole off CPU) serves every device.
per_token_cross_entropy = reference.per_token_cross_entropy
