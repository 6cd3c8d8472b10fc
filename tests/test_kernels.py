"""Every Triton kernel against its torch reference in Triton's CPU interpreter (forward and backward, fp32 and bf16,
shapes with non-power-of-two widths and masked tails), the dispatch switch, the model trained end to end with
kernels="triton" against kernels="torch", and each kernel under torch.compile(fullgraph=True): launched from the
compiled graphs (triton_kernel_wrapper nodes, no opaque ablate:: op), with eager's numbers.

Tolerances, as torch.testing.assert_close(actual=Triton, expected=reference):
  fp32: rtol=1e-5, atol=1e-5   both sides compute in fp32; only the order of sums differs.
  bf16: rtol=2e-2, atol=2e-2   the kernels compute in fp32 and round once to bf16, the references round some
                               intermediates to bf16 too: results differ by up to ~2 bf16 ulps (1 ulp = 2^-8..2^-7).
"""

import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

# Triton decides interpreter or compiler per @triton.jit function when it is defined: its own standard library
# (tl.sum, tl.sigmoid, ...) when triton is imported, our kernels when their modules are, and more of triton on the
# first launch. So TRITON_INTERPRET=1 is set before both imports, put back afterwards so that the rest of the
# session is unaffected, and set again around every test of this file (the autouse `interpret` fixture).
if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    raise ImportError(
        "triton was imported before tests/test_kernels.py could set TRITON_INTERPRET=1; run this file "
        "in its own process: python -m pytest tests/test_kernels.py"
    )
_saved = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from ablate.kernels import (  # noqa: E402
    cross_entropy_triton,
    reference,
    rmsnorm_triton,
    rope_triton,
    swiglu_triton,
)

if _saved is None:
    del os.environ["TRITON_INTERPRET"]
else:
    os.environ["TRITON_INTERPRET"] = _saved

from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.aot_autograd import make_boxed_func  # noqa: E402
from torch._higher_order_ops.triton_kernel_wrap import (  # noqa: E402
    kernel_side_table,
    triton_kernel_wrapper_functional,
    triton_kernel_wrapper_mutation,
)

from ablate import kernels  # noqa: E402
from ablate.config import ModelConfig, RunConfig, validate  # noqa: E402
from ablate.model import Transformer, rope_tables  # noqa: E402

assert not isinstance(rmsnorm_triton.rms_norm_fwd_kernel, triton.runtime.JITFunction)


def triton_language_state() -> dict:
    """The attributes that Triton's interpreter swaps for its own builtins while it runs a kernel, and leaves swapped
    after a call from interpreted code (tl.sum's tl.core.reduce, ...): no compiled code can be generated after that."""
    tl = triton.language
    owners = (tl, tl.core, tl.math, tl.core.tensor, getattr(tl.core, "tensor_descriptor_base", tl.core.tensor))
    return {owner: dict(vars(owner)) for owner in owners}


PRISTINE_TRITON_LANGUAGE = triton_language_state()  # no kernel has run yet

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def leaf(*shape, dtype, scale=1.0, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + offset).to(dtype).requires_grad_()


def forward_backward(fn, inputs, seed=1):
    """Outputs and input gradients of fn for a fixed random output gradient."""
    out = fn(*inputs)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return out, torch.autograd.grad(out, inputs, grad_out)


def assert_matches(actual, expected, dtype):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 96), (3, 7, 40), (2, 130)])  # row/column tails; widths 40, 96, 130
def test_rms_norm(shape, dtype):
    x = leaf(*shape, dtype=dtype, scale=2.0)
    w = leaf(shape[-1], dtype=dtype, scale=0.2, offset=1.0, seed=2)
    out, grads = forward_backward(lambda a, b: rmsnorm_triton.rms_norm(a, b, 1e-5), (x, w))
    ref_out, ref_grads = forward_backward(lambda a, b: reference.rms_norm(a, b, 1e-5), (x, w))
    assert_matches(out, ref_out, dtype)
    for g, r in zip(grads, ref_grads):
        assert_matches(g, r, dtype)


def test_rms_norm_widths_beyond_the_kernel_are_refused():
    with pytest.raises(NotImplementedError, match="model.kernels='torch'"):
        rmsnorm_triton.launch_config(rmsnorm_triton.MAX_WIDTH + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 96), (3, 700)])  # 480 and 2100 elements: one and three blocks of 1024
def test_swiglu(shape, dtype):
    gate, up = leaf(*shape, dtype=dtype, scale=3.0), leaf(*shape, dtype=dtype, seed=2)
    out, grads = forward_backward(swiglu_triton.swiglu, (gate, up))
    ref_out, ref_grads = forward_backward(reference.swiglu, (gate, up))
    assert_matches(out, ref_out, dtype)
    for g, r in zip(grads, ref_grads):
        assert_matches(g, r, dtype)


def rope_case(kind):
    """(x (B, H, S, D), cos, sin): full rotation of a transposed (B, S, H, D) view; partial rotation whose pairs
    span an odd 3 dims per half; tables gathered per batch row at arbitrary positions, as the eval engine passes."""
    if kind == "full":
        cos, sin = rope_tables(12, 12, 16, 10000.0)
        return leaf(2, 5, 3, 12, dtype=torch.float32).detach().transpose(1, 2), cos, sin
    if kind == "partial":
        cos, sin = rope_tables(12, 6, 16, 10000.0)
        return leaf(2, 3, 5, 12, dtype=torch.float32).detach(), cos, sin
    cos, sin = rope_tables(10, 10, 32, 10000.0)
    positions = torch.tensor([[3, 4, 5, 9, 10, 11, 12], [0, 1, 2, 3, 20, 21, 22]])
    return leaf(2, 2, 7, 10, dtype=torch.float32).detach(), cos[positions][:, None], sin[positions][:, None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["full", "partial", "gathered"])
def test_rope(kind, dtype):
    x, cos, sin = rope_case(kind)
    x = x.to(dtype).requires_grad_()
    out, (grad,) = forward_backward(lambda a: rope_triton.apply_rope(a, cos, sin), (x,))
    ref_out, (ref_grad,) = forward_backward(lambda a: reference.apply_rope(a, cos, sin), (x,))
    assert_matches(out, ref_out, dtype)
    assert_matches(grad, ref_grad, dtype)
    if kind == "partial":  # the tail dims pass through untouched
        assert torch.equal(out[..., 6:], x[..., 6:])


def naive_linear_cross_entropy(hidden, weight, targets, ignore_index, z_loss):
    """The full-logits formula the chunked versions must reproduce."""
    logits = (hidden @ weight.T).float()
    ce = F.cross_entropy(logits, targets, ignore_index=ignore_index)
    lse = torch.logsumexp(logits[targets != ignore_index], dim=-1)
    return ce + z_loss * lse.square().mean(), ce.detach()


def lce_case(vocab, dtype, n=30, width=40):
    hidden = leaf(n, width, dtype=dtype)
    weight = leaf(vocab, width, dtype=dtype, scale=0.3, seed=2)
    targets = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(3))
    targets[[3, n // 2, n - 1]] = -100  # ignored rows, the last in the masked tail chunk
    return hidden, weight, targets


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab,z_loss", [(97, 0.0), (97, 1e-2), (4099, 1e-2)])  # 4099: two vocab blocks, a tail
def test_linear_cross_entropy(vocab, z_loss, dtype):
    n = 30 if vocab < 1000 else 6
    hidden, weight, targets = lce_case(vocab, dtype, n=n)
    chunk = 7 if n == 30 else 4  # chunks of 7 rows: the last one is a masked tail of 2
    (loss, ce), grads = forward_backward_loss(
        cross_entropy_triton.linear_cross_entropy, hidden, weight, targets, z_loss, chunk
    )
    (ref_loss, ref_ce), ref_grads = forward_backward_loss(
        reference.linear_cross_entropy, hidden, weight, targets, z_loss, chunk
    )
    # the losses are fp32 sums of fp32 row losses on both sides, whatever the logits' dtype
    torch.testing.assert_close(loss, ref_loss, **TOL[torch.float32])
    torch.testing.assert_close(ce, ref_ce, **TOL[torch.float32])
    assert not ce.requires_grad
    for g, r in zip(grads, ref_grads):
        assert_matches(g, r, dtype)


def forward_backward_loss(fn, hidden, weight, targets, z_loss, chunk_rows):
    loss, ce = fn(hidden, weight, targets, -100, z_loss, chunk_rows)
    return (loss, ce), torch.autograd.grad(loss, (hidden, weight))


@pytest.mark.parametrize("z_loss", [0.0, 1e-2])
def test_chunked_reference_equals_full_logits(z_loss):
    hidden, weight, targets = lce_case(97, torch.float32)
    loss, ce = reference.linear_cross_entropy(hidden, weight, targets, -100, z_loss, chunk_rows=7)
    grads = torch.autograd.grad(loss, (hidden, weight))
    naive_loss, naive_ce = naive_linear_cross_entropy(hidden, weight, targets, -100, z_loss)
    naive_grads = torch.autograd.grad(naive_loss, (hidden, weight))
    torch.testing.assert_close(loss, naive_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ce, naive_ce, rtol=1e-6, atol=1e-6)
    for g, r in zip(grads, naive_grads):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # no gradient work when none is asked for, same numbers
        assert torch.equal(reference.linear_cross_entropy(hidden, weight, targets, -100, z_loss, 7)[0], loss)


def test_chunked_loss_step_writes_the_logit_gradient():
    logits = torch.randn(4, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    targets = torch.tensor([2, -100, 10, 0])
    z_loss = 0.1
    lse = torch.logsumexp(logits, -1)
    keep = targets != -100
    total = F.cross_entropy(logits, targets, reduction="sum") + z_loss * lse[keep].square().sum()
    (expected,) = torch.autograd.grad(total, logits)
    buffer = logits.detach().clone()
    ce_rows, z_rows = reference.cross_entropy_chunk(buffer, targets, -100, z_loss, write_grad=True)
    # the step computes in fp32 whatever the logits' dtype: ~1e-7 off float64's truth (float64's default tolerance
    # failed for 0.7% of the global RNG's draws, which depend on the tests run before)
    torch.testing.assert_close(buffer, expected, rtol=1e-6, atol=1e-6)
    assert ce_rows[1] == 0 and z_rows[1] == 0 and torch.all(buffer[1] == 0)


def test_dispatch_picks_triton_only_when_it_can_run(monkeypatch):
    x = torch.zeros(2)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels.use_triton("torch", x) and not kernels.use_triton("triton", x)  # CPU: the references
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.use_triton("triton", x) and not kernels.use_triton("torch", x)
    with pytest.raises(ValueError, match="allowed: 'auto', 'torch', 'triton'"):
        kernels.use_triton("cuda", x)


def tiny_model(kernels_choice, **knobs):
    knobs = {"n_kv_heads": 2, **knobs}
    cfg = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=4, kernels=kernels_choice, **knobs)
    validate(RunConfig(model=cfg))
    model = Transformer(cfg, max_seq_len=16)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


@pytest.mark.parametrize(
    "knobs",
    [
        dict(qk_norm=True, rope_fraction=0.5, z_loss=1e-3),
        # MLA: RoPE on a key shared by the heads (a broadcast view), norms on both latents; MoE: SwiGLU per expert
        dict(n_kv_heads=None, attention="mla", q_lora_rank=16, kv_lora_rank=16, qk_rope_dim=4),
        dict(ffn="moe", moe_experts=4, moe_shared_experts=1, moe_hidden=32),
    ],
    ids=["gqa", "mla", "moe"],
)
def test_model_trains_the_same_with_triton_kernels(knobs):
    """Five AdamW steps of a model using all four kernels (QK-norm, partial RoPE, SwiGLU, z-loss, GQA; MLA; MoE):
    kernels="triton" under the interpreter against kernels="torch", fp32. Losses agree to 1e-5 relative at every
    step."""
    models = {k: tiny_model(k, **knobs) for k in ("torch", "triton")}
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=3e-3) for k, m in models.items()}
    tokens = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    losses = {k: [] for k in models}
    for _ in range(5):  # one batch, seen again and again: the loss must fall
        for k, model in models.items():
            loss, ce = model.loss(tokens[:, :-1], tokens[:, 1:])
            loss.backward()
            optimizers[k].step()
            optimizers[k].zero_grad()
            losses[k].append(ce.item())
    print("losses torch :", losses["torch"], "\nlosses triton:", losses["triton"])
    assert losses["torch"][0] == pytest.approx(math.log(97), abs=0.3)
    assert losses["triton"] == pytest.approx(losses["torch"], rel=1e-5)
    assert losses["torch"][-1] < losses["torch"][0]
    with torch.no_grad():  # the logits path (eval) runs the kernels too
        torch.testing.assert_close(models["triton"](tokens), models["torch"](tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_trainer_runs_with_triton_kernels(tmp_path):
    """The whole training loop (FSDP2 on a 1-rank group, validation, checkpoints) with kernels="triton"."""
    from ablate.setup.experiment import load_experiment
    from ablate.training.run import train
    from conftest import TINY

    overrides = {"train.max_steps": "3", "train.val_every": "3", "train.ckpt_every": "3"}
    summaries = {
        k: train(load_experiment(TINY, only=["mha"], overrides={**overrides, "model.kernels": k})[0], tmp_path / k)
        for k in ("torch", "triton")
    }
    assert summaries["triton"]["steps"] == 3
    assert summaries["triton"]["final_loss"] == pytest.approx(summaries["torch"]["final_loss"], rel=1e-5)
    assert summaries["triton"]["final_val_loss"] == pytest.approx(summaries["torch"]["final_val_loss"], rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# under torch.compile: each kernel launched from the compiled graphs, with eager's numbers


class InterpretedJIT(triton.runtime.JITFunction):
    """A JITFunction that runs in Triton's interpreter. torch's tracing takes it for a kernel it can compile:
    wrap_triton puts its launches in the graph (an interpreted kernel it cannot trace), and the TTIR of its body
    tells which arguments it writes; running the graph, or a call from interpreted code, interprets it."""

    def __init__(self, interpreted: InterpretedFunction):
        super().__init__(interpreted.fn)
        self.interpreted = interpreted

    def run(self, *args, grid, warmup, **kwargs):  # a launch
        return self.interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)

    def __call__(self, *args, **kwargs):  # a call from an interpreted kernel: tl.sum, tl.sigmoid, ...
        return self.interpreted(*args, **kwargs)


@pytest.fixture
def traceable_kernels(monkeypatch):
    """For one test, every interpreted Triton function (our kernels, Triton's standard library) an InterpretedJIT,
    and sm_90 the target of torch's TTIR analysis (no GPU driver here): the analysis a GPU would make, on CPU."""
    for owner, attributes in PRISTINE_TRITON_LANGUAGE.items():  # what earlier interpreted runs left swapped
        for name, value in attributes.items():
            if name != "__annotations__" and vars(owner).get(name) is not value:
                setattr(owner, name, value)
    twins = {}
    triton_language = [module for name, module in sys.modules.items() if name.startswith("triton.language")]
    for module in [*triton_language, rmsnorm_triton, swiglu_triton, rope_triton, cross_entropy_triton]:
        for name, fn in list(vars(module).items()):
            if isinstance(fn, InterpretedFunction):
                if id(fn) not in twins:
                    twins[id(fn)] = InterpretedJIT(fn)
                monkeypatch.setattr(module, name, twins[id(fn)])
    sm90 = SimpleNamespace(get_current_target=lambda: GPUTarget("cuda", 90, 32))
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=sm90))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # the default; set to quiet Triton 3.9's notice about it


def recording_backend(graphs: list):
    """aot_eager that keeps the forward and backward graphs it runs (after AOTAutograd: triton_ops decomposed)."""

    def record(gm, example_inputs):
        graphs.append(gm.graph)
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record)


def launched(graphs) -> tuple[set[str], set[str]]:
    """(the ablate:: ops called opaquely, the Triton kernels launched) in the graphs."""
    opaque, kernel_names = set(), set()
    for graph in graphs:
        for node in (n for n in graph.nodes if n.op == "call_function"):
            if isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "ablate":
                opaque.add(str(node.target))
            if node.target in (triton_kernel_wrapper_functional, triton_kernel_wrapper_mutation):
                kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
                while hasattr(kernel, "fn"):  # an autotuner around the JITFunction around the Python function
                    kernel = kernel.fn
                kernel_names.add(kernel.__name__)
    return opaque, kernel_names


def compiled_against_eager(fn, inputs, kernel_names):
    """fn compiled (fullgraph) against fn eager: outputs and input gradients equal, and the graphs launch exactly
    `kernel_names`, no opaque op."""
    graphs = []
    compiled = torch.compile(fn, backend=recording_backend(graphs), fullgraph=True)
    out, grads = forward_backward(compiled, inputs)
    ref_out, ref_grads = forward_backward(fn, inputs)
    assert launched(graphs) == (set(), kernel_names)
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL[torch.float32])


def rms_norm_case():
    def fn(x, w):
        return kernels.rms_norm(x, w, 1e-5, "triton")

    inputs = leaf(5, 96, dtype=torch.float32), leaf(96, dtype=torch.float32, offset=1.0, seed=2)
    return fn, inputs, {"rms_norm_fwd_kernel", "rms_norm_bwd_kernel"}


def swiglu_case():
    def fn(gate, up):
        return kernels.swiglu(gate, up, "triton")

    inputs = leaf(3, 700, dtype=torch.float32), leaf(3, 700, dtype=torch.float32, seed=2)
    return fn, inputs, {"swiglu_fwd_kernel", "swiglu_bwd_kernel"}


def rope_case_compiled():
    cos, sin = rope_tables(12, 12, 16, 10000.0)

    def fn(x):  # the model's (B, S, H, D) projection seen as (B, H, S, D): the kernel reads it through its strides
        return kernels.apply_rope(x.transpose(1, 2), cos, sin, "triton")

    return fn, (leaf(2, 5, 3, 12, dtype=torch.float32),), {"rope_kernel"}


def loss_case_compiled():
    hidden, weight, targets = lce_case(97, torch.float32)

    def fn(h, w):  # the gradients are formed in forward: backward launches nothing
        return kernels.linear_cross_entropy(h, w, targets, -100, 1e-2, kernels="triton", chunks=3)[0]

    return fn, (hidden, weight), {"cross_entropy_chunk_kernel"}


@pytest.mark.parametrize("case", [rms_norm_case, swiglu_case, rope_case_compiled, loss_case_compiled])
def test_each_kernel_is_launched_from_the_compiled_graph(case, traceable_kernels):
    compiled_against_eager(*case())


def test_triton_block_compiles_fullgraph(traceable_kernels):
    """A block with QK-norm, RoPE and SwiGLU compiled as one graph: its kernels launched from it, forward and
    backward, and its output and gradients (input and weights) those of the torch reference's block."""
    from ablate.model import Block

    cfg = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=4, qk_norm=True, kernels="triton")
    block = Block(cfg, use_rope=True)
    eager = Block(ModelConfig(**{**cfg.__dict__, "kernels": "torch"}), use_rope=True)
    eager.load_state_dict(block.state_dict())
    cos, sin = rope_tables(12, 12, 16, 10000.0)
    x = torch.randn(2, 16, 48, requires_grad=True)

    def output_and_grads(module, weights_of):
        out = module(x, cos, sin)
        return [out, *torch.autograd.grad(out.sum(), (x, *weights_of.parameters()))]

    graphs = []
    got = output_and_grads(torch.compile(block, backend=recording_backend(graphs), fullgraph=True), block)
    want = output_and_grads(eager, eager)
    norms_and_rope = {"rms_norm_fwd_kernel", "rms_norm_bwd_kernel", "rope_kernel"}
    assert launched(graphs) == (set(), norms_and_rope | {"swiglu_fwd_kernel", "swiglu_bwd_kernel"})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL[torch.float32])


def test_auto_under_compile_leaves_the_norms_to_inductor_and_keeps_the_loss_kernel(traceable_kernels, monkeypatch):
    """kernels="auto" as on CUDA (resolved says "triton"): compiled, RMSNorm is the reference's aten ops (Inductor's
    to fuse), the loss still launches its Triton chunk kernel."""
    resolve = kernels.resolved
    monkeypatch.setattr(
        kernels, "resolved", lambda k, device_type: "triton" if k == "auto" else resolve(k, device_type)
    )
    hidden, weight, targets = lce_case(97, torch.float32)
    norm_weight = leaf(40, dtype=torch.float32, offset=1.0, seed=5)

    def step(h, w, nw):
        return kernels.linear_cross_entropy(kernels.rms_norm(h, nw, 1e-5, "auto"), w, targets, kernels="auto")[0]

    graphs = []
    compiled = torch.compile(step, backend=recording_backend(graphs), fullgraph=True)
    out, grads = forward_backward(compiled, (hidden, weight, norm_weight))
    assert launched(graphs) == (set(), {"cross_entropy_chunk_kernel"})
    ref_out, ref_grads = forward_backward(step, (hidden, weight, norm_weight))  # eager: both Triton kernels
    torch.testing.assert_close(out, ref_out, **TOL[torch.float32])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL[torch.float32])
