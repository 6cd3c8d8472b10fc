"""The loss's chunks on a GPU, checked on CPU: the chunk policy (kernels.loss_chunks) at real shapes, the ops a
GPT-2-small step dispatches with it (counted on the meta device), chunks=K against the CPU rule's chunks, the CPU rule
bit for bit as before, the head gradient's one-call fp32 accumulation, and the loss under torch.compile(fullgraph).
"""

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate import kernels
from ablate.config import ModelConfig
from ablate.kernels import loss_chunks, reference
from ablate.model import Transformer

GiB = 2**30
GPT2_SMALL, MODEL_10M, TINY = (16 * 1024, 768, 50304), (32 * 512, 256, 16384), (32 * 128, 64, 4096)


# ---------------------------------------------------------------------------------------------------------------
# the policy, a pure function of (rows, width, vocab, device type, free bytes)


@pytest.mark.parametrize(
    "shape,free,expected",
    [
        (GPT2_SMALL, 80 * GiB, 4),  # 7.7 GiB working set: the fewest chunks that are each <= 25% of it
        (MODEL_10M, 80 * GiB, 4),
        (TINY, 80 * GiB, 1),  # 160 MiB working set: one chunk, one pass of launches
        (GPT2_SMALL, 2 * GiB, 62),  # a chunk's share of the working set <= 1/16 of the free 2 GiB
        (MODEL_10M, 2 * GiB, 20),
        (TINY, 2 * GiB, 2),
        (GPT2_SMALL, 0, 64),  # no room at all: capped at the CPU rule's chunks of 256 rows
    ],
    ids=["gpt2-80G", "10M-80G", "tiny-80G", "gpt2-2G", "10M-2G", "tiny-2G", "gpt2-none-free"],
)
def test_gpu_chunks_at_real_shapes(shape, free, expected):
    rows, width, vocab = shape
    chunks = loss_chunks(rows, width, vocab, "cuda", free)
    assert chunks == expected
    working_set = rows * vocab * (2 + kernels.LOSS_STEP_FP32_BYTES)
    cpu_rule_chunks = -(-rows // reference.default_chunk_rows(rows, width, vocab))
    assert chunks <= cpu_rule_chunks
    if working_set > kernels.ONE_CHUNK_BYTES:
        assert chunks >= 4  # a chunk holds at most 25% of what the whole logits would
    if chunks < cpu_rule_chunks:
        assert working_set / chunks <= free * kernels.FREE_MEMORY_SHARE


@pytest.mark.parametrize("shape", [GPT2_SMALL, MODEL_10M, TINY], ids=["gpt2", "10M", "tiny"])
def test_cpu_keeps_its_rows_rule(shape):
    assert loss_chunks(*shape, "cpu", 80 * GiB) is None
    assert loss_chunks(*shape, "meta", 80 * GiB) is None


def test_a_compiled_loss_on_cpu_takes_a_handful_of_chunks():
    """Compiled, the CPU takes the GPU's count (Inductor fuses each chunk; every chunk unrolled costs compile time):
    the ~10M model's 64 row chunks become 4, the tiny model's one stays one."""
    assert loss_chunks(*MODEL_10M, "cpu", 16 * GiB, logit_bytes=2, compiled=True) == 4
    assert loss_chunks(*TINY, "cpu", 16 * GiB, compiled=True) == 1
    assert loss_chunks(*MODEL_10M, "cpu", 16 * GiB) is None  # eager: the cache rule


def test_a_stacks_loss_is_chunked_for_every_members_chunk_at_once():
    """A stack's loss (training.stack) holds each member's chunk at once: on a GPU its free-memory rule counts K x
    the working set, while its fewest chunks and its cap stay a lone run's; the CPU keeps its rows rule (each
    member's chunks its lone run's, bit for bit)."""
    rows, _, vocab = MODEL_10M
    free = 80 * GiB
    assert loss_chunks(*MODEL_10M, "cuda", free, members=1) == loss_chunks(*MODEL_10M, "cuda", free) == 4
    sixteen = loss_chunks(*MODEL_10M, "cuda", free, members=16)  # 16 x 2.5 GiB: 8 chunks of 5 GiB, 1/16 of 80
    assert sixteen == 8 and 16 * rows * vocab * (2 + kernels.LOSS_STEP_FP32_BYTES) / sixteen <= free / 16
    assert loss_chunks(*TINY, "cuda", free, members=16) == 1  # a small model's stack: still one pass of launches
    assert loss_chunks(*TINY, "cuda", 2 * GiB, members=16) == 16  # 2.5 GiB in 128 MiB shares: capped at 16
    assert loss_chunks(*GPT2_SMALL, "cuda", 2 * GiB, members=16) == 64  # the cap: a member's rows, as alone
    assert loss_chunks(*TINY, "cpu", free, members=16) is None


def test_a_cpu_stack_keeps_its_members_chunk_count(tmp_path):
    from conftest import tiny_trainer

    from ablate.training.stack import StackedTrainer

    members = [tiny_trainer(tmp_path / f"seed{s}", **{"train.seed": s}) for s in (0, 1)]
    assert members[0].stacked_loss_chunks(16) is members[0].model.loss_chunks is None
    assert StackedTrainer(members).stack.loss_module.model.loss_chunks is None


# ---------------------------------------------------------------------------------------------------------------
# ops of a GPT-2-small step (forward, loss, backward) on the meta device


class OpCounter(TorchDispatchMode):
    """aten ops dispatched, by op."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func] += 1
        return func(*args, **(kwargs or {}))

    def non_view(self) -> int:
        """Ops other than those returning an alias of an input without computing: the schema's views (`is_view`:
        view, t, slice, transpose, detach, ...) and aten._unsafe_view, a view the schema does not mark."""
        return sum(n for op, n in self.ops.items() if not op.is_view and op != torch.ops.aten._unsafe_view.default)


def gpt2_small_step_ops(model, tokens, chunks) -> int:
    model.loss_chunks = chunks
    model.zero_grad(set_to_none=True)  # each count sees fresh gradients (no accumulating add_ per parameter)
    with OpCounter() as counter:
        loss, _ = model.loss(tokens, tokens)
        loss.backward()
    return counter.non_view()


def test_a_gpt2_small_step_dispatches_a_third_of_the_ops_with_gpu_chunks():
    """GPT-2 small (learned positions have no counterpart here: no RoPE), 16 x 1024 tokens: the CPU rule's 64 chunks
    dispatch 2,355 non-view ops (torch 2.13), the GPU policy's 4 chunks under 900 (795): each chunk is ~26."""
    cfg = ModelConfig(vocab_size=50304, d_model=768, n_layers=12, n_heads=12, ffn="gelu", norm="layernorm", pos="nope")
    with torch.device("meta"):  # no memory, no compute: kernels "auto" runs the torch reference here
        model = Transformer(cfg, max_seq_len=1024)
        tokens = torch.zeros(16, 1024, dtype=torch.long)
    gpu_chunks = loss_chunks(16 * 1024, 768, 50304, "cuda", 80 * GiB)
    cpu_rule = gpt2_small_step_ops(model, tokens, None)
    gpu_policy = gpt2_small_step_ops(model, tokens, gpu_chunks)
    one_chunk = gpt2_small_step_ops(model, tokens, 1)
    print(f"non-view ops: {cpu_rule} with 64 chunks, {gpu_policy} with {gpu_chunks}, {one_chunk} with 1")
    per_chunk = (gpu_policy - one_chunk) / (gpu_chunks - 1)
    assert cpu_rule - one_chunk == pytest.approx(63 * per_chunk)  # the CPU rule's 64 chunks of 256 rows
    assert gpu_policy < 900 and cpu_rule > 2.5 * gpu_policy


# ---------------------------------------------------------------------------------------------------------------
# numbers: chunks=K against the rows rule, and the rows rule against the driver before `chunks`


def loss_case(rows=30, width=40, vocab=97, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=g).to(dtype).requires_grad_()
    weight = (0.3 * torch.randn(vocab, width, generator=g)).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=g)
    targets[[3, rows // 2, rows - 1]] = -100
    return hidden, weight, targets


def loss_and_grads(hidden, weight, targets, **kw):
    loss, ce = reference.linear_cross_entropy(hidden, weight, targets, -100, 1e-3, **kw)
    return [loss, ce, *torch.autograd.grad(loss, (hidden, weight))]


@pytest.mark.parametrize("chunks", [1, 3, 4, 7, 45])  # 45 > 30 rows: some chunks are empty
def test_chunks_give_the_rows_rules_numbers(chunks):
    hidden, weight, targets = loss_case()
    got = loss_and_grads(hidden, weight, targets, chunks=chunks)
    want = loss_and_grads(hidden, weight, targets, chunk_rows=7)
    for g, w in zip(got, want):  # fp32, only the order of the sums differs
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    with torch.no_grad():  # no gradient work when none is asked for, same numbers
        loss, _ = reference.linear_cross_entropy(hidden, weight, targets, -100, 1e-3, chunks=chunks)
    assert torch.equal(loss, got[0])


def test_chunks_are_nearly_equal_and_cover_every_row():
    x = torch.arange(30)
    pieces = reference.row_chunks(x, None, 4)
    assert [len(p) for p in pieces] == [7, 8, 7, 8] and torch.equal(torch.cat(pieces), x)
    assert [len(p) for p in reference.row_chunks(x, 7, None)] == [7, 7, 7, 7, 2]


def test_chunks_and_chunk_rows_are_not_both_given():
    hidden, weight, targets = loss_case()
    with pytest.raises(ValueError, match="chunks=3 needs chunk_rows=None"):
        reference.linear_cross_entropy(hidden, weight, targets, chunk_rows=7, chunks=3)
    with pytest.raises(ValueError, match="chunks >= 1"):
        kernels.linear_cross_entropy(hidden, weight, targets, chunks=0)


def driver_before_chunks(hidden, weight, targets, ignore_index, z_loss, chunk_rows, ce_chunk, with_grads, ce_per_row):
    """reference.chunked_linear_cross_entropy as it was before `chunks` (commit b490ea0), kept to hold the rows rule
    to it bit for bit."""
    n = hidden.shape[0]
    valid_count = (targets != ignore_index).sum()
    ce_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    z_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if with_grads else None
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grads else None
    device_type = hidden.device.type
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    for start in range(0, n, chunk_rows):
        rows = hidden[start : start + chunk_rows]
        logits = rows @ weight.T
        ce_rows, z_rows = ce_chunk(logits, targets[start : start + chunk_rows], ignore_index, z_loss, with_grads)
        ce_sum += ce_rows.sum()
        z_sum += z_rows.sum()
        if ce_per_row is not None:
            ce_per_row[start : start + chunk_rows] = ce_rows
        if with_grads:
            grad_hidden[start : start + chunk_rows] = logits @ weight
            if logits.dtype == grad_weight.dtype:
                grad_weight.addmm_(logits.T, rows)
            else:
                grad_weight += logits.T @ rows
    loss_sum = ce_sum + z_loss * z_sum if z_loss else ce_sum
    return loss_sum, ce_sum, valid_count, grad_hidden, grad_weight


@pytest.mark.parametrize(
    "dtype,autocast", [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)], ids=str
)
@pytest.mark.parametrize("with_grads", [True, False])
def test_the_rows_rule_is_bit_for_bit_as_before(dtype, autocast, with_grads):
    """600 rows, vocab 4099: the default rows rule's 3 chunks (256, 256, 88 rows), each in CPU cache blocks of 63."""
    hidden, weight, targets = (t.detach() for t in loss_case(rows=600, width=48, vocab=4099, dtype=dtype))
    chunk_rows = reference.default_chunk_rows(600, 48, 4099)
    outputs = []
    for driver in (reference.chunked_linear_cross_entropy, driver_before_chunks):
        ce_per_row = torch.empty(600)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            args = (hidden, weight, targets, -100, 1e-3, chunk_rows, reference.cross_entropy_chunk, with_grads)
            outputs.append([*driver(*args, ce_per_row=ce_per_row), ce_per_row])
    for new, old in zip(*outputs):
        assert (new is None and old is None) or torch.equal(new, old)


# ---------------------------------------------------------------------------------------------------------------
# the head gradient: one fp32-output addmm per chunk where torch has it (eager CUDA)


class OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_half_chunks_add_into_the_fp32_head_gradient_in_one_call():
    """On meta (addmm's out_dtype overload has a meta kernel): fused, one addmm writing fp32 into the accumulator;
    otherwise a half product and a separate fp32 add. fp32 chunks always take one in-place addmm."""
    grad_weight = torch.zeros(50304, 768, device="meta")
    for dtype, fused, ops in [
        (torch.bfloat16, True, ["aten.addmm.dtype_out"]),
        (torch.bfloat16, False, ["aten.mm.default", "aten.add_.Tensor"]),
        (torch.float32, False, ["aten.addmm_.default"]),
    ]:
        logits = torch.empty(4096, 50304, device="meta", dtype=dtype)
        rows = torch.empty(4096, 768, device="meta", dtype=dtype)
        with OpNames() as seen:
            reference.accumulate_head_gradient(grad_weight, logits, rows, fused)
        assert [n for n in seen.names if n != "aten.permute.default"] == ops, (dtype, fused)
        assert grad_weight.dtype == torch.float32


def test_the_fused_head_gradient_is_eager_cuda_only():
    assert not reference.fused_head_gradient(torch.device("cpu"))
    assert not reference.fused_head_gradient(torch.device("meta"))


# ---------------------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True): the reference's autograd.Function and its chunk loop, one graph


def compiled_loss(hidden, weight, targets, chunks):
    return kernels.linear_cross_entropy(hidden, weight, targets, -100, 1e-3, kernels="torch", chunks=chunks)


def test_the_reference_loss_compiles_as_one_graph():
    hidden, weight, targets = loss_case()
    for chunks in (None, 4):
        explained = torch._dynamo.explain(compiled_loss)(hidden, weight, targets, chunks)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_a_compiled_loss_takes_a_batch_ramp_in_one_graph_with_eager_numbers():
    """Rows 30 -> 45 (a ramp, the row count dynamic; 30 % 4 != 45 % 4): the same 4 chunks, compiled once; loss,
    cross-entropy and both gradients as in eager."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(compiled_loss, backend=counter, fullgraph=True, dynamic=True)
    weight = loss_case()[1]
    for rows in (30, 45):
        hidden, _, targets = loss_case(rows=rows, seed=rows)
        loss, ce = compiled(hidden, weight, targets, 4)
        got = [loss, ce, *torch.autograd.grad(loss, (hidden, weight))]
        want = loss_and_grads(hidden, weight, targets, chunks=4)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    assert counter.frame_count == 1


def test_the_model_and_its_loss_in_chunks_compile_as_one_graph():
    """Transformer.loss with model.loss_chunks set, as the trainer compiles it: no graph break."""
    cfg = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=4, kernels="torch", z_loss=1e-3)
    model = Transformer(cfg, max_seq_len=16)
    model.init_weights(torch.Generator().manual_seed(0))
    model.loss_chunks = 3
    tokens = torch.randint(0, 97, (2, 17), generator=torch.Generator().manual_seed(1))
    explained = torch._dynamo.explain(model.loss)(tokens[:, :-1], tokens[:, 1:])
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
