"""`ablate plan`: counts against the real model, saved activations against autograd, the memory estimate against
the peak measured over real training steps (1 process and 2 under torchrun), check_fits, and the command line."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
import torch

from ablate.components import registry
from ablate import branch, optim, rundir, variant
from ablate.config import ConfigError, DataConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig
from ablate.cost import memory
from ablate.cost import plan
from ablate.model import Transformer
from ablate.setup.checks import check_run
from conftest import REPO, TINY, cli_in_process, run_cli


def _run(**sections) -> RunConfig:
    base = dict(
        model=ModelConfig(vocab_size=512, d_model=64, n_layers=3, n_heads=4),
        data=DataConfig(seq_len=32),
        train=TrainConfig(max_steps=10, global_batch=8, micro_batch=4, peak_flops=1e11),
    )
    return RunConfig(**{**base, **sections})


def test_parse_size_reads_binary_and_decimal_units():
    assert memory.parse_size("24GiB") == 24 * 2**30
    assert memory.parse_size("80GB") == 80 * 10**9
    assert memory.parse_size("512 MiB") == 512 * 2**20
    assert memory.parse_size("1.5T") == 1_500_000_000_000
    assert memory.parse_size("1000") == 1000
    for bad in ("", "GiB", "12 parsecs", "-3GB"):
        with pytest.raises(ConfigError, match="--device-memory"):
            memory.parse_size(bad)


@pytest.mark.parametrize("tie", [True, False])
def test_counts_match_the_real_model(tie):
    run = _run(model=ModelConfig(vocab_size=512, d_model=64, n_layers=3, n_heads=4, tie_embeddings=tie))
    real = Transformer(run.model, max_seq_len=run.data.seq_len)
    p = plan.plan_run(check_run(run))
    assert p.params == sum(x.numel() for x in real.parameters()) == real.num_params()
    assert p.non_embedding == p.params - 512 * 64
    assert p.flops_per_token == real.flops_per_token(run.data.seq_len)
    assert (p.steps, p.tokens) == (10, 10 * 8 * 32)
    assert p.flops == p.flops_per_token * p.tokens
    assert p.seconds(world=2) == pytest.approx(p.flops / 2e11)


def test_a_branch_costs_only_its_steps_after_the_branch_point():
    parent = _run()
    whole = plan.plan_run(check_run(parent))
    part = plan.plan_run(check_run(branch(parent, 6, "decay", {"schedule.name": "wsd"})))
    assert part.steps == 4 and part.tokens == 4 * 8 * 32
    assert part.model_tokens == whole.model_tokens == whole.tokens  # the final model saw the parent's tokens too
    assert part.flops == pytest.approx(whole.flops * 4 / 10)
    longer = plan.plan_run(check_run(branch(parent, 6, "longer", {"train.max_steps": 20})))
    assert longer.steps == 14 and longer.model_tokens == 20 * 8 * 32


def test_a_batch_schedule_takes_the_steps_its_plan_lists():
    run = variant(
        _run(),
        "ramp",
        {
            "train.batch_schedule": "ramp",
            "train.batch_start": 4,
            "train.global_batch": 16,
            "train.batch_ramp_tokens": 4096,
            "train.max_tokens": 16384,
        },
    )
    from ablate.data.batch_schedule import batch_plan

    steps = batch_plan(run.train, 32)
    p = plan.plan_run(check_run(run))
    assert p.steps == len(steps) > 16384 // (16 * 32)  # small batches first: more steps than at the full batch
    assert p.tokens == sum(steps) * 32 >= 16384


def test_world_size_must_split_the_batch():
    with pytest.raises(ConfigError, match="base: .*world size"):
        plan.plan_run(check_run(_run()), world=3)


# ---------------------------------------------------------------------------------------------------------------
# saved activations, counted against what autograd really saves


def _saved_by_autograd(cfg: ModelConfig, batch: int, seq: int, bf16: bool, doc_mask: bool) -> int:
    """Bytes of the distinct storages autograd saves in the forward (parameters and buffers aside)."""
    model = Transformer(cfg, seq)
    model.init_weights(torch.Generator().manual_seed(0))
    if bf16:  # what FSDP2's bf16 policy computes with: bf16 parameters (the RoPE tables stay fp32 buffers)
        model.to(torch.bfloat16).reset_buffers()
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))
    doc_ids = torch.arange(seq).repeat(batch, 1) // (seq // 3) if doc_mask else None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.hidden_states(tokens, doc_ids)
    return sum(seen.values())


ARCHITECTURES = {
    "base": {},
    "gqa": dict(n_kv_heads=2),
    "mqa": dict(n_kv_heads=1),
    "qk_norm": dict(qk_norm=True),
    "nope": dict(pos="nope"),
    "rope_skip": dict(rope_skip_every=2),
    "partial_rope": dict(rope_fraction=0.5),
    "gelu": dict(ffn="gelu"),
    "relu": dict(ffn="relu"),
    "layernorm": dict(norm="layernorm"),
    "qk_norm_nope_gqa": dict(qk_norm=True, pos="nope", n_kv_heads=2),
}


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", [*ARCHITECTURES, "doc_mask"])
def test_saved_activations_are_counted_op_by_op(name, bf16):
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=3, n_heads=4, **ARCHITECTURES.get(name, {}))
    doc_mask = name == "doc_mask"
    precision = memory.Precision("cpu", "bf16" if bf16 else "fp32")
    estimate = memory.activation_bytes(cfg, 2, 48, precision, doc_mask)
    assert estimate == _saved_by_autograd(cfg, 2, 48, bf16, doc_mask)


def test_dropout_is_counted_roughly():
    """Dropout sends attention to the math backend, whose saved tensors are approximated (within 10%)."""
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, dropout=0.1)
    estimate = memory.activation_bytes(cfg, 2, 48, memory.Precision("cpu", "fp32"), False)
    without = memory.activation_bytes(
        dataclasses.replace(cfg, dropout=0.0), 2, 48, memory.Precision("cpu", "fp32"), False
    )
    assert estimate > 1.2 * without
    assert estimate == pytest.approx(_saved_by_autograd(cfg, 2, 48, False, False), rel=0.1)


# ---------------------------------------------------------------------------------------------------------------
# the step's memory


def test_more_ranks_shard_the_state_but_not_the_activations():
    run = _run(train=TrainConfig(max_steps=10, global_batch=8, micro_batch=4))
    one, two = memory.estimate_memory(check_run(run), 1, "cpu"), memory.estimate_memory(check_run(run), 2, "cpu")
    assert two.params < 0.55 * one.params and two.optimizer < 0.55 * one.optimizer
    assert one.optimizer == pytest.approx(2 * (one.params - memory.model_shapes(run).buffer_bytes))  # AdamW: 2 states
    assert two.activations == pytest.approx(one.activations, rel=0.05)
    assert two.gathered > one.gathered  # over two ranks an all-gather's buffer lives beside the gathered parameters


def test_accumulation_finds_gradients_waiting():
    alone = memory.estimate_memory(check_run(_run()), 1, "cpu")  # global 8 = micro 4 x 2: the 2nd micro-batch has grads
    single = check_run(_run(train=TrainConfig(global_batch=4, micro_batch=4)))
    no_accumulation = memory.estimate_memory(single, 1, "cpu")
    assert "micro-batch 2" in alone.moment and alone.grads >= alone.params - memory.model_shapes(_run()).buffer_bytes
    assert no_accumulation.total < alone.total


def test_muon_keeps_one_state_for_hidden_matrices():
    adamw = memory.estimate_memory(check_run(_run()), 1, "cpu")
    muon = memory.estimate_memory(check_run(_run(optim=OptimConfig(name="muon"))), 1, "cpu")
    assert 0.5 * adamw.optimizer < muon.optimizer < adamw.optimizer
    with pytest.raises(ConfigError, match="optim.name"):
        memory.estimate_memory(check_run(_run(optim=OptimConfig(name="lion"))), 1, "cpu")


def test_the_planner_asks_the_optimizer_its_state_size():
    """A new optimizer is one file: registered with its state size, which ablate plan counts as declared."""

    @optim.register("momentum_for_plan")
    class Momentum(torch.optim.SGD):
        def __init__(self, groups, cfg):
            super().__init__(groups, lr=cfg.lr, momentum=0.9)

        @staticmethod
        def state_elements(shapes: optim.ParamShapes, world: int) -> int:  # one momentum buffer per parameter
            return optim.shard_elements(shapes.root + shapes.all_blocks, world)

        @staticmethod
        def transient_elements(shapes: optim.ParamShapes, world: int) -> int:
            return 1000 * world  # a made-up figure, to find again

    @optim.register("silent_for_plan")
    class Silent(torch.optim.SGD):  # declares nothing
        def __init__(self, groups, cfg):
            super().__init__(groups, lr=cfg.lr)

    try:
        for world in (1, 2):
            checked = check_run(_run(optim=OptimConfig(name="momentum_for_plan")))
            shapes = memory.model_shapes(checked.config)
            planned = plan.plan_run(checked, world, "cpu")
            assert planned.memory.optimizer == memory.FP32 * Momentum.state_elements(shapes, world)
            adamw = memory.estimate_memory(check_run(_run()), world, "cpu")
            assert 2 * planned.memory.optimizer == adamw.optimizer  # AdamW: two states per parameter
            step = memory.step_moments(checked, world, "cpu")[-1]
            assert step.moment == "optimizer step" and step.activations == memory.FP32 * 1000 * world
        with pytest.raises(ConfigError) as refused:
            plan.plan_run(check_run(_run(optim=OptimConfig(name="silent_for_plan"))), 1, "cpu")
        message = str(refused.value)
        assert "'silent_for_plan'" in message and "Silent" in message
        assert "declares no state_elements and no transient_elements" in message
        assert "state_elements(shapes, world) -> int, transient_elements(shapes, world) -> int" in message
    finally:
        registry.unregister("optimizer", "momentum_for_plan"), registry.unregister("optimizer", "silent_for_plan")


def test_bf16_halves_gathered_parameters_and_activations():
    fp32 = memory.estimate_memory(check_run(_run(train=TrainConfig(global_batch=4, micro_batch=4))), 1, "cpu")
    run = _run(train=TrainConfig(global_batch=4, micro_batch=4, dtype="bf16"))
    cpu, gpu = memory.estimate_memory(check_run(run), 1, "cpu"), memory.estimate_memory(check_run(run), 1, "cuda")
    assert cpu.params == fp32.params and cpu.optimizer == fp32.optimizer  # fp32 shards: the master weights
    assert cpu.gathered == pytest.approx(fp32.gathered / 2) and cpu.gathered == gpu.gathered
    assert cpu.activations < 0.75 * fp32.activations  # bf16 activations (the norms keep fp32 on CPU)


def test_check_fits_refuses_naming_what_the_run_needs_and_has():
    run = _run()
    need = memory.estimate_memory(check_run(run), 1, "cpu").total
    assert memory.check_fits(check_run(run), 1, None, "cpu").total == need
    assert memory.check_fits(check_run(run), 1, need, "cpu").total == need
    with pytest.raises(ConfigError) as refused:
        memory.check_fits(check_run(run), 1, need - 1, "cpu")
    message = str(refused.value)
    assert "base (seed 0)" in message and memory.format_bytes(need) in message
    assert memory.format_bytes(need - 1) in message and "train.micro_batch" in message


def test_earlier_mfu_is_the_median_of_finished_runs(tmp_path):
    assert plan.earlier_mfu(tmp_path, "exp")[0] is None
    for i, mfu in enumerate([0.2, 0.4, 0.3, None]):
        folder = tmp_path / "exp" / f"v{i}" / "seed0"
        folder.mkdir(parents=True)
        (folder / rundir.SUMMARY).write_text(json.dumps({"mfu": mfu}))
    (tmp_path / "other" / "v" / "seed0").mkdir(parents=True)
    (tmp_path / "other" / "v" / "seed0" / rundir.SUMMARY).write_text(json.dumps({"mfu": 0.9}))
    mfu, source = plan.earlier_mfu(tmp_path, "exp")
    assert mfu == pytest.approx(0.3) and "3 finished runs" in source
    assert plan.earlier_mfu(tmp_path, "new")[0] == pytest.approx(0.35)  # none of its own: every run there


# ---------------------------------------------------------------------------------------------------------------
# the estimate against the peak measured over real training steps


def _bench():
    spec = importlib.util.spec_from_file_location("bench_plan", REPO / "scripts" / "bench_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("case,world", [("small-fp32", 1), ("long-bf16", 1), ("doc-mask-gelu", 2)])
def test_estimate_is_within_20_percent_of_the_measured_peak(case, world):
    """Live CPU tensor bytes at their highest over 2 training steps of the real trainer (the second has optimizer
    state), counted by c10's allocator on every thread, against the estimate."""
    bench = _bench()
    run_dict = bench.case_config(case, world)
    measured = bench.measure_in_subprocess(run_dict, world, steps=2)
    estimate = memory.estimate_memory(check_run(RunConfig.from_dict(run_dict)), world, "cpu")
    assert measured["peak_bytes"] > 150 * 2**20  # large enough not to be noise
    assert 0.8 < estimate.total / measured["peak_bytes"] < 1.2, (estimate, measured)


# ---------------------------------------------------------------------------------------------------------------
# the command line


@pytest.mark.slow
def test_cli_plan_prints_both_tables_and_refuses_what_cannot_fit():
    shown = run_cli("plan", str(TINY), "--world-size", "2")
    for text in ("mha", "mqa", "all runs", "FLOP/token", "tokens/param", "per rank", "FSDP2 over 2 ranks"):
        assert text in shown.stdout
    refused = run_cli("plan", str(TINY), "--device-memory", "1MiB", "--only", "mha", check=False)
    assert refused.returncode == 2
    assert "mha (seed 0) needs" in refused.stderr and "1.00MiB" in refused.stderr and "mqa" not in refused.stderr
    assert "NO" in refused.stdout  # the table is printed first


def test_run_refuses_what_cannot_fit_before_any_compute(tmp_path):
    """`ablate run --device-memory`: a run whose estimate exceeds it stops with exit 2, and no run folder exists."""
    result = cli_in_process(
        "run", str(TINY), "--only", "mha", "--device-memory", "1MiB", "--out", str(tmp_path / "runs"), check=False
    )
    assert result.returncode == 2 and "cannot fit in 1.00MiB" in result.stderr + result.stdout
    assert "mha (seed 0) needs" in result.stderr + result.stdout and not (tmp_path / "runs").exists()
