"""Multi-head latent attention (model.attention="mla"): the module against a direct computation of the same
attention from its weights, RoPE on the decoupled part only, the stability monitor's logit maximum, the KV cache per
token of every attention choice (`ablate plan`), counts, the memory model, and refusals. Training with MLA at 1 and
2 processes, and its resume, are tests/test_moe.py's slow tests (they train MoE and MLA together)."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig, validate
from ablate.cost import memory
from ablate.cost import plan
from ablate.eval.export import check_exportable
from ablate.model import LatentAttention, Transformer, attention_logit_max
from ablate.setup.checks import check_run
from test_plan import _saved_by_autograd

BASE = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, attention="mla")


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x, positions, base):
    """RoPE written with complex numbers: dims i and i + r/2 form z_i, turned by position * base^(-2i/r)."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64), positions[:, None] * freq)
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1).float()


def direct_attention(attn: LatentAttention, cfg: ModelConfig, x: torch.Tensor):
    """Output and per-head scores of one sequence x (S, d_model), from the weights, one head at a time."""
    seq, heads, hd, rope = x.shape[0], cfg.n_heads, cfg.head_dim, attn.rope_dim
    eps = cfg.norm_eps
    q_in = x if attn.q_down is None else rms(x @ attn.q_down.weight.T, attn.q_norm.weight, eps)
    q = (q_in @ attn.q_proj.weight.T).view(seq, heads, hd + rope)
    down = x @ attn.kv_down.weight.T
    latent, k_rope = down[:, : attn.kv_rank], down[:, attn.kv_rank :]  # what a KV cache would keep
    kv = (rms(latent, attn.kv_norm.weight, eps) @ attn.kv_up.weight.T).view(seq, heads, 2 * hd)
    positions = torch.arange(seq, dtype=torch.float64)
    if cfg.pos == "rope":
        k_rope = rotate(k_rope, positions, cfg.rope_base)
    outputs, scores = [], []
    for h in range(heads):
        q_rope = rotate(q[:, h, hd:], positions, cfg.rope_base) if cfg.pos == "rope" else q[:, h, hd:]
        q_h = torch.cat([q[:, h, :hd], q_rope], dim=-1)
        k_h = torch.cat([kv[:, h, :hd], k_rope], dim=-1)  # one RoPE key part for every head
        s = q_h @ k_h.T / math.sqrt(hd + rope)
        s = s.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
        scores.append(s)
        outputs.append(s.softmax(-1) @ kv[:, h, hd:])
    return torch.cat(outputs, dim=-1) @ attn.o_proj.weight.T, torch.stack(scores)


def random_attention(cfg: ModelConfig) -> LatentAttention:
    model = Transformer(cfg, 16)
    model.init_weights(torch.Generator().manual_seed(0))
    attn = model.layers[0].attn
    with torch.no_grad():  # larger weights than the init's, so that every part of the scores matters
        for p in attn.parameters():
            if p.ndim == 2:
                p.mul_(10)
        for p in (attn.kv_norm.weight, *((attn.q_norm.weight,) if attn.q_norm is not None else ())):
            p.copy_(torch.rand(p.shape, generator=torch.Generator().manual_seed(1)) + 0.5)
    return attn, model


@pytest.mark.parametrize(
    "fields", [{}, dict(q_lora_rank=16), dict(pos="nope"), dict(kv_lora_rank=8, qk_rope_dim=6)], ids=str
)
def test_latent_attention_matches_a_direct_computation(fields):
    cfg = ModelConfig(**BASE, **fields)
    attn, model = random_attention(cfg)
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(2))
    got = attn(x, model.rope_cos, model.rope_sin)
    for b in range(2):
        want, scores = direct_attention(attn, cfg, x[b])
        worst = (got[b] - want).abs().max().item()
        print(f"{fields}: largest difference to the direct computation {worst:.1e} (outputs ~{want.abs().mean():.2f})")
        assert worst < 1e-4 * want.abs().max()
    q, k, _ = attn.project(x[1:], model.rope_cos, model.rope_sin)  # the stability monitor's maximum logit
    assert attention_logit_max(q, k).item() == pytest.approx(scores.max().item(), rel=1e-5)


def test_rope_tables_are_as_wide_as_the_rope_part():
    model = Transformer(ModelConfig(**BASE, qk_rope_dim=6), 16)
    assert model.rope_cos.shape == (16, 3)
    assert Transformer(ModelConfig(**BASE), 16).rope_cos.shape == (16, 2)  # default: head_dim 8 // 2 -> 4 dims


def test_stability_stats_and_positions_work_with_mla():
    model = Transformer(ModelConfig(**BASE, q_lora_rank=8), 16)
    model.init_weights(torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    stats = model.stability_stats(tokens)
    assert set(stats) >= {"max_attention_logit", "attention_logit_max/layer1"} and stats["max_attention_logit"] > 0
    positions = torch.arange(16).repeat(2, 1)  # the eval engine's path: positions and a boolean mask
    mask = torch.ones(16, 16, dtype=torch.bool).tril().expand(2, 1, 16, 16)
    plain, packed = model(tokens), model(tokens, positions=positions, attn_mask=mask)
    assert torch.allclose(plain, packed, atol=1e-5)


def test_kv_cache_bytes_per_token_for_every_attention_choice():
    m = dict(vocab_size=64, d_model=64, n_layers=3, n_heads=8)  # head_dim 8

    def kv_bytes(cfg: ModelConfig, **kwargs) -> int:
        with torch.device("meta"):  # the count alone: no storage
            return Transformer(cfg, 16).kv_cache_bytes_per_token(**kwargs)

    assert kv_bytes(ModelConfig(**m)) == 2 * 8 * 8 * 3 * 2  # MHA: 2 x heads x dim x layers
    assert kv_bytes(ModelConfig(**m, n_kv_heads=2)) == 2 * 2 * 8 * 3 * 2
    assert kv_bytes(ModelConfig(**m, n_kv_heads=1)) == 2 * 1 * 8 * 3 * 2
    mla = ModelConfig(**m, attention="mla", kv_lora_rank=16, qk_rope_dim=4)
    assert kv_bytes(mla) == (16 + 4) * 3 * 2
    assert kv_bytes(mla, bytes_per_value=4) == (16 + 4) * 3 * 4
    runs = [
        RunConfig(name=n, model=c, data=DataConfig(seq_len=16), train=TrainConfig(max_steps=2, global_batch=4))
        for n, c in (("mha", ModelConfig(**m)), ("mla", mla))
    ]
    plans = [plan.plan_run(check_run(r, prechecked=True), device_type="cpu") for r in runs]  # no data: vocab 64
    shown = plan.format_report(plans, 1, None, None, "none")
    header, mha_row, mla_row = shown.splitlines()[1:4]
    column = header.split().index("KV/token")
    assert mha_row.split()[column] == "768B" and mla_row.split()[column] == "120B"


def test_counts_and_flops():
    cfg = ModelConfig(**BASE, q_lora_rank=16)
    model = Transformer(cfg, 16)
    rope, kv = 4, 32  # defaults at head_dim 8: head_dim // 2, 4 * head_dim
    attention = 32 * 16 + 16 + 16 * 4 * (8 + rope) + 32 * (kv + rope) + kv + kv * 4 * 16 + 32 * 32
    ffn = 3 * 32 * cfg.ffn_dim
    assert model.num_params() == 64 * 32 + 2 * (attention + ffn + 2 * 32) + 32
    run = RunConfig(model=cfg, data=DataConfig(seq_len=16), train=TrainConfig(max_steps=2, global_batch=4))
    planned = plan.plan_run(check_run(run, prechecked=True), device_type="cpu")  # shapes: no data behind vocab 64
    assert planned.params == planned.active == model.num_params()
    n = model.num_params(exclude_embedding=True)
    assert planned.flops_per_token == 6 * n + 6 * 2 * 4 * (2 * 8 + rope) * 16  # scores over 12 dims, values over 8


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")  # the latents' norms under autocast
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "fields",
    [
        dict(attention="mla"),
        dict(attention="mla", q_lora_rank=32, pos="nope"),
        dict(ffn="moe", moe_experts=4),
        dict(ffn="moe", moe_top_k=1, moe_shared_experts=1, moe_hidden=64, moe_every=2, moe_capacity=1.0),
        dict(ffn="moe", attention="mla", moe_balance="bias"),
    ],
    ids=str,
)
def test_saved_activations_are_counted_within_10_percent(fields, bf16):
    """The memory model's count of what autograd saves, approximate for MLA and experts (exact for the rest)."""
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=3, n_heads=4, **fields)
    precision = memory.Precision("cpu", "bf16" if bf16 else "fp32")
    estimate = memory.activation_bytes(cfg, 2, 48, precision, False)
    measured = _saved_by_autograd(cfg, 2, 48, bf16, False)
    assert 0.9 < estimate / measured < 1.1, (estimate, measured)


@pytest.mark.parametrize(
    "fields, says",
    [
        (dict(n_kv_heads=2), r"model.n_kv_heads: 2; allowed: None with attention='mla'"),
        (dict(qk_norm=True), r"model.qk_norm: True; allowed: False with attention='mla'"),
        (dict(qk_rope_dim=3), r"model.qk_rope_dim: 3; allowed: None or even >= 2 with pos='rope'"),
        (dict(pos="nope", qk_rope_dim=4), r"model.qk_rope_dim: 4; allowed: 0 or None with pos='nope'"),
        (dict(rope_fraction=0.5), r"model.rope_fraction: 0.5; allowed: 1.0 with attention='mla'"),
        (dict(kv_lora_rank=0), r"model.kv_lora_rank: 0; allowed: None or > 0"),
        (dict(attention="gqa", kv_lora_rank=16), r"model.kv_lora_rank: only read with model.attention='mla'"),
        (dict(attention="sparse"), r"model.attention: got 'sparse'.*allowed: one of 'gqa', 'mla'"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(fields, says):
    with pytest.raises(ConfigError, match=says):
        validate(RunConfig(model=ModelConfig(**{**BASE, **fields})))


def test_odd_head_dims_are_fine_with_mla():
    validate(RunConfig(model=ModelConfig(**{**BASE, "d_model": 36})))  # head_dim 9: only the RoPE part rotates


def test_latent_attention_exports_as_deepseek_v3():
    """Its logits against transformers' are tests/test_export_moe_mla.py's."""
    assert check_exportable(ModelConfig(**BASE)) == "DeepseekV3"


def test_values_are_padded_so_sdpa_takes_a_fused_kernel():
    """Values narrower than queries would send SDPA to its math backend, which keeps the (S, S) scores."""
    cfg = ModelConfig(**BASE)
    saved = []
    model = Transformer(cfg, 16)
    x = torch.randn(1, 16, 32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        model.layers[0].attn(x, model.rope_cos, model.rope_sin)
    assert not any(len(s) == 4 and s[-1] == s[-2] == 16 for s in saved), saved  # no (B, H, S, S) tensor
