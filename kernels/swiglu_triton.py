"""SwiGLU in Triton: silu(gate) * up, forward and backward, elementwise over flat contiguous tensors.

Backward recomputes sigmoid(gate) instead of saving silu(gate): it reads gate, up and the output gradient and
writes the two input gradients, the minimum for this op. Both are torch.library.triton_ops (ablate::swiglu_fwd/bwd,
the backward registered as the forward's autograd), which torch.compile traces through.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from ablate.kernels.launch import traced

BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def swiglu_fwd_kernel(gate_ptr, up_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(dout_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    dout = tl.load(dout_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    # d silu(g)/dg = sig * (1 + g * (1 - sig))
    dgate = dout * up * sig * (1.0 + gate * (1.0 - sig))
    dup = dout * gate * sig
    tl.store(dgate_ptr + offsets, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offsets, dup.to(dup_ptr.dtype.element_ty), mask=mask)


def _check(gate: torch.Tensor, up: torch.Tensor) -> None:
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise NotImplementedError(
            f"swiglu (Triton): gate and up must share shape and dtype, got "
            f"{tuple(gate.shape)} {gate.dtype} and {tuple(up.shape)} {up.dtype}"
        )


@triton_op("ablate::swiglu_fwd", mutates_args=())
def swiglu_fwd(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check(gate, up)
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    traced(swiglu_fwd_kernel)[(triton.cdiv(n, BLOCK),)](gate, up, out, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return out


@triton_op("ablate::swiglu_bwd", mutates_args=())
def swiglu_bwd(dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dout, gate, up = dout.contiguous(), gate.contiguous(), up.contiguous()
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    n = gate.numel()
    traced(swiglu_bwd_kernel)[(triton.cdiv(n, BLOCK),)](dout, gate, up, dgate, dup, n, BLOCK=BLOCK, num_warps=NUM_WARPS)
    return dgate, dup


def _save_for_backward(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dout):
    return swiglu_bwd(dout, *ctx.saved_tensors)


swiglu_fwd.register_autograd(_backward, setup_context=_save_for_backward)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return swiglu_fwd(gate, up)
