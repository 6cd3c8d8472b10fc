"""Fused kernels for the model, and the one place that picks an implementation (installed as `ablate.kernels`).

rms_norm, swiglu, apply_rope and linear_cross_entropy take `kernels="torch" | "triton"` (the model.kernels switch).
"triton" runs the Triton kernel when the tensor is on CUDA, or on any device when TRITON_INTERPRET=1 (Triton's CPU
interpreter, which the tests use); otherwise the plain-torch reference of the same signature runs (reference.py).
Triton is imported only when a Triton kernel is about to run, so CPU users need not have it.

    reference.py              the references: the semantics, and what runs off CUDA
    rmsnorm_triton.py         RMSNorm forward/backward (weight gradient included)
    swiglu_triton.py          silu(gate) * up forward/backward
    rope_triton.py            rotary embedding of queries/keys forward/backward
    cross_entropy_triton.py   chunked linear + cross-entropy with z-loss and ignore-index
    aot.py                    ahead-of-time builds of every kernel for sm_80/sm_90 (the CPU build check)
"""

from __future__ import annotations

import os

import torch

from ablate.kernels import reference

KERNELS = ("torch", "triton")


def use_triton(kernels: str, x: torch.Tensor) -> bool:
    if kernels not in KERNELS:
        raise ValueError(f"kernels: got {kernels!r}; allowed: {', '.join(map(repr, KERNELS))}")
    return kernels == "triton" and (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1")


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


# Validation's per-position losses: no backward, so the torch chunk loop (a matmul and a logsumexp per chunk) serves
# every device.
per_token_cross_entropy = reference.per_token_cross_entropy
