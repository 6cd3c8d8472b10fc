"""Every Triton kernel against its torch reference in Triton's CPU interpreter (forward and backward, fp32 and bf16,
shapes with non-power-of-two widths and masked tails), the dispatch switch, and the model trained end to end with
kernels="triton" against kernels="torch".

Tolerances, as torch.testing.assert_close(actual=Triton, expected=reference):
  fp32: rtol=1e-5, atol=1e-5   both sides compute in fp32; only the order of sums differs.
  bf16: rtol=2e-2, atol=2e-2   the kernels compute in fp32 and round once to bf16, the references round some
                               intermediates to bf16 too: results differ by up to ~2 bf16 ulps (1 ulp = 2^-8..2^-7).
"""

import math
import os
import sys

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

from ablate import kernels  # noqa: E402
from ablate.config import ModelConfig, RunConfig, validate  # noqa: E402
from ablate.model import Transformer, rope_tables  # noqa: E402

assert not isinstance(rmsnorm_triton.rms_norm_fwd_kernel, triton.runtime.JITFunction)

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
    logits = torch.randn(4, 11, dtype=torch.float64).requires_grad_()
    targets = torch.tensor([2, -100, 10, 0])
    z_loss = 0.1
    lse = torch.logsumexp(logits, -1)
    keep = targets != -100
    total = F.cross_entropy(logits, targets, reduction="sum") + z_loss * lse[keep].square().sum()
    (expected,) = torch.autograd.grad(total, logits)
    buffer = logits.detach().clone()
    ce_rows, z_rows = reference.cross_entropy_chunk(buffer, targets, -100, z_loss, write_grad=True)
    torch.testing.assert_close(buffer, expected)
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


def test_triton_block_compiles_fullgraph():
    """torch.compile traces the dispatch, the autograd Functions and the custom ops without a graph break."""
    from ablate.model import Block

    cfg = ModelConfig(vocab_size=97, d_model=48, n_layers=2, n_heads=4, qk_norm=True, kernels="triton")
    block = Block(cfg, use_rope=True)
    cos, sin = rope_tables(12, 12, 16, 10000.0)
    x = torch.randn(2, 16, 48, requires_grad=True)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    out = compiled(x, cos, sin)
    (grad,) = torch.autograd.grad(out.sum(), x)
    eager = Block(ModelConfig(**{**cfg.__dict__, "kernels": "torch"}), use_rope=True)
    eager.load_state_dict(block.state_dict())
    x_ref = x.detach().requires_grad_()
    out_ref = eager(x_ref, cos, sin)
    (grad_ref,) = torch.autograd.grad(out_ref.sum(), x_ref)
    torch.testing.assert_close(out, out_ref, **TOL[torch.float32])
    torch.testing.assert_close(grad, grad_ref, **TOL[torch.float32])
