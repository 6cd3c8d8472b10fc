"""Linear + cross-entropy in chunks, with the per-chunk loss step in Triton.

The chunk driver and its autograd Function are the reference's (reference.py): per chunk, a cuBLAS matmul makes
the chunk's logits, this kernel turns them in place into their gradient while computing each row's loss and
logsumexp, and two more matmuls give the chunk's hidden-state gradient and its share of the weight gradient.
One program per row: pass 1 reads the row for an online max/sum-of-exp (the logsumexp), pass 2 reads it again
and writes softmax * (1 + 2 z lse) - onehot over it; ignored rows get zero loss and zero gradient. The launch is a
torch.library.triton_op (ablate::cross_entropy_chunk, mutating the logits), which torch.compile traces through.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from ablate.kernels import reference
from ablate.kernels.launch import traced

BLOCK_V = 4096
NUM_WARPS = 8


@triton.jit
def cross_entropy_chunk_kernel(
    logits_ptr,
    targets_ptr,
    ce_ptr,
    z_ptr,
    n_cols,
    ignore_index,
    z_loss,
    WRITE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * n_cols
    target = tl.load(targets_ptr + row)
    valid = target != ignore_index
    running_max = tl.full((), float("-inf"), tl.float32)
    running_sum = tl.full((), 0.0, tl.float32)
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)
    target_logit = tl.load(row_ptr + target, mask=valid, other=0.0).to(tl.float32)
    tl.store(ce_ptr + row, tl.where(valid, lse - target_logit, 0.0))
    tl.store(z_ptr + row, tl.where(valid, lse * lse, 0.0))
    if WRITE_GRAD:
        scale = tl.where(valid, 1.0 + 2.0 * z_loss * lse, 0.0)  # d(ce + z_loss * lse^2)/d(lse); 0 when ignored
        hit = tl.where(valid, 1.0, 0.0)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = cols < n_cols
            x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) * scale - tl.where(cols == target, hit, 0.0)
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


@triton_op("ablate::cross_entropy_chunk", mutates_args=("logits",))
def cross_entropy_chunk_op(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, z_loss: float, write_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.stride(-1) != 1 or logits.stride(0) != logits.shape[1]:
        raise NotImplementedError("cross_entropy_chunk (Triton): logits must be contiguous (rows, vocab)")
    n_rows, n_cols = logits.shape
    ce_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    z_rows = torch.empty_like(ce_rows)
    targets = targets.to(torch.int64).contiguous()  # the variant the AOT check builds
    traced(cross_entropy_chunk_kernel)[(n_rows,)](
        logits,
        targets,
        ce_rows,
        z_rows,
        n_cols,
        ignore_index,
        z_loss,
        WRITE_GRAD=write_grad,
        BLOCK_V=BLOCK_V,
        num_warps=NUM_WARPS,
    )
    return ce_rows, z_rows


def cross_entropy_chunk(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, z_loss: float, write_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as reference.cross_entropy_chunk."""
    return cross_entropy_chunk_op(logits, targets, ignore_index, float(z_loss), write_grad)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    chunk_rows: int | None = None,
    chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return reference.linear_cross_entropy(
        hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk=cross_entropy_chunk, chunks=chunks
    )
