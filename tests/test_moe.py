"""The mixture-of-experts FFN (model.ffn="moe"): routing (top-k, shared experts, capacity, both balancing methods)
against a plain per-token loop, the balancing and z-losses on constructed routers, the bias update, parameter roles
and Muon per expert matrix, counts (total and active), config refusals, and real training: 1 vs 2 gloo processes,
and a resume bit-exact (both with latent attention too, so tests/test_mla.py need not train again)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from ablate.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig, validate
from ablate.cost import plan
from ablate.eval.export import check_exportable
from ablate.model import MoE, Transformer
from ablate.optim import assign_roles, build_optimizer
from ablate.optim.muon import newton_schulz, update_scale
from ablate.setup.checks import check_run
from ablate.training.callbacks.experts import ExpertBalance
from ablate.training.callbacks.standard import standard_callbacks
from conftest import TINY, run_cli

D_MODEL, EXPERTS = 16, 4


def moe_config(**fields) -> ModelConfig:
    base = dict(vocab_size=64, d_model=D_MODEL, n_layers=2, n_heads=2, ffn="moe", moe_experts=EXPERTS, moe_hidden=24)
    return ModelConfig(**{**base, **fields})


def random_moe(cfg: ModelConfig, seed: int = 0) -> MoE:
    """Weights of unit scale (the default init's are too small for routes to differ) and a non-zero bias."""
    moe = MoE(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
        moe.router.bias.copy_(torch.tensor([0.5, -0.5, 0.0, 0.1]))
    return moe


def swiglu_expert(x, gate, up, down):
    return down @ (F.silu(gate @ x) * (up @ x))


def loop_reference(moe: MoE, cfg: ModelConfig, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer one token and one expert at a time, written from the definitions."""
    tokens, k = x.shape[0], cfg.moe_top_k
    logits = x @ moe.router.gate.weight.T
    choices, gates = [], []
    for t in range(tokens):
        if cfg.moe_balance == "aux_loss":
            probs = logits[t].softmax(-1)
            gate, chosen = probs.topk(k)
        else:
            affinity = logits[t].sigmoid()
            chosen = (affinity + moe.router.bias).topk(k).indices
            gate = affinity[chosen]
        choices.append(chosen.tolist())
        gates.append(gate / gate.sum() if k > 1 else gate)
    kept = [[True] * k for _ in range(tokens)]
    if cfg.moe_capacity:  # first choices before second choices, tokens in order
        capacity, taken = math.ceil(cfg.moe_capacity * tokens * k / cfg.moe_experts), [0] * cfg.moe_experts
        for j in range(k):
            for t in range(tokens):
                kept[t][j] = taken[choices[t][j]] < capacity
                taken[choices[t][j]] += 1
    out = torch.zeros_like(x)
    w = moe.experts
    for t in range(tokens):
        for j, e in enumerate(choices[t]):
            if kept[t][j]:
                out[t] += gates[t][j] * swiglu_expert(x[t], w.gate_proj[e], w.up_proj[e], w.down_proj[e])
        for e in range(cfg.moe_shared_experts):
            s = moe.shared
            out[t] += swiglu_expert(x[t], s.gate_proj[e], s.up_proj[e], s.down_proj[e])
    return out


ROUTINGS = {
    "aux_top2": {},
    "aux_top1": dict(moe_top_k=1),  # Switch: the gate is the probability itself
    "shared": dict(moe_shared_experts=2),
    "capacity": dict(moe_capacity=0.75),
    "bias_top2": dict(moe_balance="bias"),
    "bias_top1_capacity_shared": dict(moe_balance="bias", moe_top_k=1, moe_capacity=1.0, moe_shared_experts=1),
    "bias_top3": dict(moe_balance="bias", moe_top_k=3),
}


@pytest.mark.parametrize("name", ROUTINGS)
def test_routing_matches_a_per_token_loop(name):
    cfg = moe_config(**ROUTINGS[name])
    moe = random_moe(cfg)
    x = torch.randn(2, 7, D_MODEL, generator=torch.Generator().manual_seed(1))
    got = moe(x).reshape(-1, D_MODEL)
    with torch.no_grad():
        want = loop_reference(moe, cfg, x.reshape(-1, D_MODEL))
    worst = (got - want).abs().max().item()
    print(f"{name}: largest difference to the per-token loop {worst:.1e} (outputs of size ~{want.abs().mean():.1f})")
    assert worst < 1e-4 * want.abs().max().item()
    if cfg.moe_capacity:  # the limit drops some choices here, or the test would not test it
        capacity = math.ceil(cfg.moe_capacity * 14 * cfg.moe_top_k / EXPERTS)
        expert, _, keep, _, _ = moe.router(x.reshape(-1, D_MODEL))
        assert (~keep).sum() > 0
        assert all(int((expert[keep] == e).sum()) <= capacity for e in range(EXPERTS))


def test_every_parameter_gets_a_gradient_through_the_routed_path():
    cfg = moe_config(moe_shared_experts=1, moe_balance="bias", moe_top_k=1)
    moe = random_moe(cfg)
    moe(torch.randn(3, 5, D_MODEL)).square().sum().backward()
    assert moe.router.gate.weight.grad.abs().sum() > 0  # top-1 with bias: the gate is the affinity, not 1
    assert all(p.grad is not None for p in moe.parameters())


def test_balancing_and_z_losses_on_constructed_routers():
    cfg = moe_config(moe_top_k=1)
    moe = MoE(cfg)
    x = torch.zeros(6, D_MODEL)
    x[:, 0] = 1.0
    with torch.no_grad():
        moe.router.gate.weight.zero_()
        moe.router.gate.weight[0, 0] = 100.0  # every token to expert 0 with probability ~1
    *_, aux, z = moe.router(x)
    assert aux.item() == pytest.approx(EXPERTS)  # experts * (share 1) * (probability 1): the worst
    assert z.item() == pytest.approx(100.0**2, rel=1e-6)  # logsumexp ~ the largest logit
    with torch.no_grad():
        moe.router.gate.weight.zero_()  # uniform probabilities: aux = experts * sum(f_i / experts) = 1 for any f
    *_, aux, z = moe.router(x)
    assert aux.item() == pytest.approx(1.0) and z.item() == pytest.approx(math.log(EXPERTS) ** 2)
    # two experts, three tokens: logits (2, 0), (2, 0), (0, 1); shares f = (2/3, 1/3), P the mean softmax
    two = MoE(moe_config(moe_experts=2, moe_top_k=1))
    with torch.no_grad():
        two.router.gate.weight.zero_()
        two.router.gate.weight[0, 0], two.router.gate.weight[1, 1] = 2.0, 1.0
    x = torch.zeros(3, D_MODEL)
    x[0, 0], x[1, 0], x[2, 1] = 1.0, 1.0, 1.0
    expert, gate, _, aux, _ = two.router(x)
    p0, p1 = torch.tensor([2.0, 0.0]).softmax(0).tolist(), torch.tensor([0.0, 1.0]).softmax(0).tolist()
    assert expert.flatten().tolist() == [0, 0, 1] and gate.flatten().tolist() == pytest.approx([p0[0], p0[0], p1[1]])
    mean_p = [(2 * p0[i] + p1[i]) / 3 for i in range(2)]
    assert aux.item() == pytest.approx(2 * (2 / 3 * mean_p[0] + 1 / 3 * mean_p[1]))
    # the loss adds each MoE layer's weighted losses to the cross-entropy
    model_cfg = moe_config(moe_aux_loss=0.5, moe_z_loss=0.25)
    model = Transformer(model_cfg, 8)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    loss, ce = model.loss(tokens, tokens)
    stats = [router.take_step_stats() for router in model.routers().values()]
    extra = sum(0.5 * s[-4] + 0.25 * s[-3] for s in stats)
    assert loss.item() == pytest.approx(ce.item() + extra.item(), rel=1e-6)


def test_bias_steers_the_choice_and_moves_against_the_load():
    cfg = moe_config(moe_balance="bias", moe_bias_rate=0.1)
    moe = random_moe(cfg)
    x = torch.randn(20, D_MODEL, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        moe.router.bias.copy_(torch.tensor([0.0, 0.0, 0.0, 10.0]))
    expert, *_ = moe.router(x)
    assert (expert == 3).any(dim=1).all()  # a large bias puts expert 3 among every token's choices
    moe.router.update_bias(torch.tensor([1.0, 2.0, 3.0, 34.0]))  # mean 10: only expert 3 is above it
    assert moe.router.bias.tolist() == pytest.approx([0.1, 0.1, 0.1, 9.9])


def test_step_statistics_count_training_passes_only():
    model = Transformer(moe_config(moe_capacity=0.5), 8)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 64, (2, 8))
    model.loss(tokens, tokens)
    model.loss(tokens, tokens)
    model.per_token_loss(tokens, tokens)  # validation: no gradient, not counted
    model.stability_stats(tokens)
    stats = model.routers()[0].take_step_stats()
    assert stats[:EXPERTS].sum() == 2 * 16 * 2 and stats[-1] == 2  # tokens x top_k, over two passes
    assert stats[-2] > 0  # capacity 0.5: half the choices dropped at least
    assert model.routers()[0].take_step_stats().sum() == 0  # taken: reset


def test_experts_have_their_own_role_and_muon_orthogonalises_each_matrix():
    model = Transformer(moe_config(moe_shared_experts=1, moe_every=2), 8)
    roles = assign_roles(model)
    assert roles["layers.1.ffn.experts.up_proj"] == roles["layers.1.ffn.shared.down_proj"] == "expert"
    assert roles["layers.1.ffn.router.gate.weight"] == "hidden"  # an nn.Linear: as every hidden matrix
    assert roles["layers.0.ffn.up_proj.weight"] == "hidden"  # moe_every=2: layer 1 (0-based 0) stays dense
    stack = torch.randn(3, 24, 16, generator=torch.Generator().manual_seed(0))
    stack[1] *= 100.0  # each matrix normalised on its own
    batched = newton_schulz(stack, 5)
    for e in range(3):
        assert torch.allclose(batched[e], newton_schulz(stack[e], 5), atol=1e-5)
    run = RunConfig(model=moe_config(), optim=dataclasses.replace(RunConfig().optim, name="muon"))
    optimizer = build_optimizer(model, run.optim)
    groups = {g["role"]: g for g in optimizer.param_groups}
    assert groups["expert"]["weight_decay"] == groups["hidden"]["weight_decay"] > 0
    model.init_weights()
    tokens = torch.randint(0, 64, (2, 8))
    model.loss(tokens, tokens)[0].backward()
    weight = model.layers[1].ffn.experts.up_proj
    before, grad = weight.detach().clone(), weight.grad.clone()
    optimizer.step()
    # the first step's Nesterov momentum is (1 - momentum^2) x the gradient; each expert's matrix on its own
    lr, decay, momentum = (groups["expert"][k] for k in ("lr", "weight_decay", "momentum"))
    for e in range(EXPERTS):
        direction = newton_schulz(grad[e] * (1 - momentum**2), 5)
        expected = before[e] * (1 - lr * decay) - lr * update_scale(24, 16) * direction
        assert torch.allclose(weight.detach()[e], expected, atol=1e-6)


def test_total_and_active_counts():
    cfg = moe_config(moe_shared_experts=1, moe_top_k=2, n_layers=4, moe_every=2)
    model = Transformer(cfg, 8)
    routed = 3 * 24 * D_MODEL * EXPERTS  # gate, up, down of each expert
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    assert model.num_params() - model.num_params(active=True) == 2 * routed // EXPERTS * (EXPERTS - 2)
    dense_flops = 6 * model.num_params(exclude_embedding=True, active=True)
    assert model.flops_per_token(8) - dense_flops == 12 * 4 * 2 * 8 * 8  # layers x heads x head_dim x seq
    run = RunConfig(model=cfg, data=DataConfig(seq_len=8), train=TrainConfig(max_steps=2, global_batch=4))
    planned = plan.plan_run(check_run(run, prechecked=True), device_type="cpu")  # shapes: no data behind vocab 64
    assert (planned.params, planned.active) == (model.num_params(), model.num_params(active=True))
    shown = plan.format_report([planned], 1, None, None, "none")
    assert "active" in shown.splitlines()[1] and "KV/token" in shown.splitlines()[1]


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(moe_top_k=5), r"model.moe_top_k: 5; allowed: 1..4 \(model.moe_experts\)"),
        (dict(moe_every=0), r"model.moe_every: 0; allowed: 1..2"),
        (dict(moe_every=3), r"model.moe_every: 3; allowed: 1..2"),
        (dict(moe_capacity=-1.0), r"model.moe_capacity: -1.0; allowed: >= 0"),
        (
            dict(ffn="swiglu", moe_experts=8, moe_hidden=None, moe_top_k=1),
            r"model.moe_top_k: only read with model.ffn='moe'; allowed: 2",
        ),
        (dict(moe_balance="switch"), r"model.moe_balance: got 'switch'.*allowed: one of 'aux_loss', 'bias'"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(fields, says):
    with pytest.raises(ConfigError, match=says):
        validate(RunConfig(model=moe_config(**fields)))


def test_export_takes_experts_without_a_capacity():
    """Which class takes which MoE, and the logits, are tests/test_export_moe_mla.py's."""
    assert check_exportable(moe_config()) == "Mixtral"
    with pytest.raises(NotImplementedError, match=r"model.moe_capacity=1.25: .* export needs model.moe_capacity=0"):
        check_exportable(moe_config(moe_capacity=1.25))


def test_the_balance_callback_joins_moe_runs_only():
    assert not any(isinstance(c, ExpertBalance) for c in standard_callbacks(RunConfig()))
    found = [
        c for c in standard_callbacks(RunConfig(model=moe_config(moe_balance="bias"))) if isinstance(c, ExpertBalance)
    ]
    assert len(found) == 1 and found[0].update_bias


# -- real training ------------------------------------------------------------------------------------------------

# MoE with DeepSeek-V3 balancing (the bias all-reduced once a step), a capacity limit, shared experts, Muon on the
# experts, and MLA with compressed queries: every part whose state or arithmetic could differ across world sizes
TRAINED = [
    "--set",
    "model.ffn=moe",
    "--set",
    "model.moe_experts=4",
    "--set",
    "model.moe_balance=bias",
    "--set",
    "model.moe_bias_rate=0.01",
    "--set",
    "model.moe_capacity=1.25",
    "--set",
    "model.moe_shared_experts=1",
    "--set",
    "model.moe_z_loss=0.001",
    "--set",
    "model.attention=mla",
    "--set",
    "model.q_lora_rank=16",
    "--set",
    "optim.name=muon",
]


def read_metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def by_step(rows: list[dict], key: str) -> dict:
    return {r["step"]: r[key] for r in rows if key in r}


@pytest.mark.slow
def test_two_gloo_processes_match_one(tmp_path):
    """Global batch 8: one process takes 2 micro-batches of 4, two processes 4 each (the same passes, so the same
    balancing and capacity per pass); the bias moves from the load summed over both ranks."""
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=8", *TRAINED]
    run_cli(*args, "--out", str(tmp_path / "one"))
    run_cli(*args, "--out", str(tmp_path / "two"), torchrun_procs=2)
    one, two = (read_metrics(tmp_path / o / "tiny" / "mha" / "seed0") for o in ("one", "two"))
    loss_one, loss_two = by_step(one, "loss"), by_step(two, "loss")
    assert sorted(loss_two) == list(range(1, 9)) and sorted(loss_one) == sorted(loss_two)
    worst = max(abs(loss_one[s] - loss_two[s]) / loss_one[s] for s in loss_one)
    print(f"moe + mla: largest relative loss difference, 2 gloo ranks vs 1 process, over 8 steps: {worst:.2e}")
    assert worst < 1e-5
    for key in ("moe/load/layer0", "moe/load/layer1"):  # token counts: the same routing on every step
        assert by_step(one, key) == by_step(two, key) and len(by_step(one, key)) == 8
    dropped = by_step(one, "moe/dropped")
    assert dropped == pytest.approx(by_step(two, "moe/dropped")) and max(dropped.values()) > 0
    summary = json.loads((tmp_path / "two" / "tiny" / "mha" / "seed0" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["params_active"] < summary["params"]


def straight_and_resumed(tmp_path, settings: list[str]) -> tuple[list[dict], list[dict]]:
    """The tiny mha run with `settings` (--set pairs) for 8 steps straight, and the same run stopped after its
    step-4 checkpoint and resumed: each one's metrics rows."""
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=8", "--set", "train.ckpt_every=4", *settings]
    run_cli(*args, "--out", str(tmp_path / "straight"))
    straight = tmp_path / "straight" / "tiny" / "mha" / "seed0"
    stopped = tmp_path / "stopped" / "tiny" / "mha" / "seed0"
    shutil.copytree(straight, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step_8")
    (stopped / "summary.json").unlink()
    resumed = run_cli(*args, "--out", str(tmp_path / "stopped"))
    assert "resumed from" in resumed.stdout and "(step 4)" in resumed.stdout
    return read_metrics(straight), read_metrics(stopped)


@pytest.mark.slow
def test_resume_is_bit_exact(tmp_path):
    """A run stopped after its step-4 checkpoint resumes to the same losses and routing as the uninterrupted one:
    the routers' biases are in the checkpoint."""
    a, b = straight_and_resumed(tmp_path, TRAINED)
    for key in ("loss", "val/loss", "grad_norm", "moe/load/layer0", "moe/aux_loss"):
        assert by_step(a, key) == by_step(b, key), key
    assert sorted(by_step(b, "loss")) == list(range(1, 9))


# -- dispatch: no host reads, one compiled graph, a fixed summation order ---------------------------------------------

# ops that read a device tensor back to the host (or size their output by its values, which needs that read)
HOST_READS = {"_local_scalar_dense", "item", "nonzero", "bincount", "masked_select", "unique", "_unique2"}
DISPATCHED = {  # the routings whose code differs: capacity (the keep mask), shared experts, both balancings
    "bias_top2_capacity_shared": dict(moe_balance="bias", moe_capacity=0.75, moe_shared_experts=1),
    "aux_top3": dict(moe_top_k=3),
}


class HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the aten ops in HOST_READS that run under it (forward and backward alike)."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in HOST_READS:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


def forward_and_backward(moe: MoE, x: torch.Tensor, run=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The layer's output (by `run`, a compiled moe, if given) and the gradients of a loss through it (the router's
    losses included), x's as "x"."""
    moe.zero_grad()
    x = x.detach().requires_grad_()
    out = (moe if run is None else run)(x)
    (out.float().square().mean() + moe.extra_loss).backward()
    return out.detach(), {"x": x.grad, **{name: p.grad for name, p in moe.named_parameters()}}


@pytest.mark.parametrize("name", DISPATCHED)
def test_an_moe_layer_reads_nothing_back_to_the_host(name, monkeypatch):
    """A host read (bincount, .tolist(), boolean-mask indexing) stalls the CPU until the GPU catches up, once per
    layer and pass. On CPU the same ops are seen at dispatch (tolist, which skips it, is counted by a wrapper);
    what one kernel reads inside itself is not (torch's loop fallback of _grouped_mm, for non-bf16 CUDA)."""
    moe = random_moe(moe_config(**DISPATCHED[name])).train()
    tolist_calls = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: tolist_calls.append(t) or t.numpy().tolist())
    with HostReads() as reads:
        forward_and_backward(moe, torch.randn(2, 7, D_MODEL))
    assert reads.found == [] and tolist_calls == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_moe_layer_compiles_into_one_graph(dtype):
    """fullgraph=True fails on any graph break. bf16 takes torch._grouped_mm, fp32 the fixed-shape fallback
    (the only dtype _grouped_mm's compile-time shape check admits is bf16); both as the eager layer computes."""
    cfg = moe_config(**DISPATCHED["bias_top2_capacity_shared"])
    moe = random_moe(cfg).to(dtype).train()
    x = torch.randn(2, 7, D_MODEL, generator=torch.Generator().manual_seed(3)).to(dtype)
    eager_out, eager_grads = forward_and_backward(moe, x)
    torch._dynamo.reset()
    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    out, grads = forward_and_backward(moe, x, run=compiled)
    tolerance = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-1)
    torch.testing.assert_close(out, eager_out, **tolerance)
    for key in eager_grads:  # the backward too: the compiled graph's, not eager autograd's
        torch.testing.assert_close(grads[key], eager_grads[key], **tolerance, msg=key)


def index_add_reference(moe: MoE, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dispatch this layer used before: choices over capacity cut out by a boolean mask, counts read to the host,
    one matmul per expert, and the results scattered back with index_add_ (a sum in the atomics' order on CUDA).
    -> output, the router's weighted losses."""
    expert, gate, keep, aux, z = moe.router(x)
    k, w = expert.shape[1], moe.experts
    token, expert, gate = torch.arange(len(x)).repeat_interleave(k), expert.flatten(), gate.flatten()
    if keep is not None:
        token, expert, gate = token[keep.flatten()], expert[keep.flatten()], gate[keep.flatten()]
    order = expert.argsort(stable=True)
    token, gate = token[order], gate[order]
    counts = torch.bincount(expert, minlength=EXPERTS).tolist()
    chunks = x[token].split(counts)
    out = torch.cat(
        [
            F.linear(F.silu(F.linear(r, w.gate_proj[e])) * F.linear(r, w.up_proj[e]), w.down_proj[e])
            for e, r in enumerate(chunks)
        ]
    )
    out = torch.zeros_like(x).index_add_(0, token, out * gate[:, None])
    out = out + moe.shared.every(x) if moe.shared is not None else out
    return out, moe.aux_weight * aux + moe.z_weight * z


@pytest.mark.parametrize("hidden", [24, 10])  # 10: rows of 40 bytes, the fixed-shape path instead of _grouped_mm
@pytest.mark.parametrize("name", DISPATCHED)
def test_dispatch_is_deterministic_and_matches_the_index_add_formula(name, hidden):
    moe = random_moe(moe_config(**DISPATCHED[name], moe_hidden=hidden)).train()
    x = torch.randn(3, 9, D_MODEL, generator=torch.Generator().manual_seed(4))
    out, grads = forward_and_backward(moe, x)
    again, grads_again = forward_and_backward(moe, x)
    assert torch.equal(out, again) and all(torch.equal(grads[key], grads_again[key]) for key in grads)
    moe.zero_grad()
    flat = x.reshape(-1, D_MODEL).detach().requires_grad_()
    want, router_loss = index_add_reference(moe, flat)
    (want.square().mean() + router_loss).backward()
    scale = want.abs().max().item()
    torch.testing.assert_close(out.reshape(-1, D_MODEL), want.detach(), rtol=1e-5, atol=1e-6 * scale)
    want_grads = {"x": flat.grad.view(x.shape), **{n: p.grad for n, p in moe.named_parameters()}}
    for key in grads:  # equal up to the order of fp32 sums (3 choices a token: the combine's order changed)
        torch.testing.assert_close(grads[key], want_grads[key], rtol=1e-4, atol=1e-6 * grads[key].abs().max().item())
