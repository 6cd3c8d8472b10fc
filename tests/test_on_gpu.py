"""What only a CUDA GPU can show (marked gpu: skipped, saying so, where none is visible; see conftest.py).

On CPU the kernels are checked in Triton's interpreter and built ahead of time for sm_80/sm_90 (test_kernels.py);
here they are compiled and launched for real, and a short run on the GPU is held against the same run on CPU.
"""

import pytest
import torch

from ablate import kernels
from ablate.kernels import reference

pytestmark = pytest.mark.gpu


def _leaf(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to("cuda", dtype).requires_grad_()


def _forward_backward(fn, inputs):
    out = fn(*inputs)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    return out, torch.autograd.grad(out, inputs, grad_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_kernels_match_their_references(dtype):
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    x, w = _leaf(3, 5, 96, dtype=dtype), _leaf(96, dtype=dtype, seed=2)
    cases = [
        (lambda a, b: kernels.rms_norm(a, b, 1e-6, "triton"), lambda a, b: reference.rms_norm(a, b, 1e-6), (x, w)),
        (lambda a, b: kernels.swiglu(a, b, "triton"), reference.swiglu, (x, _leaf(3, 5, 96, dtype=dtype, seed=3))),
    ]
    for triton_fn, reference_fn, inputs in cases:
        got, got_grads = _forward_backward(triton_fn, inputs)
        want, want_grads = _forward_backward(reference_fn, inputs)
        torch.testing.assert_close(got, want, **tol)
        for g, r in zip(got_grads, want_grads):
            torch.testing.assert_close(g, r, **tol)


def test_linear_cross_entropy_matches_its_reference():
    hidden, weight = _leaf(40, 64, dtype=torch.float32), _leaf(1000, 64, dtype=torch.float32, seed=4)
    targets = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(5)).to("cuda")
    targets[3] = -100
    got = kernels.linear_cross_entropy(hidden, weight, targets, z_loss=1e-4, kernels="triton")[0]
    want = reference.linear_cross_entropy(hidden, weight, targets, z_loss=1e-4)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    grads = torch.autograd.grad(got, (hidden, weight))
    want_grads = torch.autograd.grad(want, (hidden, weight))
    for g, r in zip(grads, want_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_a_short_fp32_run_on_the_gpu_follows_the_cpu_run(tmp_path):
    """The tiny experiment once per device, each in its own `ablate run` process (a process group is per device)."""
    import json

    from conftest import TINY, run_cli

    def run_on(device):
        out = tmp_path / device
        run_cli(
            "run",
            str(TINY),
            "--only",
            "mha",
            "--out",
            str(out),
            "--set",
            f"train.device={device}",
            "--set",
            "train.dtype=fp32",
        )
        return json.loads((out / "tiny" / "mha" / "seed0" / "summary.json").read_text())

    cpu, gpu = run_on("cpu"), run_on("cuda")
    # same data, same initial weights (made on CPU, rank 0); only the kernels' order of sums differs
    assert gpu["final_loss"] == pytest.approx(cpu["final_loss"], rel=1e-3)
    assert gpu["final_val_loss"] == pytest.approx(cpu["final_val_loss"], rel=1e-3)


@pytest.mark.parametrize("compiled", [False, True])
def test_an_ordinary_step_never_waits_for_the_gpu(tmp_path, compiled):
    """CUDA's sync debug mode raises on any host sync: none in an ordinary step of a bf16 run (default callbacks,
    log_every 100), eager or compiled as one graph; a non-finite step is skipped on the device and counted once its
    figures are read."""
    import math

    from conftest import tiny_trainer

    fields = {"train.device": "cuda", "train.dtype": "bf16", "train.compile": compiled, "train.max_steps": 20}
    trainer = tiny_trainer(tmp_path, **fields)
    trainer.train_step()  # the first step: the compile, the optimizer's state, the allocator's first blocks
    torch.cuda.synchronize()
    try:
        torch.cuda.set_sync_debug_mode("error")
        for _ in range(3):
            trainer.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    loss = trainer.model.loss
    trainer.model.loss = lambda *args, **kwargs: tuple(x * math.nan for x in loss(*args, **kwargs))
    trainer.train_step()
    trainer.model.loss = loss
    trainer.settle()
    assert trainer.skipped_steps == 1 and trainer.step == 5
    assert all(torch.equal(w, p) for w, p in zip(weights, trainer.model.parameters()))
