"""Plain-torch references: the semantics every Triton kernel must match, and what runs off CUDA.

Each function has the same signature as its Triton twin. The linear+cross-entropy here is already chunked: the
output projection and the loss are computed a chunk of rows at a time, and the gradients of hidden states and
weight are formed in the same pass, so the full (tokens x vocab) logits never exist, on CPU as on GPU. The Triton
version reuses this driver and only swaps the per-chunk loss step. The driver is plain torch in an autograd.Function,
so torch.compile(fullgraph=True) traces it whole (its chunk loop unrolled).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, computed in fp32, returned in x's dtype."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, elementwise."""
    return F.silu(gate) * up


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first 2*cos.shape[-1] dims of x (B, H, S, D) in half-split pairs (rotate_half style); the rest pass
    through. cos/sin: (max_seq, rotary // 2) tables indexed by position along dim -2, or (B, 1, S, rotary // 2)
    already gathered at each token's position."""
    rotary = 2 * cos.shape[-1]
    x_rot, x_pass = x[..., :rotary], x[..., rotary:]
    x1, x2 = x_rot.float().chunk(2, dim=-1)
    cos, sin = cos[..., : x.shape[-2], :], sin[..., : x.shape[-2], :]
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)
    return torch.cat((rotated, x_pass), dim=-1) if x_pass.numel() else rotated


# ---------------------------------------------------------------------------------------------------------------
# chunked linear + cross-entropy


# The loss step's row blocks: ~1 MB of fp32 logits, which stay in a core's cache through the step's ~8 passes over
# them (cast, max, exp, sums, softmax, scaling); over a whole chunk (16 MB at 256 x 16384) each pass went to memory.
# Measured on CPU, 4096 x 16384 logits: 2.0x faster in bf16, 1.4x in fp32. Every op is per row, so the numbers are
# the same as the whole chunk's, bit for bit.
CACHE_BLOCK_ELEMENTS = 2**18


def cross_entropy_chunk(
    logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, z_loss: float, write_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's loss step: per-row (cross-entropy, logsumexp^2) in fp32, both 0 on ignored rows. With write_grad,
    `logits` (rows, vocab) is overwritten by d(sum of row losses)/d(logits):
    softmax * (1 + 2 * z_loss * lse) - onehot(target), zero on ignored rows (the caller divides by the count).
    Eager on CPU a block of rows at a time (CACHE_BLOCK_ELEMENTS), elsewhere the whole chunk at once."""
    # CPU caches only: on a GPU each block would be ~10 kernel launches for a few rows (5 rows at vocab 50k), and a
    # compiled graph fuses the passes itself (unrolled blocks made Inductor's CPU compile of a ~10M model 460 s)
    blocked = logits.device.type == "cpu" and not torch.compiler.is_compiling()
    block = max(1, CACHE_BLOCK_ELEMENTS // logits.shape[-1]) if blocked else logits.shape[0]
    if logits.shape[0] <= block:
        return _cross_entropy_rows(logits, targets, ignore_index, z_loss, write_grad)
    parts = [
        _cross_entropy_rows(
            logits[start : start + block], targets[start : start + block], ignore_index, z_loss, write_grad
        )
        for start in range(0, logits.shape[0], block)
    ]
    return torch.cat([ce for ce, _ in parts]), torch.cat([z for _, z in parts])


def _cross_entropy_rows(logits, targets, ignore_index, z_loss, write_grad):
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    valid = targets != ignore_index
    safe_targets = torch.where(valid, targets, 0)
    ce_rows = (lse - x.gather(1, safe_targets[:, None])[:, 0]) * valid
    z_rows = lse.square() * valid
    if write_grad:
        grad = torch.softmax(x, dim=-1).mul_((1 + 2 * z_loss * lse)[:, None])
        grad.scatter_add_(1, safe_targets[:, None], -torch.ones_like(grad[:, :1]))
        logits.copy_(grad.mul_(valid[:, None]))
    return ce_rows, z_rows


MIN_CHUNK_ROWS = 256


def default_chunk_rows(n_rows: int, width: int, vocab: int) -> int:
    """Rows per chunk so that a chunk's logits are about as large as the hidden states they come from, but at least
    MIN_CHUNK_ROWS: thinner matmuls waste time (measured on CPU, 4096 x 256 -> 16384: 64 rows 527 ms, 256 rows
    482 ms for forward + backward)."""
    return max(1, min(n_rows, max(MIN_CHUNK_ROWS, math.ceil(n_rows * width / vocab))))


def row_chunks(x: torch.Tensor, chunk_rows: int | None, chunks: int | None) -> tuple[torch.Tensor, ...]:
    """Views of x's rows: `chunks` pieces of floor or ceil(rows / chunks) rows if given, else pieces of chunk_rows.
    The `chunks` pieces are cut at i * rows // chunks: a changing row count (a batch ramp, compiled with a dynamic
    batch) changes their sizes, never their number, and compiles once (tensor_split guards on rows % chunks)."""
    if chunks is None:
        return x.split(chunk_rows)
    bounds = [i * x.shape[0] // chunks for i in range(chunks + 1)]
    return tuple(x[start:end] for start, end in zip(bounds, bounds[1:]))


@functools.cache
def addmm_takes_fp32_accumulator(device: torch.device) -> bool:
    """Whether this torch's addmm on `device` adds half-precision factors into an fp32 tensor in one call
    (out_dtype=float32, the accumulator as input and output). Asked once per device with a 2 x 2 product: torch
    versions without the out_dtype overload raise, and some with it refuse an fp32 input beside half factors."""
    accumulator = torch.ones(2, 2, device=device)
    factor = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
    try:
        torch.addmm(accumulator, factor, factor, out_dtype=torch.float32, out=accumulator)
    except (RuntimeError, TypeError):
        return False
    return bool(torch.all(accumulator == 3))


def fused_head_gradient(device: torch.device) -> bool:
    """Whether half-precision chunks add into the fp32 head gradient in one addmm: eager CUDA where torch can
    (addmm_takes_fp32_accumulator). CPU has no such addmm; under torch.compile the product and the add are Inductor's
    to schedule (its lowering of addmm with out_dtype failed: pytorch/pytorch#163880); under torch.func.vmap (a stack
    of members, StackedLinearCrossEntropyFunction) an out= call has no batching rule."""
    return (
        device.type == "cuda"
        and not torch.compiler.is_compiling()
        and not _under_vmap()
        and addmm_takes_fp32_accumulator(device)
    )


def _under_vmap() -> bool:
    """Whether this runs inside a torch.func transform (StackedLinearCrossEntropyFunction's vmap), eagerly."""
    return not torch.compiler.is_compiling() and torch._C._functorch.maybe_current_level() is not None


def accumulate_head_gradient(
    grad_weight: torch.Tensor, logits: torch.Tensor, rows: torch.Tensor, fused: bool
) -> torch.Tensor:
    """grad_weight (fp32) + logits.T @ rows, for one chunk's logit gradient `logits` and its hidden rows `rows`:
    added in place, and returned (under vmap, where addmm_ has no batching rule, a new tensor)."""
    if logits.dtype == grad_weight.dtype:
        if _under_vmap():  # the members' products in one batched call, not one addmm_ each
            return torch.addmm(grad_weight, logits.T, rows)
        return grad_weight.addmm_(logits.T, rows)  # in place: no weight-sized temporary per chunk
    if fused:  # half factors, fp32 sums in the matmul's epilogue: no half product, no separate add
        return torch.addmm(grad_weight, logits.T, rows, out_dtype=torch.float32, out=grad_weight)
    return grad_weight.add_(logits.T @ rows)  # a half product, then its fp32 add


def chunked_linear_cross_entropy(
    hidden,
    weight,
    targets,
    ignore_index,
    z_loss,
    chunk_rows,
    ce_chunk,
    with_grads,
    ce_per_row: torch.Tensor | None = None,
    chunks: int | None = None,
):
    """(loss sum, ce sum, valid count, grad_hidden, grad_weight) of hidden (N, D) @ weight (V, D).T, a chunk of rows
    at a time (row_chunks: `chunks` chunks if given, else chunks of chunk_rows). Gradients are of the *sums*: the
    caller divides by the count. ce_chunk is the per-chunk loss step. `ce_per_row` (N,), if given, receives each
    row's cross-entropy."""
    valid_count = (targets != ignore_index).sum()
    ce_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    z_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if with_grads else None
    # fp32 accumulator over chunks, whatever the weight's dtype (a bf16 sum of many chunks would lose bits)
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if with_grads else None  # under vmap: each member's
    device_type = hidden.device.type
    # cast once here, not once per chunk and matmul (a third of the time); autocast exists on these two device types
    # (torch 2.11's dynamo cannot trace torch.amp.is_autocast_available)
    if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    fused = with_grads and fused_head_gradient(hidden.device)
    row_parts = row_chunks(hidden, chunk_rows, chunks)
    no_parts = (None,) * len(row_parts)
    for rows, row_targets, grad_rows, ce_rows_out in zip(
        row_parts,
        row_chunks(targets, chunk_rows, chunks),
        row_chunks(grad_hidden, chunk_rows, chunks) if with_grads else no_parts,
        row_chunks(ce_per_row, chunk_rows, chunks) if ce_per_row is not None else no_parts,
    ):
        logits = rows @ weight.T  # (rows, vocab): the only vocab-sized buffer, one chunk at a time
        ce_rows, z_rows = ce_chunk(logits, row_targets, ignore_index, z_loss, with_grads)
        ce_sum = ce_sum + ce_rows.sum()  # out of place: under vmap the sum is a batched tensor
        z_sum = z_sum + z_rows.sum()
        if ce_rows_out is not None:
            ce_rows_out.copy_(ce_rows)
        if with_grads:  # `logits` now holds d(loss sum)/d(logits) for this chunk
            grad_rows.copy_(logits @ weight)
            grad_weight = accumulate_head_gradient(grad_weight, logits, rows, fused)
    loss_sum = ce_sum + z_loss * z_sum if z_loss else ce_sum
    return loss_sum, ce_sum, valid_count, grad_hidden, grad_weight


@torch.no_grad()
def per_token_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of each position (fp32, shaped like targets, 0 where ignored) of hidden @ weight.T, never
    holding more than a chunk of logits: validation's per-sequence losses."""
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    # new_empty, not torch.empty: under vmap (a stack's validation, training.stack_eval) one row of it a member
    out = flat_hidden.new_empty(flat_targets.shape, dtype=torch.float32)
    chunk_rows = chunk_rows or default_chunk_rows(*flat_hidden.shape, weight.shape[0])
    chunked_linear_cross_entropy(
        flat_hidden,
        weight,
        flat_targets,
        ignore_index,
        0.0,
        chunk_rows,
        cross_entropy_chunk,
        with_grads=False,
        ce_per_row=out,
    )
    return out.view(targets.shape)


def _means_and_gradients(hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, chunks):
    """(loss, ce, grad_hidden, grad_weight): the chunked driver's sums over the valid count, gradients included."""
    loss_sum, ce_sum, count, grad_hidden, grad_weight = chunked_linear_cross_entropy(
        hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, with_grads=True, chunks=chunks
    )
    return loss_sum / count, ce_sum / count, grad_hidden.div_(count), grad_weight.div_(count).to(weight.dtype)


def _keep_gradients(ctx, inputs, output):
    _, ce, grad_hidden, grad_weight = output
    ctx.save_for_backward(grad_hidden, grad_weight)
    ctx.mark_non_differentiable(ce, grad_hidden, grad_weight)


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Gradients are computed in forward, chunk by chunk, and only scaled in backward: nothing vocab-sized is saved.
    Outputs (loss, ce, grad_hidden, grad_weight): the last two are what backward scales (not differentiable).
    Written with setup_context so torch.func.vmap takes it (a stack of models, training.stack): under vmap the
    members' slices go through StackedLinearCrossEntropyFunction, every chunk's ops batched over the members."""

    @staticmethod
    def forward(hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, chunks):
        return _means_and_gradients(hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, chunks)

    setup_context = staticmethod(_keep_gradients)

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_hidden, _grad_weight):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, hidden, weight, targets, *options):
        """The members' slices at once (StackedLinearCrossEntropyFunction), the results stacked on dim 0."""

        def leading(x, dim):  # the members on dim 0 (a tensor every member shares: repeated for each)
            return x.movedim(dim, 0) if dim is not None else x.expand(info.batch_size, *x.shape)

        hidden, weight, targets = (leading(x, dim) for x, dim in zip((hidden, weight, targets), in_dims))
        return StackedLinearCrossEntropyFunction.apply(hidden, weight, targets, *options), (0, 0, 0, 0)


class StackedLinearCrossEntropyFunction(torch.autograd.Function):
    """LinearCrossEntropyFunction of K members at once: hidden (K, N, D), weight (K, V, D), targets (K, N); outputs
    (K,) losses and cross-entropies and (K, ...) gradients. The chunked driver runs under torch.func.vmap, so each
    chunk is one batched matmul and one batched loss step for all members (on a GPU, K times fewer, K times larger
    launches), each member's chunk the rows and sums a lone run's has."""

    @staticmethod
    def forward(hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, chunks):
        def member(hidden, weight, targets):
            return _means_and_gradients(hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, chunks)

        return torch.func.vmap(member)(hidden, weight, targets)

    setup_context = staticmethod(_keep_gradients)

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_hidden, _grad_weight):
        grad_hidden, grad_weight = ctx.saved_tensors
        per_member = grad_loss.view(-1, 1, 1)
        return grad_hidden * per_member, grad_weight * per_member, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    z_loss: float = 0.0,
    chunk_rows: int | None = None,
    ce_chunk=cross_entropy_chunk,
    chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy + z_loss * mean(logsumexp^2), mean cross-entropy detached) over tokens whose target is not
    ignore_index, for logits = hidden (..., D) @ weight (V, D).T, never holding more than a chunk of logits: `chunks`
    chunks of nearly equal rows, or chunks of chunk_rows rows (None: default_chunk_rows); not both."""
    if chunks is not None and (chunk_rows is not None or chunks < 1):
        raise ValueError(f"linear_cross_entropy: chunks={chunks} needs chunk_rows=None and chunks >= 1")
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if chunks is None:  # (not computed otherwise: with a dynamic row count it would guard on that count)
        chunk_rows = chunk_rows or default_chunk_rows(*flat_hidden.shape, weight.shape[0])
    # under torch.func.vmap (a stack of models) a member's tensors do not show requires_grad: the stack's do. Not
    # asked while compiling (dynamo cannot trace the question): a compiled stack takes the plain chunked path below,
    # differentiated by AOTAutograd
    batched = not torch.compiler.is_compiling() and torch._C._functorch.is_functorch_wrapped_tensor(hidden)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or batched):
        loss, ce, _, _ = LinearCrossEntropyFunction.apply(
            flat_hidden, weight, flat_targets, ignore_index, z_loss, chunk_rows, ce_chunk, chunks
        )
        return loss, ce
    loss_sum, ce_sum, count, _, _ = chunked_linear_cross_entropy(
        flat_hidden, weight, flat_targets, ignore_index, z_loss, chunk_rows, ce_chunk, with_grads=False, chunks=chunks
    )
    return loss_sum / count, ce_sum / count
