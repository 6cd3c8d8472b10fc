"""Multi-head latent attention against grouped-query attention: KV-cache memory against loss, 3 seeds.

`ablate plan experiments/mla_vs_gqa.py` shows each variant's KV-cache bytes per token before any compute; the
report's runs table shows them beside each run's validation loss: KV memory vs loss in one table.

    ablate run experiments/mla_vs_gqa.py --jobs 2                          # embedded corpus
    ablate run experiments/mla_vs_gqa.py --jobs 2 --set data.source=../shared/data/wiki2015/wiki-0[0-3].jsonl.gz \
        --set data.val_source=../shared/data/wiki2015/wiki-09.jsonl.gz
    ablate report runs/mla_vs_gqa
"""

from ablate import ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=128, n_layers=4, n_heads=4),
    train=TrainConfig(max_steps=300, global_batch=16, micro_batch=16, val_every=50, ckpt_every=100),
)
runs = [
    variant(base, "mha"),  # 4 KV heads of 32: 256 numbers per token and layer in the cache
    variant(base, "gqa", {"model.n_kv_heads": 2}),  # 2 KV heads of 32: 128
    # a 64-wide latent plus a 16-wide RoPE key shared by the heads: 80
    variant(base, "mla", {"model.attention": "mla", "model.kv_lora_rank": 64, "model.qk_rope_dim": 16}),
]
seeds = [0, 1, 2]
