"""The per-rank memory peak of a training step under FSDP2, from a run's config alone (for `ablate plan` and the
check that refuses, before any compute, runs that cannot fit); and the parameter shapes it starts from.

The peak is a timeline of one training step, walked moment by moment (end of the forward pass inside the chunked
loss, the loss's backward, each block's backward, the root's gradient reduction, the optimizer step), each moment
summing the buffers alive then: fp32 parameter, gradient and optimizer-state shards; the tensors autograd saved for
backward (counted op by op for this model's code, per micro-batch); the all-gathered unsharded parameters of the
blocks in use and of the root; the chunked loss's buffers (never the full logits). It models eager mode
(train.compile and train.float8 save less, so it over-estimates them: by 1.3x for the compiled bf16 blocks that
train.compile="auto" gives on CPU, scripts/bench_plan.py's long-bf16 case). On CPU it was checked against the peak of
live tensor bytes measured over real training steps (scripts/bench_plan.py: within 4% at 1 and 2 gloo processes;
tests/test_plan.py); the GPU formulas follow the same code paths (bf16 gathered parameters, NCCL without gloo's
all-gather copy) but were not measured. A stack of runs trained as one model on one device (training.stack, `ablate
plan --stack K`) adds up its members' moments (stack_memory).
"""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from dataclasses import dataclass

import torch

from ablate.config import ConfigError, ModelConfig, RunConfig
from ablate.data.batch_schedule import largest_pass, rank_passes
from ablate.kernels import loss_chunks
from ablate.kernels.reference import CACHE_BLOCK_ELEMENTS, default_chunk_rows
from ablate.model import Transformer, layer_has_experts, layer_uses_rope, mla_dims
from ablate.optim import ParamShapes, shard_elements, state_elements, transient_elements
from ablate.optim import steps_together as optim_steps_together
from ablate.setup import auto
from ablate.setup.checks import CheckedRun

FP32 = 4
UNKNOWN_FREE = 2**60  # a device's free memory, before any run: as if unlimited (the loss's largest chunk)


# ---------------------------------------------------------------------------------------------------------------
# sizes


_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b?|b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """'24GiB' -> 24 * 2**30, '80GB' -> 80e9, '512MiB', '1.5TB', or plain bytes; ConfigError otherwise."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise ConfigError(f"--device-memory {text!r}: expected a size such as 24GiB, 80GB or 512MiB")
    unit = (match.group(2) or "").lower().removesuffix("b")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{int(n)}B"


# Reads the first visible GPU's total memory in a child process (see device_memory_default)
_PROBE = "import torch; print(torch.cuda.get_device_properties(0).total_memory)"


def device_memory_default() -> int | None:
    """The total memory of the visible CUDA device (the first), else None: no limit to check against. Read in a
    short child process (a few seconds, on GPU machines only): asking torch here would initialise CUDA in this
    process, and a sweep's parent must leave the GPUs, and all of their memory, to its workers. NVML would avoid
    the child but numbers GPUs its own way (PCI order, not CUDA's), so CUDA_VISIBLE_DEVICES could name another."""
    if torch.cuda.device_count() == 0:  # counted without initialising CUDA
        return None
    probe = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0 or not probe.stdout.strip().isdigit():
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"--device-memory: could not read the GPU's memory ({last}); give it, e.g. --device-memory 80GiB"
        )
    return int(probe.stdout)


# ---------------------------------------------------------------------------------------------------------------
# parameters


@dataclass
class Shapes(ParamShapes):
    """The model's parameter shapes, from a meta-device model (root, block, all_blocks: ParamShapes, what an
    optimizer declares its state size from), and its counts."""

    n_layers: int
    total: int  # parameters (a tied head counted once)
    active: int  # parameters one token uses (with experts: top_k of the routed ones)
    flops_per_token: float
    kv_cache_bytes_per_token: int  # a bf16 KV cache over every layer
    buffer_bytes: int  # the RoPE tables every rank keeps whole


def model_shapes(run: RunConfig) -> Shapes:
    with torch.device("meta"):  # shapes only: no storage is allocated
        model = Transformer(run.model, max_seq_len=run.data.seq_len)
    largest = max(model.layers, key=lambda layer: sum(p.numel() for p in layer.parameters()))
    block = [tuple(p.shape) for p in largest.parameters()]
    in_blocks = {id(p) for p in model.layers.parameters()}
    root = [tuple(p.shape) for p in model.parameters() if id(p) not in in_blocks]
    return Shapes(
        root=root,
        block=block,
        all_blocks=[tuple(p.shape) for p in model.layers.parameters()],
        n_layers=run.model.n_layers,
        total=model.num_params(),
        active=model.num_params(active=True),
        flops_per_token=model.flops_per_token(run.data.seq_len),
        kv_cache_bytes_per_token=model.kv_cache_bytes_per_token(),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
    )


def _numel(shapes) -> int:
    return sum(math.prod(s) for s in shapes)


def _padded(shapes, world: int) -> int:
    """Elements of an all-gather or reduce-scatter buffer: every shard padded to the same size."""
    return shard_elements(shapes, world) * world


# ---------------------------------------------------------------------------------------------------------------
# precision


@dataclass
class Precision:
    """How a run computes on its device: `mode` "fp32", or "bf16" (fp32 parameter shards, FSDP2 gathers bf16
    copies: the activations, the residual stream and the gathered parameters and gradients are bf16)."""

    device_type: str
    mode: str

    @property
    def matmul(self) -> int:  # bytes of a matmul's output and of what follows it
        return FP32 if self.mode == "fp32" else 2

    @property
    def stream(self) -> int:  # the residual stream and the norms' outputs
        return 2 if self.mode == "bf16" else FP32

    @property
    def gathered(self) -> int:  # unsharded parameters and their gradients
        return 2 if self.mode == "bf16" else FP32

    @property
    def norm(self) -> int:  # what an RMSNorm keeps (input, normed output): torch's CPU RMSNorm computes them in fp32
        return self.stream if self.device_type == "cuda" else FP32

    @property
    def norm_stats(self) -> int:  # a LayerNorm's mean and 1/std: the input's dtype on CPU, fp32 on GPU
        return self.matmul if self.device_type == "cpu" else FP32

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float32 if self.mode == "fp32" else torch.bfloat16


def precision_of(run: RunConfig, device_type: str) -> Precision:
    """As the trainer decides (ablate.setup.auto): bf16 when asked, or by default on GPU."""
    bf16 = auto.uses_bf16(run.train.dtype, torch.device(device_type))
    return Precision(device_type, "bf16" if bf16 else "fp32")


# ---------------------------------------------------------------------------------------------------------------
# activations: what autograd saves for backward, counted op by op for model.py's code


def _norm_saved(m: ModelConfig, tokens: int, p: Precision) -> int:
    """RMSNorm keeps its input, its normed output and 1/rms; LayerNorm its input, mean and 1/std."""
    if m.norm == "rmsnorm":
        return 2 * tokens * m.d_model * p.norm + tokens * FP32
    return tokens * m.d_model * p.stream + 2 * tokens * p.norm_stats


def block_saved_bytes(m: ModelConfig, batch: int, seq: int, p: Precision, use_rope: bool, doc_mask: bool) -> int:
    """Bytes one block saves for backward on a micro-batch of `batch` x `seq` tokens."""
    tokens, d, kv = batch * seq, m.d_model, m.kv_heads * m.head_dim
    mm = p.matmul
    total = 2 * _norm_saved(m, tokens, p)
    total += tokens * d * mm * 2  # inputs of the linears
    if m.qk_norm:  # the queries and keys before and after their norm
        total += 2 * tokens * (d + kv) * p.norm + tokens * (m.n_heads + m.kv_heads) * FP32
    # attention: queries, keys and values (each kv head repeated per group where SDPA cannot group them), the
    # output and its log-sum-exp; with RoPE the output is laid out (B, H, S, D) and o_proj's input is a copy
    grouped = m.kv_heads != m.n_heads
    native_gqa = grouped and (p.device_type == "cpu" or (not doc_mask and p.mode == "bf16"))
    kv_saved = kv if native_gqa or not grouped else d
    total += tokens * (d + 2 * kv_saved) * mm + tokens * d * mm * (2 if use_rope else 1) + tokens * m.n_heads * FP32
    if doc_mask:  # SDPA turns the boolean mask into an additive one of the compute dtype, in every layer
        total += batch * seq * seq * mm
    if m.dropout > 0:  # attention goes to the math backend: probabilities and their dropped copy, and the masks
        total += 2 * batch * m.n_heads * seq * seq * FP32 + 3 * tokens * d * FP32
    total += _ffn_saved(m, batch, seq, p) + _score_mod_saved(m, batch, seq, p, doc_mask)
    return total


SHIPPED_FFN_SAVED = {"swiglu": 4, "gelu": 2, "relu": 1}  # hidden-wide tensors the shipped dense FFNs save


def saved_on_meta(fn, shapes: list[tuple[int, ...]], dtype: torch.dtype) -> int:
    """Bytes autograd saves for backward in `fn(*inputs)` (inputs of `shapes`, requiring grad), run on the meta
    device: no memory, no compute. How a user's component is priced: asked, not assumed."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.device("meta"), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(*[torch.empty(shape, dtype=dtype, requires_grad=True) for shape in shapes])
    return total


def _ffn_saved(m: ModelConfig, batch: int, seq: int, p: Precision) -> int:
    """A dense FFN's saved tensors beyond its input: counted for the shipped ones, measured on meta for a user's
    (its input included: a slight over-estimate)."""
    if m.ffn in SHIPPED_FFN_SAVED:
        return batch * seq * m.ffn_dim * p.matmul * SHIPPED_FFN_SAVED[m.ffn]
    from ablate.components import registry

    with torch.device("meta"):
        ffn = registry.lookup("ffn", m.ffn).obj(m, 0).to(p.compute_dtype)
    return saved_on_meta(ffn, [(batch, seq, m.d_model)], p.compute_dtype)


def _score_mod_saved(m: ModelConfig, batch: int, seq: int, p: Precision, doc_mask: bool) -> int:
    """With model.score_mod, attention writes out its (B, H, S, S) scores (ablate.model.modified_attention) except on
    a GPU without a mask, where FlexAttention holds none: what that path saves, measured on meta (q, k, v aside)."""
    if not m.score_mod or (p.device_type == "cuda" and not doc_mask):
        return 0
    from ablate.components import registry
    from ablate.model import modified_attention

    score_mod = registry.lookup("score_mod", m.score_mod).obj(m)
    qkv = [(batch, m.n_heads, seq, m.head_dim)] * 3
    saved = saved_on_meta(lambda q, k, v: modified_attention(q, k, v, score_mod), qkv, p.compute_dtype)
    return saved - 3 * batch * m.n_heads * seq * m.head_dim * p.matmul  # q, k and v are counted with attention


def layer_saved_bytes(
    m: ModelConfig, batch: int, seq: int, p: Precision, use_rope: bool, doc_mask: bool, moe: bool
) -> int:
    """block_saved_bytes, with MLA's attention and an MoE layer's experts counted in place of the dense ones
    (approximately: within 10% of what autograd saves, tests/test_moe.py and test_mla.py)."""
    tokens, d, mm = batch * seq, m.d_model, p.matmul
    dense = dataclasses.replace(m, attention="gqa", ffn="swiglu" if m.ffn == "moe" else m.ffn)
    total = block_saved_bytes(dense, batch, seq, p, use_rope, doc_mask)
    heads, hd = m.n_heads, m.head_dim
    if m.attention == "mla":
        kv_rank, rope = mla_dims(m)
        total -= tokens * (d + 2 * m.kv_heads * hd) * mm + tokens * d * mm * (2 if use_rope else 1)
        # queries, keys and zero-padded values as SDPA keeps them, its output and o_proj's copy of it; the latent
        # (and the query latent) before and after its norm (fp32)
        total += 4 * tokens * heads * (hd + rope) * mm + tokens * heads * hd * mm
        for width, extra in ((kv_rank, rope), (m.q_lora_rank, 0)):
            if width:
                total += tokens * (2 * width + extra) * FP32 + tokens * FP32
    if moe:
        rows, hidden = tokens * m.moe_top_k, m.moe_hidden or m.ffn_dim
        total -= tokens * d * mm + tokens * m.ffn_dim * mm * 4
        # the router's logits and probabilities (fp32), each choice's index, row, SwiGLU tensors, output, gated
        # output and gate
        total += 2 * tokens * m.moe_experts * FP32 + tokens * 2 * FP32 + rows * (16 + FP32)
        total += rows * (2 * d * p.stream + 4 * hidden * mm + d * mm)
        total += m.moe_shared_experts * tokens * 4 * hidden * mm
    return total


def saved_per_block(m: ModelConfig, batch: int, seq: int, p: Precision, doc_mask: bool) -> list[int]:
    """Bytes each block saves for backward."""
    if m.ffn != "moe" and m.attention != "mla":
        return [block_saved_bytes(m, batch, seq, p, layer_uses_rope(m, i), doc_mask) for i in range(m.n_layers)]
    return [
        layer_saved_bytes(m, batch, seq, p, layer_uses_rope(m, i), doc_mask, layer_has_experts(m, i))
        for i in range(m.n_layers)
    ]


def final_saved_bytes(m: ModelConfig, tokens: int, p: Precision) -> int:
    """Saved outside the blocks: the final norm's input (and normed output), and the token ids (int64)."""
    return _norm_saved(m, tokens, p) + tokens * 8


def activation_bytes(m: ModelConfig, batch: int, seq: int, p: Precision, doc_mask: bool) -> int:
    """Bytes saved for backward by the forward of one micro-batch, the loss's own buffers apart."""
    return sum(saved_per_block(m, batch, seq, p, doc_mask)) + final_saved_bytes(m, batch * seq, p)


# ---------------------------------------------------------------------------------------------------------------
# the step's timeline


@dataclass
class Memory:
    """Per-rank bytes at the step's peak, by kind."""

    params: int  # this rank's fp32 parameter shards (and the RoPE tables)
    grads: int  # gradients alive at the peak: shards, and unsharded ones being accumulated or reduced
    optimizer: int  # optimizer-state shards
    activations: int  # saved for backward by one micro-batch at the peak, the loss's buffers, activation grads
    gathered: int  # all-gathered (unsharded) parameters of the root and the blocks in use
    moment: str  # when the peak happens
    # of `activations`, what a stack of runs (training.stack) holds once however many members it has where they
    # step one after another: the optimizer step's temporaries (see stack_memory)
    once_per_stack: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.gathered


def estimate_memory(
    checked: CheckedRun, world: int = 1, device_type: str | None = None, shapes: Shapes | None = None
) -> Memory:
    """The per-rank memory peak of a training step of a checked run under FSDP2 over `world` ranks (at world size
    1, a plain module: its bf16 autocast copies of the weights stand where FSDP2's gathered ones did): the largest of
    the step's moments, each the sum of the buffers alive then."""
    return max(step_moments(checked, world, device_type, shapes), key=lambda mem: mem.total)


def step_moments(
    checked: CheckedRun, world: int = 1, device_type: str | None = None, shapes: Shapes | None = None
) -> list[Memory]:
    """The moments of a training step that estimate_memory takes the largest of, in the step's order; the same
    moments for runs of one model, batch plan and precision (a stack's members: stack_memory adds them up)."""
    run, plan = checked.config, checked.batch_plan
    m, t = run.model, run.train
    shapes = shapes or model_shapes(run)
    p = precision_of(run, device_type or auto.device_type(run.train.device))
    batch, seq = largest_pass(plan, world, t.micro_batch), run.data.seq_len  # a rank's largest forward pass
    tokens, d, layers = batch * seq, m.d_model, m.n_layers
    head = m.vocab_size * d  # the output projection (the embedding when tied)

    params = FP32 * shard_elements(shapes.root + shapes.all_blocks, world) + shapes.buffer_bytes
    optimizer = FP32 * state_elements(run.optim, shapes, world)  # as the optimizer declares it
    block_shard, root_shard = FP32 * shard_elements(shapes.block, world), FP32 * shard_elements(shapes.root, world)
    # every block's (layers x block_shard without experts)
    blocks_shard = FP32 * shard_elements(shapes.all_blocks, world)
    gathered_root, gathered_block = p.gathered * _numel(shapes.root), p.gathered * _numel(shapes.block)
    # a reduce-scatter: the unsharded gradients, their copy into the (padded) input buffer, this rank's output
    block_reduce = gathered_block + FP32 * (_padded(shapes.block, world) + shard_elements(shapes.block, world))
    root_reduce = gathered_root + FP32 * (_padded(shapes.root, world) + shard_elements(shapes.root, world))
    # over several ranks an all-gather's output buffer outlives the gather: the last block's until the root's
    # forward ends (the loss included), a backward prefetch's until its block's backward begins (one rank copies
    # shard to parameter directly)
    gather_buffer = p.gathered * _padded(shapes.block, world) if world > 1 else 0
    # gloo (CPU) all-gathers through a temporary as large as the output, for as long as the collective lasts
    gloo_copy = gather_buffer if p.device_type == "cpu" else 0

    per_block = saved_per_block(m, batch, seq, p, run.data.doc_mask)
    saved = sum(per_block) + final_saved_bytes(m, tokens, p)
    ffn_width = m.ffn_dim  # an MoE layer's: its choices' and shared experts' hidden units per token
    if m.ffn == "moe":
        ffn_width = max(ffn_width, (m.moe_top_k + m.moe_shared_experts) * (m.moe_hidden or m.ffn_dim))
    stream_grad = tokens * d * p.stream  # a gradient of the residual stream (also the loss's grad_hidden)
    # the loss's chunk as the trainer sizes it: on a GPU kernels.loss_chunks, whose fewest chunks (free memory not
    # known before the run: a chunk no smaller than the run's) bound it from above; elsewhere the CPU rule
    chunks = loss_chunks(tokens, d, m.vocab_size, p.device_type, free_bytes=UNKNOWN_FREE, logit_bytes=p.matmul)
    rows = -(-tokens // chunks) if chunks else default_chunk_rows(tokens, d, m.vocab_size)
    # the chunked loss in forward: the final norm's output, the hidden-state gradient, the fp32 head-gradient
    # accumulator, one chunk of logits, and the loss step's fp32 temporaries of one block of rows (an fp32 copy of
    # bf16 logits, logsumexp's and softmax's)
    # (on CPU a cache block; on a GPU the torch reference's block is the whole chunk, the Triton kernel's none)
    block = min(rows * m.vocab_size, CACHE_BLOCK_ELEMENTS) if p.device_type == "cpu" else rows * m.vocab_size
    chunk = rows * m.vocab_size * p.matmul + 3 * FP32 * block
    loss_forward = 2 * stream_grad + FP32 * head + chunk
    # in backward the loss's saved gradients (the head's in the gathered dtype) and their scaled copies
    loss_backward = 2 * stream_grad + head * p.gathered

    def moment(name, grads, activations, gathered, once_per_stack=0):
        return Memory(
            params=params,
            grads=grads,
            optimizer=optimizer,
            activations=activations,
            gathered=gathered,
            moment=name,
            once_per_stack=once_per_stack,
        )

    moments = []
    accumulations = max(len(rank_passes(b, world, t.micro_batch)) for b in plan)
    for micro in range(1, min(accumulations, 2) + 1):  # the first micro-batch, and one that finds gradients waiting
        waiting = 0 if micro == 1 else root_shard + blocks_shard
        after = f"micro-batch {micro}"
        in_use = gathered_root + gathered_block  # the last block stays gathered for backward
        moments.append(moment(f"loss forward, {after}", waiting, saved + loss_forward, in_use + gather_buffer))
        moments.append(moment(f"loss backward, {after}", waiting + head * p.gathered, saved + loss_backward, in_use))
        for i in reversed(range(layers)):
            reduced = 0 if micro > 1 else (layers - 1 - i) * block_shard  # shards of the blocks after i
            grads = waiting + reduced + head * p.gathered  # the head's gradient waits for the root's reduction
            alive = sum(per_block[: i + 1]) + tokens * 8  # blocks 0..i still hold theirs; the token ids
            in_use = gathered_root + gathered_block + (gather_buffer if i > 0 else 0)  # block i-1's prefetched
            # the reduce-scatter input of block i+1 is kept until block i's gradients are reduced
            kept_reduce = FP32 * _padded(shapes.block, world) if i < layers - 1 else 0
            if i > 0:  # block i gathered, and block i-1's all-gather under way
                moments.append(
                    moment(
                        f"block {i} pre-backward, {after}", grads + kept_reduce, alive + stream_grad, in_use + gloo_copy
                    )
                )
            # its FFN's backward: the down projection's weight gradient and three FFN-wide activation gradients
            moments.append(
                moment(
                    f"block {i} backward, {after}",
                    grads + kept_reduce + d * ffn_width * p.gathered,
                    alive + stream_grad + 3 * tokens * ffn_width * p.matmul,
                    in_use,
                )
            )
            # its gradients reduced, its activations and its gathered parameters freed
            moments.append(
                moment(
                    f"block {i} gradient reduction, {after}",
                    grads + block_reduce,
                    alive - per_block[i] + stream_grad,
                    in_use - gathered_block,
                )
            )
        moments.append(
            moment(
                f"root gradient reduction, {after}",
                waiting + (blocks_shard if micro == 1 else 0) + root_reduce,
                tokens * 8,
                gathered_root,
            )
        )
    step_transient = FP32 * transient_elements(run.optim, shapes, world)
    moments.append(
        moment("optimizer step", root_shard + blocks_shard, step_transient, 0, once_per_stack=step_transient)
    )
    return moments


# ---------------------------------------------------------------------------------------------------------------
# a stack: runs of one shape trained as one stacked model on one device (training.stack)
#
# Its tensors are its members' stacked on a leading dimension, and one vmapped forward and backward runs every
# member on its own batch: each member's parameters, gradients, optimizer state, saved activations, bf16 weight
# copies and chunk of logits (the loss is batched over the members, StackedLinearCrossEntropyFunction) are alive
# together, as K lone runs' would be on K devices. Only an optimizer step taken member after member (optimizers
# without a stacked_step: AdamW, whose fused step has no temporaries, or a stack of mixed optimizers) holds its
# temporaries once; Muon's stacked_step holds every member's. Nothing else is shared: the estimate counts no fixed
# per-process cost (CUDA context, cuBLAS workspace) for a lone run either. Checked on CPU against the live tensor
# bytes of 2 real StackedTrainer steps (`python scripts/bench_plan.py --world 1 --stack 1,2,4`, eager): estimate /
# measured at K = 1, 2, 4 small-fp32 1.013, 0.968, 0.968; wide-fp32-accum 1.041, 0.987, 0.987; long-bf16 0.875 at
# each K; muon-small-batch 1.141, 1.066, 1.066; muon-wide 1.120, 1.089, 1.089: a stack's estimate is off by about
# what its lone run's is.


def stack_memory(member_moments: list[Memory], together: bool = False) -> Memory:
    """One moment of a stack's step from that moment of each member's (step_moments; members may differ in their
    optimizer): every member's bytes, but what the stack holds once (once_per_stack) counted once, the largest,
    unless the members step `together` (one batched optimizer step: every member's temporaries at once)."""
    once = 0 if together else max(m.once_per_stack for m in member_moments)
    each = [m.activations - (0 if together else m.once_per_stack) for m in member_moments]
    return Memory(
        params=sum(m.params for m in member_moments),
        grads=sum(m.grads for m in member_moments),
        optimizer=sum(m.optimizer for m in member_moments),
        activations=sum(each) + once,
        gathered=sum(m.gathered for m in member_moments),
        moment=member_moments[0].moment,
        once_per_stack=once,
    )


def steps_together(members: list[CheckedRun]) -> bool:
    """Whether a stack of `members` takes its optimizer step as one batched call: every member has one optimizer
    whose class batches a stack's step (optim.steps_together; training.stack.StackedTrainer takes it so)."""
    names = {checked.config.optim.name for checked in members}
    return len(names) == 1 and optim_steps_together(members[0].config.optim)


def estimate_stack_memory(
    members: list[CheckedRun], device_type: str | None = None, shapes: Shapes | None = None
) -> Memory:
    """The device's memory peak of a step of `members` (runs of one stack_key) trained as one stack: the largest of
    the step's moments, each the members' sum by stack_memory. One member: its estimate_memory at world size 1."""
    shapes = shapes or model_shapes(members[0].config)
    timelines = [step_moments(checked, 1, device_type, shapes) for checked in members]
    together = steps_together(members)
    return max((stack_memory(list(same), together) for same in zip(*timelines)), key=lambda mem: mem.total)


def largest_stack(
    checked: CheckedRun, device_memory: int, device_type: str | None = None, shapes: Shapes | None = None
) -> int:
    """The most runs like `checked` that fit `device_memory` as one stack (0: not even one), by check_fits's rule
    (a peak at most the device memory): at every moment K members need K x (its bytes - once_per_stack) +
    once_per_stack (K x its bytes where they step together), so the bound is each moment's, solved for K, and the
    smallest of them."""
    held_once = not steps_together([checked])
    return min(
        max((device_memory - once) // (m.total - once), 0)
        for m in step_moments(checked, 1, device_type, shapes)
        for once in [m.once_per_stack if held_once else 0]
    )


def check_fits(
    checked: CheckedRun, world: int, device_memory_bytes: int | None, device_type: str | None = None
) -> Memory:
    """The run's per-rank memory estimate at `world` ranks; ConfigError when it exceeds `device_memory_bytes`
    (None: nothing to check against). `device_type` defaults to where the run would train."""
    memory = estimate_memory(checked, world, device_type)
    if device_memory_bytes is not None and memory.total > device_memory_bytes:
        raise ConfigError(refusal([(checked.config, memory)], world, device_memory_bytes))
    return memory


def refusal(unfit: list[tuple[RunConfig, Memory]], world: int, device_memory: int) -> str:
    """The message naming each run that cannot fit, what it needs and what would help."""
    lines = [
        f"{run.name} (seed {run.train.seed}) needs ~{format_bytes(mem.total)} per rank ({breakdown(mem)})"
        for run, mem in unfit
    ]
    return (
        f"{len(unfit)} run{'s' if len(unfit) != 1 else ''} cannot fit in {format_bytes(device_memory)} of device "
        f"memory at world size {world}:\n  " + "\n  ".join(lines) + "\nallowed: a smaller train.micro_batch "
        "(activations scale with it; accumulation keeps global_batch), more ranks (parameters, gradients and "
        "optimizer state are sharded over them), or a smaller model"
    )


def breakdown(mem: Memory) -> str:
    """What a peak is made of, as a refusal names it."""
    return (
        f"parameters {format_bytes(mem.params)}, gradients {format_bytes(mem.grads)}, optimizer "
        f"{format_bytes(mem.optimizer)}, activations {format_bytes(mem.activations + mem.gathered)}; peak at "
        f"{mem.moment}"
    )
