"""The GPU path's decisions, checked on CPU: every "auto" (ablate.setup.auto, kernels.resolved), the process's GPU, the
peak table by exact name, the loss's op count with the GPU branch's blocking, and one host read per step."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate import kernels
from ablate.config import ConfigError, ModelConfig
from ablate.kernels import reference
from ablate.setup import auto
from ablate.setup.experiment import load_experiment
from ablate.setup.overrides import apply_overrides
from ablate.training.parallel import GPU_PEAKS, gpu_peak_flops, local_gpu_index
from conftest import TINY, tiny_trainer

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_kernels_auto_is_the_default_and_hashes_as_torch():
    assert ModelConfig().kernels == "auto"
    run = load_experiment(TINY, only=["mha"])[0]
    assert run.model.kernels == "auto"
    # run folders from before "auto" (kernels="torch" then the default) keep their identity, and resume
    assert run.identity() == apply_overrides(run, {"model.kernels": "torch"}).identity()
    assert run.identity() != apply_overrides(run, {"model.kernels": "triton"}).identity()


def test_kernels_resolve_to_triton_on_cuda_only(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert kernels.resolved("auto", "cpu") == "torch"
    assert kernels.resolved("torch", "cuda") == "torch"
    assert kernels.resolved("triton", "cpu") == "torch"  # the reference off CUDA, as before
    assert kernels.resolved("triton", "cuda") == "triton"
    assert kernels.resolved("auto", "cuda") == ("triton" if kernels.triton_installed() else "torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.resolved("triton", "cpu") == "triton" and kernels.resolved("auto", "cpu") == "torch"
    with pytest.raises(ValueError, match="allowed: 'auto', 'torch', 'triton'"):
        kernels.resolved("cuda", "cpu")


def test_compile_auto_on_cpu_for_long_bf16_runs_and_on_gpu_when_the_compile_is_a_tenth_of_the_run():
    long, short = auto.AUTO_COMPILE_SECONDS_AT_PEAK, auto.AUTO_COMPILE_SECONDS_AT_PEAK / 2
    assert auto.compile_blocks("auto", CPU, bf16=True, seconds_at_peak=long).on
    assert not auto.compile_blocks("auto", CPU, bf16=True, seconds_at_peak=short).on  # the compile would cost more
    assert not auto.compile_blocks("auto", CPU, bf16=False, seconds_at_peak=long).on  # fp32 stays eager: bit-exact
    assert auto.compile_blocks(True, CPU, bf16=False, seconds_at_peak=0).on
    assert not auto.compile_blocks(False, CPU, bf16=True, seconds_at_peak=long).on
    # GPU: the run's eager time is its seconds at peak over the eager MFU; compile when ~60 s is under a tenth
    at_boundary = auto.GPU_COMPILE_SECONDS / auto.GPU_COMPILE_SHARE * auto.GPU_EAGER_MFU
    on = auto.compile_blocks("auto", CUDA, bf16=True, seconds_at_peak=at_boundary * 1.01)
    off = auto.compile_blocks("auto", CUDA, bf16=True, seconds_at_peak=at_boundary * 0.99)
    assert on.on and "compiled" in on.why and not off.on and "too short" in off.why
    assert auto.compile_blocks("auto", CUDA, bf16=True, seconds_at_peak=1, float8=True).on  # float8 needs compile
    run = load_experiment(TINY, only=["mha"])[0]
    assert run.train.compile == "auto"
    assert run.identity() == apply_overrides(run, {"train.compile": False}).identity()  # hashes as before


def test_one_place_decides_device_dtype_kernels_and_compile():
    run = load_experiment(TINY, only=["mha"])[0]
    here = auto.for_run(run, CPU, seconds_at_peak=1.0)
    assert (here.device, here.bf16, here.kernels, here.compile.on) == (CPU, False, "torch", False)
    assert here.describe() == "cpu, fp32, torch kernels, eager"
    gpu = auto.for_run(run, CUDA, seconds_at_peak=1e6)  # a device type only: no GPU is touched
    assert gpu.bf16 and gpu.compute_dtype == torch.bfloat16 and gpu.compile.on
    if kernels.triton_installed():
        assert gpu.kernels == "triton" and "Inductor" in gpu.describe()
    fp32 = auto.for_run(apply_overrides(run, {"train.dtype": "fp32", "model.kernels": "torch"}), CUDA, 1.0)
    assert not fp32.bf16 and fp32.kernels == "torch" and not fp32.compile.on
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="allowed here: 'auto', 'cpu'"):
            auto.device("cuda")
        assert auto.eval_device("auto") == CPU


def test_a_process_takes_its_own_gpu_or_is_refused():
    assert [local_gpu_index(r, 4, 4, torchrun=True) for r in range(4)] == [0, 1, 2, 3]  # every GPU visible
    assert local_gpu_index(1, 2, 8, torchrun=True) == 1
    assert local_gpu_index(3, 4, 1, torchrun=False) == 0  # SLURM binds one GPU per task: each sees its own
    with pytest.raises(ConfigError, match="2 processes on this node but 1 GPU"):
        local_gpu_index(1, 2, 1, torchrun=True)  # torchrun on a 1-GPU host: two ranks would share cuda:0
    with pytest.raises(ConfigError, match="at most 2 processes per node"):
        local_gpu_index(2, 4, 2, torchrun=False)


def test_gpu_peaks_by_exact_name_and_dtype():
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12  # SXM
    assert gpu_peak_flops("NVIDIA H100 PCIe", torch.bfloat16) == 756e12  # not SXM's, as a substring match gave
    assert gpu_peak_flops("NVIDIA H100 NVL", torch.bfloat16) == 835e12
    assert gpu_peak_flops("NVIDIA L40S", torch.bfloat16) == 362e12 != gpu_peak_flops("NVIDIA L40", torch.bfloat16)
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.float32) == 495e12  # fp32 runs multiply in TF32
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3 (some new one)", torch.bfloat16) is None  # measured instead
    assert all(bf16 > tf32 > 0 for bf16, tf32 in GPU_PEAKS.values())


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("rows,width,vocab", [(8192, 4096, 50257), (16384, 2048, 50304)])
def test_the_loss_launches_a_few_ops_per_chunk_off_cpu(rows, width, vocab):
    """On a GPU the chunk is one block (CPU cache blocks would be ~10 launches per 5 rows at vocab 50k: 44,609 ops at
    8k x 4096 x 50257). Counted on the meta device, which takes the non-CPU branch and allocates nothing."""
    hidden = torch.empty(rows, width, device="meta", requires_grad=True)
    weight = torch.empty(vocab, width, device="meta", requires_grad=True)
    targets = torch.empty(rows, dtype=torch.long, device="meta")
    chunk_rows = reference.default_chunk_rows(rows, width, vocab)
    with OpCounter() as counter:
        loss, _ = reference.linear_cross_entropy(hidden, weight, targets, z_loss=1e-4)
        loss.backward()
    chunks = -(-rows // chunk_rows)
    assert counter.ops <= 40 * chunks + 40, (counter.ops, chunks)  # views and in-place ops counted too
    assert counter.ops < 1000
    # validation's per-token loss, the same loop without gradients
    with OpCounter() as counter:
        reference.per_token_cross_entropy(hidden.detach(), weight.detach(), targets)
    assert counter.ops <= 25 * chunks + 20, (counter.ops, chunks)


def test_the_cpu_keeps_its_cache_blocks_bit_for_bit():
    """The CPU branch still cuts a chunk into cache-sized blocks, and a whole-chunk pass gives the same numbers."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 8192, generator=g)
    targets = torch.randint(0, 8192, (64,), generator=g)
    blocked = reference.cross_entropy_chunk(logits.clone(), targets, -100, 1e-4, write_grad=False)
    whole = reference._cross_entropy_rows(logits.clone(), targets, -100, 1e-4, write_grad=False)
    assert max(1, reference.CACHE_BLOCK_ELEMENTS // 8192) < 64  # several blocks here
    for a, b in zip(blocked, whole):
        assert torch.equal(a, b)


def test_rope_tables_reach_the_blocks_in_fp32_in_a_bf16_run(tmp_path):
    """At world size 1 bf16 is autocast over fp32 parameters: the residual stream and the cos/sin tables reach each
    block in fp32 (FSDP2's cast_forward_inputs, above world size 1, would round the tables to bf16), the block's
    matmuls give bf16."""
    trainer = tiny_trainer(tmp_path, **{"train.dtype": "bf16"})
    seen = []
    trainer.model.layers[0].register_forward_pre_hook(lambda module, args: seen.append((args[0].dtype, args[1].dtype)))
    trainer.model.layers[0].attn.q_proj.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    trainer.train_step()
    assert seen[:2] == [(torch.float32, torch.float32), torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


MODELS_SEEN = []  # weak references to each run's model, from a callback (callbacks are copied per run)


def test_a_finished_runs_model_is_freed_before_the_next_run(tmp_path):
    """FSDP2's registered methods hold the model in reference cycles: without a full collection after the run, one
    run after another in a process (slot workers) kept the previous model alive. Automatic collection is off here,
    so only train()'s own collection can free it."""
    import gc
    import weakref

    from ablate.training.callbacks import Callback
    from ablate.training.run import train

    class SeeModel(Callback):
        name = "see_model"

        def pre_train(self, trainer):
            MODELS_SEEN.append(weakref.ref(trainer.model))

    run = load_experiment(TINY, only=["mha"])[0]
    quiet = {"train.max_steps": 2, "train.log_every": 100, "train.val_every": 0, "train.ckpt_every": 0}
    run = apply_overrides(run, {**quiet, "train.device": "cpu", "data.cache_dir": str(tmp_path / "cache")})
    MODELS_SEEN.clear()
    gc.disable()
    try:
        train(run, tmp_path / "runs", callbacks=[SeeModel()])
        assert len(MODELS_SEEN) == 1 and MODELS_SEEN[0]() is None
    finally:
        gc.enable()


def test_ctrl_c_stops_every_rank_before_the_same_steps_update(tmp_path):
    """SIGINT only sets a flag; the step's one all-reduce carries it and the step raises before its update (no rank
    left inside a collective). A second Ctrl-C raises at once; the handler before is back afterwards."""
    import signal

    trainer = tiny_trainer(tmp_path)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with trainer.ctrl_c:
            trainer.train_step()
            signal.raise_signal(signal.SIGINT)  # taken as a request: nothing raised here
            assert trainer.ctrl_c.requested and trainer.step == 1
            weights = [p.detach().clone() for p in trainer.model.parameters()]
            try:
                trainer.train_step()
            except KeyboardInterrupt:
                assert trainer.step == 1  # this step never happened: no update
                assert all(torch.equal(w, p) for w, p in zip(weights, trainer.model.parameters()))
                raise
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(KeyboardInterrupt):
        with trainer.ctrl_c:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # the second: at once
            pytest.fail("a second Ctrl-C must raise at once")


def test_no_call_the_gpu_machines_dynamo_cannot_trace_is_left_in_the_compiled_code():
    """The GPU machines run torch 2.11, whose dynamo cannot trace `torch.amp.is_autocast_available` nor
    `importlib.util.find_spec` (the 2026-11-28 lease: every compiled step failed there, while this CPU's torch
    traces both). Neither may appear in the code a compiled model or loss runs: the model, its MoE and the kernels'
    dispatch and references (a module-level call, once at import, is outside any graph)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = [
        root / "src/ablate/model.py",
        root / "src/ablate/components/moe.py",
        *sorted((root / "kernels").glob("*.py")),
    ]
    untraceable = {"is_autocast_available", "_is_autocast_available", "find_spec"}
    found = []
    for path in files:
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
                if name in untraceable:
                    found.append(f"{path.name}:{node.lineno} {function.name} calls {name}")
    assert not found, found
