"""RMSNorm in Triton: forward, and backward with the weight gradient.

A program normalizes a tile of BLOCK_ROWS rows x BLOCK_D columns (the whole row, so x is read once). Backward
loops each program over many tiles and keeps its share of the weight gradient in registers, writing one fp32 row
per program; torch sums those few rows. All arithmetic is fp32 (loads are converted at once: bf16 math in the
interpreter is wrong, and fp32 is what the reference does). Forward and backward are torch.library.triton_ops
(ablate::rms_norm_fwd/bwd, the backward registered as the forward's autograd), which torch.compile traces through.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

from ablate.kernels.launch import traced

MAX_WIDTH = 16384
BLOCK_SIZES = tuple(64 * 2**i for i in range(9))  # every BLOCK_D that launch_config returns: 64 .. 16384


def launch_config(width: int) -> dict:
    """Block sizes and warps for rows of `width`; the AOT build check compiles every one of them."""
    if width > MAX_WIDTH:
        raise NotImplementedError(
            f"rms_norm (Triton): rows of width {width} > {MAX_WIDTH} are not supported; use model.kernels='torch'"
        )
    block_d = max(64, triton.next_power_of_2(width))
    block_rows = max(1, 2048 // block_d)
    # about 8 elements per thread: no register spills in the builds up to 8192 wide (16384 spills a little)
    return {"BLOCK_D": block_d, "BLOCK_ROWS": block_rows, "num_warps": min(32, block_rows * block_d // 256)}


@triton.jit
def rms_norm_fwd_kernel(
    x_ptr, w_ptr, y_ptr, rstd_ptr, n_rows, n_cols, eps, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr
):
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    row_ok, col_ok = rows < n_rows, cols < n_cols
    mask = row_ok[:, None] & col_ok[None, :]
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit
def rms_norm_bwd_kernel(
    dy_ptr,
    x_ptr,
    w_ptr,
    rstd_ptr,
    dx_ptr,
    dw_partial_ptr,
    n_rows,
    n_cols,
    n_programs,
    tiles_per_program,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_D,), dtype=tl.float32)
    # program pid takes tiles pid, pid + n_programs, ...; a tile past the last row loads nothing (masked)
    for i in range(0, tiles_per_program):
        tile = pid + i * n_programs
        rows = (tile * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
        row_ok = rows < n_rows
        mask = row_ok[:, None] & col_ok[None, :]
        offsets = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)
        x_hat = x * rstd[:, None]
        dy_w = dy * w[None, :]
        # d/dx of x_hat * w: rstd * (dy*w - x_hat * mean(dy*w*x_hat))
        mean_dot = tl.sum(dy_w * x_hat, axis=1) / n_cols
        dx = (dy_w - x_hat * mean_dot[:, None]) * rstd[:, None]
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * x_hat, axis=0)
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=col_ok)


def _num_programs(device: torch.device, n_tiles: int) -> int:
    """Enough programs to fill the GPU, few enough that the per-program weight-gradient rows stay small."""
    slots = 4 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(n_tiles, slots))


@triton_op("ablate::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    n_rows, n_cols = x2.shape
    cfg = launch_config(n_cols)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous rows of x's shape
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_rows, cfg["BLOCK_ROWS"]),)
    traced(rms_norm_fwd_kernel)[grid](
        x2,
        weight.contiguous(),
        y,
        rstd,
        n_rows,
        n_cols,
        eps,
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_D=cfg["BLOCK_D"],
        num_warps=cfg["num_warps"],
    )
    return y, rstd


@triton_op("ablate::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    dy2 = dy.reshape(x2.shape).contiguous()
    n_rows, n_cols = x2.shape
    cfg = launch_config(n_cols)
    tiles = triton.cdiv(n_rows, cfg["BLOCK_ROWS"])
    programs = _num_programs(x.device, tiles)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw_partial = torch.empty(programs, n_cols, dtype=torch.float32, device=x.device)
    traced(rms_norm_bwd_kernel)[(programs,)](
        dy2,
        x2,
        weight.contiguous(),
        rstd,
        dx,
        dw_partial,
        n_rows,
        n_cols,
        programs,
        triton.cdiv(tiles, programs),
        BLOCK_ROWS=cfg["BLOCK_ROWS"],
        BLOCK_D=cfg["BLOCK_D"],
        num_warps=cfg["num_warps"],
    )
    return dx, dw_partial.sum(0).to(weight.dtype)


def _save_for_backward(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = rms_norm_bwd(dy, x, weight, rstd)
    return dx, dw, None


rms_norm_fwd.register_autograd(_backward, setup_context=_save_for_backward)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_fwd(x, weight, eps)[0]
