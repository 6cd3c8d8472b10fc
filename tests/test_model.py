import itertools

import pytest
import torch

from ablate.config import ModelConfig, validate, RunConfig
from ablate.model import Transformer, apply_rope, rope_tables

SEQ = 16


def build(**knobs) -> Transformer:
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, **knobs)
    validate(RunConfig(model=cfg))
    model = Transformer(cfg, max_seq_len=SEQ)
    model.init_weights(torch.Generator().manual_seed(0))
    return model


KNOBS = [dict(ffn=f, norm=n, pos=p, qk_norm=q, tie_embeddings=t, n_kv_heads=k)
         for f, n, p, q, t, k in itertools.product(["swiglu", "gelu", "relu"], ["rmsnorm", "layernorm"],
                                                  ["rope", "nope"], [False, True], [True, False], [None, 2, 1])]


@pytest.mark.parametrize("knobs", KNOBS[::5] + [dict(rope_skip_every=2), dict(rope_fraction=0.5),
                                                 dict(z_loss=1e-4), dict(ffn_hidden=40)])
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
        expected = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).transpose(1, 2), targets,
                                                     reduction="none")
        got = model(tokens[:, :-1], targets=targets, per_token=True)
        chunked = per_token_cross_entropy(model.hidden_states(tokens[:, :-1]), model.lm_head.weight, targets,
                                          chunk_rows=5)  # chunks that do not divide the 48 rows
    assert got.shape == targets.shape and got[0, 3] == 0
    assert torch.allclose(got, expected, atol=1e-5) and torch.allclose(chunked, expected, atol=1e-5)


def test_init_is_seeded_and_scaled():
    a, b = build(), build()
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    std = a.layers[0].attn.q_proj.weight.std().item()
    out_std = a.layers[0].attn.o_proj.weight.std().item()
    assert abs(std - 0.02) < 0.004 and abs(out_std - 0.02 / 2) < 0.003
