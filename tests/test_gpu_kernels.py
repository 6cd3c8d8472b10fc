"""Every Triton kernel against its torch reference on a GPU, at the shapes real models give them (marked gpu).

test_kernels.py checks the same contracts in Triton's CPU interpreter at toy shapes; here the kernels are compiled
and launched for real: RMSNorm at widths 32 to 16384 over 8k rows, SwiGLU at 8k x 11008, RoPE on (2, 32, 2048, 128)
through a transposed view, partial, at gathered positions and on MLA's key shared by every head, and the loss at
GPT-2's vocabularies (50257 odd, 50304 padded) over several chunks with ignored rows and z-loss. Then the loss as
the GPU runs it (kernels.loss_chunks): its head gradient one fp32-output addmm per chunk, at GPT-2 small's shape
against F.linear + F.cross_entropy in time and memory, and the kernels compiled by Inductor (CUDA graphs too).

The verdict (`assert_as_accurate`): each output and gradient is held against the float64 truth (the reference run on
float64 inputs), and the kernel's worst error may be at most twice the reference's own in the same dtype, or a few
roundings of that dtype at the tensor's scale. A fixed bf16 tolerance would not do: the reference rounds some
intermediates to bf16, and over 8k rows a weight gradient's sum drifts by more than any single-op tolerance.

The checks are functions of (device, sizes), so test_cpu_interpreter_runs_every_check runs each of them here, at
toy sizes in Triton's interpreter (a fresh process: the interpreter is chosen when triton is imported).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ablate import kernels
from ablate.kernels import reference

gpu = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16]
DTYPE_IDS = ["fp32", "bf16"]


def random(*shape, device, dtype, seed, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).to(device, dtype)


def outputs_and_grads(fn, inputs, grad_dtype=None):
    """fn's output and the gradients of every input, for one fixed random output gradient: rounded to `grad_dtype`
    (the dtype under test, so that the float64 truth sees the same values), then cast to the output's dtype."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    out = fn(*leaves)
    grad_out = random(*out.shape, device=out.device, dtype=grad_dtype or out.dtype, seed=99).to(out.dtype)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad_out)]


# The smallest worst error always allowed, as a share of the tensor's largest value: two bf16 roundings there; for
# float32, sums over 8k rows in another order (a kernel's per-program partial sums against torch's tree reductions).
ERROR_FLOOR = {torch.float32: 2e-5, torch.bfloat16: 2 * 2**-7}


def assert_as_accurate(got, ref, truth, what=""):
    """Each tensor of `got` (the kernel) is within max(2 x the reference's worst error, ERROR_FLOOR x the tensor's
    largest value) of the float64 truth."""
    for i, (g, r, t) in enumerate(zip(got, ref, truth)):
        assert g.shape == t.shape and g.dtype == r.dtype, f"{what}[{i}]: {g.shape} {g.dtype} vs {t.shape} {r.dtype}"
        t = t.double()
        scale = t.abs().max().item() or 1.0
        floor = ERROR_FLOOR[g.dtype] * scale
        err_got = (g.double() - t).abs().max().item()
        err_ref = (r.double() - t).abs().max().item()
        assert err_got <= max(2 * err_ref, floor), (
            f"{what}[{i}]: kernel's worst error {err_got:.3g}, the reference's {err_ref:.3g}, floor {floor:.3g}"
        )


def compare_with_reference(triton_fn, reference_fn, inputs, what):
    """The Triton kernel and the reference in the inputs' dtype, both against the reference in float64."""
    got = outputs_and_grads(triton_fn, inputs)
    ref = outputs_and_grads(reference_fn, inputs)
    truth = outputs_and_grads(reference_fn, [x.double() for x in inputs], grad_dtype=inputs[0].dtype)
    assert_as_accurate(got, ref, truth, what)


# ---------------------------------------------------------------------------------------------------------------
# the checks: each builds its inputs on `device` at the given sizes


def check_rms_norm(device, rows, width, dtype):
    x = random(rows, width, device=device, dtype=dtype, seed=0, scale=2.0)
    w = random(width, device=device, dtype=dtype, seed=1, scale=0.2, offset=1.0)
    compare_with_reference(
        lambda a, b: kernels.rms_norm(a, b, 1e-5, "triton"),
        lambda a, b: reference.rms_norm(a, b, 1e-5),
        (x, w),
        f"rms_norm {rows}x{width} {dtype}",
    )


def check_swiglu(device, rows, width, dtype):
    gate = random(rows, width, device=device, dtype=dtype, seed=0, scale=3.0)
    up = random(rows, width, device=device, dtype=dtype, seed=1)
    compare_with_reference(
        lambda a, b: kernels.swiglu(a, b, "triton"), reference.swiglu, (gate, up), f"swiglu {rows}x{width} {dtype}"
    )


def rope_inputs(kind, device, dtype, batch, heads, seq, dim):
    """(x, cos, sin) as the model passes them: "transposed": the (B, S, H, D) projection seen as (B, H, S, D);
    "partial": a quarter of each head rotates; "gathered": tables (B, 1, S, D/2) at each row's own positions (the eval
    engine's); "mla_key": MLA's rotary key, a (B, 1, S, D) slice of a wider projection shared by every head."""
    from ablate.model import rope_tables

    cos, sin = rope_tables(dim, dim // 4 if kind == "partial" else dim, 2 * seq, 10000.0)
    cos, sin = cos.to(device), sin.to(device)
    if kind == "transposed":
        x = random(batch, seq, heads, dim, device=device, dtype=dtype, seed=0).transpose(1, 2)
    elif kind == "mla_key":
        x = random(batch, seq, 4 * dim + dim, device=device, dtype=dtype, seed=0)[..., 4 * dim :][:, None]
    else:
        x = random(batch, heads, seq, dim, device=device, dtype=dtype, seed=0)
    if kind == "gathered":
        starts = torch.arange(batch, device=device)[:, None] * 7 % seq
        positions = starts + torch.arange(seq, device=device)
        cos, sin = cos[positions][:, None], sin[positions][:, None]
    return x, cos, sin


def check_rope(device, kind, dtype, batch, heads, seq, dim):
    x, cos, sin = rope_inputs(kind, device, dtype, batch, heads, seq, dim)
    tables = (cos, sin)
    got = outputs_and_grads(lambda a: kernels.apply_rope(a, *tables, kernels="triton"), [x])
    ref = outputs_and_grads(lambda a: reference.apply_rope(a, *tables), [x])
    truth = outputs_and_grads(lambda a: reference.apply_rope(a, *tables), [x.double()], grad_dtype=dtype)
    assert_as_accurate(got, ref, truth, f"rope {kind} {tuple(x.shape)} {dtype}")
    if kind == "partial":  # the dims past the rotary part pass through untouched
        rotary = 2 * cos.shape[-1]
        assert torch.equal(got[0][..., rotary:], x[..., rotary:])


def loss_inputs(device, dtype, rows, width, vocab):
    hidden = random(rows, width, device=device, dtype=dtype, seed=0)
    weight = random(vocab, width, device=device, dtype=dtype, seed=1, scale=0.05)
    targets = torch.randint(0, vocab, (rows,), generator=torch.Generator().manual_seed(2)).to(device)
    targets[::7] = -100  # ignored rows, in every chunk
    targets[-1] = vocab - 1  # the last column of the padded vocabulary
    return hidden, weight, targets


def full_logits_loss(hidden, weight, targets, z_loss):
    """The formula, on whole logits: what the chunked versions must reproduce."""
    logits = (hidden @ weight.T).double()
    keep = targets != -100
    ce = F.cross_entropy(logits, targets, ignore_index=-100)
    return ce + z_loss * torch.logsumexp(logits[keep], -1).square().mean(), ce.detach()


def check_linear_cross_entropy(device, dtype, rows, width, vocab, chunk_rows=None, z_loss=1e-4, chunks=None):
    """Loss, cross-entropy and both gradients of the Triton loss over rows // chunk_rows chunks (or `chunks` chunks),
    against the chunked reference in the same dtype and the full-logits formula in float64."""
    hidden, weight, targets = loss_inputs(device, dtype, rows, width, vocab)

    def run(fn, h, w):
        h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
        loss, ce = fn(h, w)
        return [loss.detach().double(), ce.double(), *torch.autograd.grad(loss, (h, w))]

    def triton_loss(h, w):
        return kernels.linear_cross_entropy(h, w, targets, -100, z_loss, chunk_rows, "triton", chunks=chunks)

    got = run(triton_loss, hidden, weight)
    ref = run(
        lambda h, w: reference.linear_cross_entropy(h, w, targets, -100, z_loss, chunk_rows, chunks=chunks),
        hidden,
        weight,
    )
    truth = run(lambda h, w: full_logits_loss(h, w, targets, z_loss), hidden.double(), weight.double())
    assert not got[1].requires_grad
    # the losses are float32 sums on both sides: compare them at float32's rounding, the gradients at the dtype's
    assert_as_accurate([g.float() for g in got[:2]], [r.float() for r in ref[:2]], truth[:2], f"loss {vocab}")
    assert_as_accurate(got[2:], ref[2:], truth[2:], f"loss grads {vocab} {dtype}")


def loss_kernel_launches(device, rows, width, vocab, chunks=None):
    """CUDA kernels launched by one forward + backward of the Triton loss, as torch.profiler counts them."""
    from torch.profiler import ProfilerActivity, profile

    hidden, weight, targets = loss_inputs(device, torch.bfloat16, rows, width, vocab)
    hidden.requires_grad_(), weight.requires_grad_()

    def step():
        loss, _ = kernels.linear_cross_entropy(hidden, weight, targets, -100, 1e-4, kernels="triton", chunks=chunks)
        loss.backward()

    step()  # compile and autotune outside the count
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


class OpsSeen(TorchDispatchMode):
    """(op, shape of its first argument) of every aten op dispatched."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((str(func), tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else None))
        return func(*args, **(kwargs or {}))


def check_head_gradient(device, rows, width, vocab, chunks):
    """bf16, `chunks` chunks: where reference.fused_head_gradient (eager CUDA, a torch that can), each chunk adds
    into the fp32 head gradient with one addmm writing fp32, no bf16 product and no separate add; the head gradient
    at least as accurate (against float64) as the bf16 product + fp32 add it replaces."""
    hidden, weight, targets = loss_inputs(device, torch.bfloat16, rows, width, vocab)

    def head_gradient(fused):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(reference, "fused_head_gradient", lambda d: fused)
            w = weight.detach().requires_grad_()
            with OpsSeen() as seen:
                loss, _ = kernels.linear_cross_entropy(hidden, w, targets, -100, 1e-4, kernels="triton", chunks=chunks)
            return torch.autograd.grad(loss, w)[0], seen.ops

    fused = reference.fused_head_gradient(torch.device(device))
    got, ops = head_gradient(fused)
    weight_sized_adds = ops.count(("aten.add_.Tensor", (vocab, width)))
    if fused:
        assert ops.count(("aten.addmm.dtype_out", (vocab, width))) == chunks and weight_sized_adds == 0, ops
    else:
        assert weight_sized_adds == chunks, ops
    unfused, _ = head_gradient(False)
    w64 = weight.double().requires_grad_()
    truth = torch.autograd.grad(full_logits_loss(hidden.double(), w64, targets, 1e-4)[0], w64)[0]
    assert_as_accurate([got], [unfused], [truth], f"head gradient {rows}x{width}->{vocab}")


def head_and_loss_cost(rows, width, vocab, chunks, repeats=10):
    """(median ms, peak bytes above the inputs) of forward + backward, bf16: the Triton loss in `chunks` chunks, and
    F.linear + F.cross_entropy on whole logits (fp32 for the loss, as autocast does)."""
    hidden, weight, targets = loss_inputs("cuda", torch.bfloat16, rows, width, vocab)
    hidden.requires_grad_(), weight.requires_grad_()

    def chunked():
        kernels.linear_cross_entropy(hidden, weight, targets, kernels="triton", chunks=chunks)[0].backward()

    def full_logits():
        F.cross_entropy(F.linear(hidden, weight).float(), targets).backward()

    costs = {}
    for name, step in (("chunked", chunked), ("full logits", full_logits)):
        step()  # compile, autotune, cuBLAS workspaces: outside the measurements
        hidden.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            hidden.grad = weight.grad = None
        costs[name] = (sorted(times)[repeats // 2], torch.cuda.max_memory_allocated() - base)
    return costs


# ---------------------------------------------------------------------------------------------------------------
# on the GPU, at real shapes


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("width", [32, 200, 768, 2048, 4096, 5120, 8192, 16384])
def test_rms_norm_on_8k_rows(width, dtype):
    check_rms_norm("cuda", 8192, width, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_swiglu_at_8k_by_11008(dtype):
    check_swiglu("cuda", 8192, 11008, dtype)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kind", ["transposed", "partial", "gathered", "mla_key"])
def test_rope_at_2x32x2048x128(kind, dtype):
    check_rope("cuda", kind, dtype, batch=2, heads=32, seq=2048, dim=128)


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("vocab", [50257, 50304])
def test_loss_at_gpt2_vocabularies_over_several_chunks(vocab, dtype):
    check_linear_cross_entropy("cuda", dtype, rows=4096, width=768, vocab=vocab, chunk_rows=512)  # 8 chunks


@gpu
def test_the_loss_launches_a_bounded_number_of_kernels():
    """8k tokens x d2048 x vocab 50304: the torch reference's CPU-cache blocks (5 rows at this vocab) launched tens of
    thousands of kernels (issue 26); the Triton loss step is one kernel per chunk beside the chunk's matmuls and sums
    (~25 chunks of 334 rows here: under 400 launches, where the 5-row blocks gave over 40,000 aten ops)."""
    rows, width, vocab = 8192, 2048, 50304
    launches = loss_kernel_launches("cuda", rows, width, vocab)
    chunks = -(-rows // reference.default_chunk_rows(rows, width, vocab))
    print(f"CUDA kernels in one forward + backward of the loss: {launches} over {chunks} chunks")
    # a dozen a chunk (its matmuls, the loss step, sums, the gradients' copies), against ~10 per 5-row block before
    assert launches < 12 * chunks + 50


@gpu
def test_the_gpu_chunks_launch_under_a_hundred_kernels():
    """The same loss in loss_chunks' chunks for 80 GiB free (4 here, not the CPU rule's ~25): about a dozen launches
    a chunk."""
    rows, width, vocab = 8192, 2048, 50304
    chunks = kernels.loss_chunks(rows, width, vocab, "cuda", 80 * 2**30)
    launches = loss_kernel_launches("cuda", rows, width, vocab, chunks)
    print(f"CUDA kernels in one forward + backward of the loss: {launches} over {chunks} chunks")
    assert chunks == 4 and launches < 12 * chunks + 50


@gpu
@pytest.mark.parametrize("vocab", [50257, 50304])
def test_loss_in_the_gpu_chunks(vocab):
    check_linear_cross_entropy("cuda", torch.bfloat16, rows=4096, width=768, vocab=vocab, chunks=4)


@gpu
def test_the_head_gradient_is_one_fp32_addmm_per_chunk():
    """This torch's CUDA addmm takes bf16 factors into the fp32 accumulator (else the loss falls back to a bf16
    product and a separate fp32 add per chunk: say so here)."""
    assert reference.addmm_takes_fp32_accumulator(torch.device("cuda")), f"torch {torch.__version__} refuses"
    check_head_gradient("cuda", rows=4096, width=768, vocab=50304, chunks=4)


@gpu
@pytest.mark.slow
def test_gpt2_small_head_and_loss_as_fast_as_full_logits_in_a_quarter_of_the_memory():
    """16 x 1024 tokens x d768 -> vocab 50304, bf16, in the chunks loss_chunks picks for this GPU's free memory:
    no slower than F.linear + F.cross_entropy (10% allowed for timing noise), at most 25% of its peak memory."""
    rows, width, vocab = 16 * 1024, 768, 50304
    chunks = kernels.loss_chunks(rows, width, vocab, "cuda", torch.cuda.mem_get_info()[0])
    costs = head_and_loss_cost(rows, width, vocab, chunks)
    (ours_ms, ours_bytes), (full_ms, full_bytes) = costs["chunked"], costs["full logits"]
    print(
        f"{chunks} chunks: {ours_ms:.2f} ms, {ours_bytes / 2**30:.2f} GiB; full logits: {full_ms:.2f} ms, "
        f"{full_bytes / 2**30:.2f} GiB ({ours_ms / full_ms:.2f}x the time, {ours_bytes / full_bytes:.1%} the memory)"
    )
    assert ours_bytes <= 0.25 * full_bytes
    assert ours_ms <= 1.1 * full_ms


@gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["inductor", "cuda-graphs"])
def test_inductor_compiles_the_loss_and_a_block_with_their_kernels(mode):
    """torch.compile (Inductor; and CUDA graphs) of the Triton loss in 4 chunks and of a block using RMSNorm, RoPE
    and SwiGLU with kernels="triton": the kernels launched from the compiled code, eager's numbers."""
    from ablate.config import ModelConfig
    from ablate.model import Block, rope_tables

    torch._dynamo.reset()
    hidden, weight, targets = loss_inputs("cuda", torch.bfloat16, 2048, 768, 50304)
    cfg = ModelConfig(vocab_size=512, d_model=256, n_heads=4, qk_norm=True, kernels="triton")
    block = Block(cfg, use_rope=True).to("cuda", torch.bfloat16)
    cos, sin = (t.to("cuda") for t in rope_tables(64, 64, 128, 10000.0))
    x = random(4, 128, 256, device="cuda", dtype=torch.bfloat16, seed=3)

    def loss(h, w):  # (1,): outputs_and_grads draws an output gradient of the output's shape
        return kernels.linear_cross_entropy(h, w, targets, -100, 1e-4, kernels="triton", chunks=4)[0][None]

    for fn, inputs in ((loss, (hidden, weight)), (lambda a: block(a, cos, sin), (x,))):
        compiled = torch.compile(fn, fullgraph=True, mode=mode)
        for _ in range(3):  # CUDA graphs: warm up, record, replay
            torch.compiler.cudagraph_mark_step_begin()
            got = [t.clone() for t in outputs_and_grads(compiled, inputs)]
        want = outputs_and_grads(fn, inputs)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------------------------
# here: every check above at toy sizes in Triton's interpreter, so a broken check fails on CPU first

INTERPRETED_CHECKS = """
import torch, test_gpu_kernels as t
for dtype in (torch.float32, torch.bfloat16):
    for width in (32, 200):
        t.check_rms_norm("cpu", 9, width, dtype)
    t.check_swiglu("cpu", 5, 300, dtype)
    for kind in ("transposed", "partial", "gathered", "mla_key"):
        t.check_rope("cpu", kind, dtype, batch=2, heads=3, seq=6, dim=8)
    for vocab in (97, 130):
        t.check_linear_cross_entropy("cpu", dtype, rows=24, width=16, vocab=vocab, chunk_rows=7)
        t.check_linear_cross_entropy("cpu", dtype, rows=24, width=16, vocab=vocab, chunks=4)
t.check_head_gradient("cpu", rows=24, width=16, vocab=97, chunks=4)
print("every check passed")
"""


@pytest.mark.slow  # every kernel check in a fresh interpreter process: the whole suite runs it
def test_cpu_interpreter_runs_every_check():
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tests)}
    result = subprocess.run(
        [sys.executable, "-c", INTERPRETED_CHECKS], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0 and "every check passed" in result.stdout, result.stderr[-4000:]


def test_the_checks_catch_a_wrong_kernel():
    """assert_as_accurate fails a kernel that is off by more than rounding (here: 5% too large), passes the
    reference itself."""
    x = random(64, 32, device="cpu", dtype=torch.bfloat16, seed=0)
    w = random(32, device="cpu", dtype=torch.bfloat16, seed=1, offset=1.0)
    with pytest.raises(AssertionError, match="kernel's worst error"):
        compare_with_reference(
            lambda a, b: reference.rms_norm(a, b * 1.05, 1e-5), lambda a, b: reference.rms_norm(a, b, 1e-5), (x, w), ""
        )
    compare_with_reference(
        lambda a, b: reference.rms_norm(a, b, 1e-5), lambda a, b: reference.rms_norm(a, b, 1e-5), (x, w), ""
    )


def test_tests_that_are_not_marked_gpu_see_no_gpu():
    """tests/conftest.py pins every test not marked gpu to CPU, here and in the processes it starts (issue 26, 13)."""
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
