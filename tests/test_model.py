import copy
import itertools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ablate.config import ModelConfig, validate, RunConfig
from ablate.model import Transformer, apply_rope, rope_tables
from ablate.training.callbacks import whole

SEQ = 16


def build(**knobs) -> Transformer:
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, **knobs)
    validate(RunConfig(model=cfg))
    model = Transformer(cfg, max_seq_len=SEQ)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


KNOBS = [
    dict(ffn=f, norm=n, pos=p, qk_norm=q, tie_embeddings=t, n_kv_heads=k)
    for f, n, p, q, t, k in itertools.product(
        ["swiglu", "gelu", "relu"],
        ["rmsnorm", "layernorm"],
        ["rope", "nope"],
        [False, True],
        [True, False],
        [None, 2, 1],
    )
]


@pytest.mark.parametrize(
    "knobs", KNOBS[::5] + [dict(rope_skip_every=2), dict(rope_fraction=0.5), dict(z_loss=1e-4), dict(ffn_hidden=40)]
)
def test_every_knob_trains(knobs):
    model = build(**knobs)
    tokens = torch.randint(0, 97, (2, SEQ))
    loss, ce = model.loss(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert torch.isfinite(loss) and abs(ce.item() - torch.log(torch.tensor(97.0)).item()) < 0.5
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_causal_future_tokens_do_not_leak():
    model = build()
    tokens = torch.randint(0, 97, (1, SEQ))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 97
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.allclose(a[0, :10], b[0, :10], atol=1e-6)
    assert not torch.allclose(a[0, 10:], b[0, 10:], atol=1e-3)


def test_doc_mask_isolates_documents():
    model = build()
    tokens = torch.randint(0, 97, (1, SEQ))
    doc_ids = torch.tensor([[0] * 6 + [1] * 10])
    changed = tokens.clone()
    changed[0, :6] = (changed[0, :6] + 5) % 97  # rewrite the first document
    with torch.no_grad():
        masked_a, masked_b = model(tokens, doc_ids), model(changed, doc_ids)
        plain_a, plain_b = model(tokens), model(changed)
    assert torch.allclose(masked_a[0, 6:], masked_b[0, 6:], atol=1e-6)  # second document never saw the first
    assert not torch.allclose(plain_a[0, 6:], plain_b[0, 6:], atol=1e-3)
    # a second document starting at its own position 0 differs from a fresh sequence only through RoPE offsets
    assert torch.allclose(model(tokens, torch.zeros_like(doc_ids)), plain_a, atol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_tables(8, 8, 32, 10000.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        qs = apply_rope(q.expand(1, 1, 32, 8).contiguous(), cos, sin)[0, 0, i]
        ks = apply_rope(k.expand(1, 1, 32, 8).contiguous(), cos, sin)[0, 0, j]
        return (qs * ks).sum()

    assert torch.allclose(score(5, 2), score(20, 17), atol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 4), atol=1e-3)


def test_partial_rope_leaves_tail_dims_alone():
    cos, sin = rope_tables(8, 4, 16, 10000.0)
    x = torch.randn(1, 2, 16, 8)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[..., 4:], x[..., 4:]) and not torch.allclose(out[..., :4], x[..., :4])


def test_rope_skip_every_and_nope_layers():
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=4, n_heads=4, rope_skip_every=2)
    model = Transformer(cfg, max_seq_len=SEQ)
    assert [layer.attn.use_rope for layer in model.layers] == [True, False, True, False]
    nope = Transformer(ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, pos="nope"), SEQ)
    assert not any(layer.attn.use_rope for layer in nope.layers)


def test_gqa_shapes_and_param_counts():
    mha, gqa, mqa = build(), build(n_kv_heads=2), build(n_kv_heads=1)
    assert mha.layers[0].attn.k_proj.weight.shape == (32, 32)
    assert gqa.layers[0].attn.k_proj.weight.shape == (16, 32)
    assert mqa.layers[0].attn.k_proj.weight.shape == (8, 32)
    assert mha.num_params() - gqa.num_params() == 2 * 2 * (32 * 16)  # 2 layers x (k, v) x halved rows
    tied, untied = build(), build(tie_embeddings=False)
    assert tied.lm_head.weight is tied.embed.weight
    assert untied.num_params() - tied.num_params() == 97 * 32
    assert untied.num_params(exclude_embedding=True) == tied.num_params()


def test_z_loss_adds_log_partition_penalty():
    tokens = torch.randint(0, 97, (2, SEQ))
    plain, with_z = build(), build(z_loss=1e-2)
    loss_plain, ce_plain = plain.loss(tokens[:, :-1], tokens[:, 1:])
    loss_z, ce_z = with_z.loss(tokens[:, :-1], tokens[:, 1:])
    z = torch.logsumexp(with_z(tokens[:, :-1]).float(), -1)
    assert torch.allclose(ce_plain, ce_z) and torch.allclose(loss_plain, ce_plain)
    assert torch.allclose(loss_z, ce_z + 1e-2 * (z**2).mean(), atol=1e-6)


def test_per_token_loss_equals_full_logits_cross_entropy():
    """Validation's per-position losses come a chunk of logits at a time; they equal cross-entropy on full logits,
    ignored targets give 0, and z-loss stays out of them."""
    from ablate.kernels.reference import per_token_cross_entropy

    model = build(z_loss=1e-2).eval()
    tokens = torch.randint(0, 97, (3, SEQ + 1))
    targets = tokens[:, 1:].clone()
    targets[0, 3] = -100
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).transpose(1, 2), targets, reduction="none")
        got = model.per_token_loss(tokens[:, :-1], targets)
        chunked = per_token_cross_entropy(
            model.hidden_states(tokens[:, :-1]), model.lm_head.weight, targets, chunk_rows=5
        )  # chunks that do not divide the 48 rows
    assert got.shape == targets.shape and got[0, 3] == 0
    assert torch.allclose(got, expected, atol=1e-5) and torch.allclose(chunked, expected, atol=1e-5)


def test_init_is_seeded_and_scaled():
    a, b = build(), build()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    std = a.layers[0].attn.q_proj.weight.std().item()
    out_std = a.layers[0].attn.o_proj.weight.std().item()
    assert abs(std - 0.02) < 0.004 and abs(out_std - 0.02 / 2) < 0.003


def init_weights_as_before(model: Transformer, generator: torch.Generator) -> None:
    """The init every earlier run used (one walk over named_modules(), output projections found by name), kept here
    to prove that the per-module init draws the same numbers."""
    cfg = model.cfg
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            if module is model.lm_head and cfg.tie_embeddings:
                continue
            scale = 1 / math.sqrt(2 * cfg.n_layers) if name.endswith(("o_proj", "down_proj")) else 1.0
            nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std * scale, generator=generator)
        elif isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


@pytest.mark.parametrize(
    "knobs",
    [
        dict(),
        dict(tie_embeddings=False),
        dict(ffn="gelu", qk_norm=True),
        dict(norm="layernorm", qk_norm=True, tie_embeddings=False, n_kv_heads=1),
        dict(ffn="relu", ffn_hidden=40, init_std=0.05),
    ],
)
def test_init_draws_the_same_weights_as_before(knobs):
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=3, n_heads=4, **knobs)
    old, new = Transformer(cfg, SEQ), Transformer(cfg, SEQ)
    for p in itertools.chain(old.parameters(), new.parameters()):
        nn.init.constant_(p, 5.0)  # so a parameter left out of either init shows
    old_gen, new_gen = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    init_weights_as_before(old, old_gen)
    new.init_weights(new_gen)
    old_state, new_state = old.state_dict(), new.state_dict()
    assert old_state.keys() == new_state.keys()
    assert all(torch.equal(old_state[k], new_state[k]) for k in old_state), [
        k for k in old_state if not torch.equal(old_state[k], new_state[k])
    ]
    assert torch.equal(old_gen.get_state(), new_gen.get_state())  # the same number of draws
    assert not any((p == 5.0).all() for p in new.parameters())


def test_forward_select_is_the_full_logits_at_those_positions():
    model = build()
    tokens = torch.randint(0, 97, (2, SEQ))
    batch, pos = torch.tensor([0, 1, 1]), torch.tensor([3, 0, 15])
    with torch.no_grad():
        assert torch.allclose(model(tokens, select=(batch, pos)), model(tokens)[batch, pos], atol=1e-6)


def test_attention_logit_max_counts_allowed_pairs_only():
    from ablate.model import attention_logit_max

    q = torch.ones(1, 2, 3, 4)
    q[:, :, 2] = 0.0  # the last query scores 0 against every key
    k = torch.ones(1, 1, 3, 4)
    k[:, :, 2] = 10.0  # the largest q.k (10 * 4 / 2 = 20) is the future pair (0 or 1, 2): causally masked
    assert attention_logit_max(q, k).item() == pytest.approx(2.0)  # 4 / sqrt(4)
    only_self = torch.eye(3, dtype=torch.bool)[None, None]
    only_self[..., 2, :] = False  # the last query attends nowhere; the others to themselves
    k[:, :, 1] = 3.0
    assert attention_logit_max(q, k, only_self).item() == pytest.approx(6.0)  # query 1 . key 1 = 12 / 2


def explicit_attention_logit_maxima(model: Transformer, tokens, doc_ids=None) -> list[float]:
    """Every layer's largest allowed q.k/sqrt(head_dim), from the whole (B, H, S, S) scores, written out from the
    weights (each layer's input taken from a hook on its attention norm)."""
    inputs = []
    hooks = [layer.attn_norm.register_forward_hook(lambda _m, _i, out: inputs.append(out)) for layer in model.layers]
    with torch.no_grad():
        model(tokens, doc_ids)
    for hook in hooks:
        hook.remove()
    batch, seq = tokens.shape
    allowed = torch.ones(seq, seq, dtype=torch.bool).tril()
    if doc_ids is not None:
        allowed = allowed & (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]
    maxima = []
    for layer, h in zip(model.layers, inputs):
        attn = layer.attn
        q = (h @ attn.q_proj.weight.T).view(batch, seq, attn.n_heads, attn.head_dim)
        k = (h @ attn.k_proj.weight.T).view(batch, seq, attn.n_kv_heads, attn.head_dim)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if attn.use_rope:
            q, k = apply_rope(q, model.rope_cos, model.rope_sin), apply_rope(k, model.rope_cos, model.rope_sin)
        k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)
        maxima.append(scores.masked_fill(~allowed, float("-inf")).amax().item())
    return maxima


@pytest.mark.parametrize(
    "knobs",
    [
        dict(),
        dict(qk_norm=True, n_kv_heads=2, rope_fraction=0.5),
        dict(norm="layernorm", pos="nope", n_kv_heads=1, tie_embeddings=False),
    ],
)
@pytest.mark.parametrize("chunk_elements", [None, 64])  # 64: one query row / one logit row per chunk
def test_stability_stats_match_explicit_computation(knobs, chunk_elements, monkeypatch):
    import ablate.model

    if chunk_elements:
        monkeypatch.setattr(ablate.model, "STATS_CHUNK_ELEMENTS", chunk_elements)
    model = build(**knobs)
    with torch.no_grad():
        attn = model.layers[1].attn  # logits far from 0 and different per layer (QK-norm undoes a q_proj scale)
        (attn.q_proj if attn.q_norm is None else attn.q_norm).weight.mul_(30.0)
    tokens = torch.randint(0, 97, (2, SEQ))
    doc_ids = torch.tensor([[0] * 6 + [1] * 10, [0] * 16])
    for docs in (None, doc_ids):
        stats = model.stability_stats(tokens, docs)
        expected = explicit_attention_logit_maxima(model, tokens, docs)
        got = [stats[f"attention_logit_max/layer{i}"] for i in range(2)]
        assert got == pytest.approx(expected, rel=1e-5) and stats["max_attention_logit"] == max(got)
        with torch.no_grad():
            logit_norm = model(tokens, docs).norm(dim=-1).mean().item()
        assert stats["output_logit_norm"] == pytest.approx(logit_norm, rel=1e-5)
    assert got[1] > 3 * got[0]


def test_stability_stats_leave_training_untouched():
    """Eval mode inside (no dropout), training mode restored, no random draws: training stays reproducible."""
    model = build(dropout=0.5).train()
    tokens = torch.randint(0, 97, (2, SEQ))
    rng = torch.get_rng_state()
    first, second = model.stability_stats(tokens), model.stability_stats(tokens)
    assert first == second and model.training and all(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)


def check_fsdp_entry_points(d) -> None:
    """Every entry point of the model parallelize makes for `d` (FSDP2-sharded above world size 1, a plain module
    at 1) gives the plain model's numbers and gradients. Sharded, only `forward` gathers the root's parameters by
    itself: the others work because parallelize registers them. The no-grad ones
    run between backward and the optimizer step (as a before_update callback would): the step after them must
    still reach the weights the next forward uses."""
    from ablate.training.parallel import parallelize

    plain = build(n_kv_heads=2, qk_norm=True, tie_embeddings=False)
    sharded = parallelize(copy.deepcopy(plain), d, param_dtype=None, compile_model=False)
    compiled = parallelize(copy.deepcopy(plain), d, param_dtype=None, compile_model=True)
    tokens = torch.randint(0, 97, (2, SEQ + 1), generator=torch.Generator().manual_seed(1))  # alike on every rank
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    doc_ids = torch.tensor([[0] * 5 + [1] * (SEQ - 5)] * 2)
    losses = {}
    for name, model in (("plain", plain), ("sharded", sharded)):
        loss, ce = model.loss(inputs, targets, doc_ids)
        loss.backward()
        losses[name] = (loss.item(), ce.item())
    assert losses["sharded"] == pytest.approx(losses["plain"], rel=1e-6)
    sharded_grads = {name: whole(p.grad) for name, p in sharded.named_parameters()}
    for name, p in plain.named_parameters():
        torch.testing.assert_close(sharded_grads[name], p.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        sharded.per_token_loss(inputs, targets, doc_ids), plain.per_token_loss(inputs, targets, doc_ids)
    )
    expected = plain.stability_stats(inputs, doc_ids)
    assert sharded.stability_stats(inputs, doc_ids) == pytest.approx(expected, rel=1e-5)
    # compiled blocks: the method reaches the original block through the compiled wrapper, with the gathers
    assert compiled.stability_stats(inputs, doc_ids) == pytest.approx(expected, rel=1e-5)
    for model in (plain, sharded):
        torch.optim.SGD(model.parameters(), lr=1.0).step()
    with torch.no_grad():
        torch.testing.assert_close(sharded(inputs, doc_ids), plain(inputs, doc_ids))


def test_entry_points_on_one_rank():
    from ablate.training.parallel import init_distributed, shutdown_distributed

    started_here = not dist.is_initialized()
    try:
        check_fsdp_entry_points(init_distributed("cpu"))
    finally:
        if started_here:
            shutdown_distributed()


@pytest.mark.slow
def test_fsdp_entry_points_on_two_gloo_ranks():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__]
    result = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr


if __name__ == "__main__":  # one rank of test_fsdp_entry_points_on_two_gloo_ranks, under torchrun
    from ablate.training.parallel import init_distributed, shutdown_distributed

    check_fsdp_entry_points(init_distributed("cpu"))
    shutdown_distributed()
