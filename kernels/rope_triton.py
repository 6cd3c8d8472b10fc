"""RoPE in Triton: rotate the first 2*half dims of each head in half-split pairs, pass the rest through.

Elementwise over the logical (B, H, S, D) index, reading x through its strides, so the transposed (B, S, H, D)
projections need no copy; the output is contiguous (B, H, S, D). Each element reads itself and its partner
(col +- half, the same row: a cache hit) and cos/sin of its position, shared by every batch row and head.
Backward is the same rotation by the opposite angle: the same kernel with sin negated. The op is a
torch.library.triton_op (ablate::rope, its own backward registered as its autograd), which torch.compile traces
through.
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
def rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    n_elements,
    n_heads,
    seq_len,
    head_dim,
    half,
    stride_b,
    stride_h,
    stride_s,
    stride_d,
    table_stride_b,
    table_stride_h,
    table_stride_s,
    sin_sign,
    BLOCK: tl.constexpr,
):
    # int32 index arithmetic (the op checks n_elements < 2**31): 64-bit division would double the registers
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    col = offsets % head_dim
    row = offsets // head_dim
    pos = row % seq_len
    head = (row // seq_len) % n_heads
    batch = row // (seq_len * n_heads)
    base = batch.to(tl.int64) * stride_b + head.to(tl.int64) * stride_h + pos.to(tl.int64) * stride_s
    x = tl.load(x_ptr + base + col * stride_d, mask=mask, other=0.0).to(tl.float32)
    first = col < half
    rotary = mask & (col < 2 * half)
    partner_col = tl.where(first, col + half, col - half)
    freq = tl.where(first, col, col - half)
    partner = tl.load(x_ptr + base + partner_col * stride_d, mask=rotary, other=0.0).to(tl.float32)
    table = batch.to(tl.int64) * table_stride_b + head.to(tl.int64) * table_stride_h + pos * table_stride_s + freq
    cos = tl.load(cos_ptr + table, mask=rotary, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + table, mask=rotary, other=0.0).to(tl.float32) * sin_sign
    # first half: x1*cos - x2*sin; second half: x2*cos + x1*sin; tail dims: cos=1, sin=0 leave x as is
    out = x * cos + tl.where(first, -partner, partner) * sin
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2:
        raise NotImplementedError(f"apply_rope (Triton): expected (..., S, D), got shape {tuple(x.shape)}")
    while x.dim() < 4:
        x = x.unsqueeze(0)
    return x.flatten(0, x.dim() - 4) if x.dim() > 4 else x


def _table_strides(table: torch.Tensor, x4: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, position) strides of a cos/sin table broadcast against x4 (B, H, S, D): a (max_seq, half) table
    is shared by every batch row and head (stride 0); a (B, 1, S, half) one is gathered per batch row."""
    t4 = table[(None,) * (4 - table.dim())]
    if t4.dim() != 4 or t4.shape[2] < x4.shape[2] or any(t not in (1, x) for t, x in zip(t4.shape[:2], x4.shape[:2])):
        raise ValueError(f"apply_rope: cos/sin of shape {tuple(table.shape)} do not fit x of shape {tuple(x4.shape)}")
    return tuple(s if n > 1 else 0 for s, n in zip(t4.stride()[:2], t4.shape[:2])) + (t4.stride(2),)


@triton_op("ablate::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sin_sign: float) -> torch.Tensor:
    x4 = _as_4d(x)
    batch, heads, seq, dim = x4.shape
    half = cos.shape[-1]
    if 2 * half > dim:
        raise ValueError(f"apply_rope: {2 * half} rotary dims do not fit heads of {dim}")
    if x.numel() >= 2**31:
        raise NotImplementedError(
            f"apply_rope (Triton): {x.numel()} elements >= 2**31 in one call; split the batch "
            f"or use model.kernels='torch'"
        )
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous: its flat index is the logical one
    n = out.numel()
    traced(rope_kernel)[(triton.cdiv(n, BLOCK),)](
        x4,
        cos,
        sin,
        out,
        n,
        heads,
        seq,
        dim,
        half,
        *x4.stride(),
        *_table_strides(cos, x4),
        sin_sign,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
    return out


def _save_for_backward(ctx, inputs, output):
    _, cos, sin, sin_sign = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sin_sign = sin_sign


def _backward(ctx, dout):
    cos, sin = ctx.saved_tensors
    return rope(dout, cos, sin, -ctx.sin_sign), None, None, None


rope.register_autograd(_backward, setup_context=_save_for_backward)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return rope(x, cos, sin, 1.0)
