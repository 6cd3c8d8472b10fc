"""Does grouped-query attention cost quality at equal width? MHA (4 KV heads) vs GQA (2) vs MQA (1), 3 seeds.

    ablate run experiments/gqa_vs_mha.py                                   # embedded corpus
    ablate run experiments/gqa_vs_mha.py --set data.source=../shared/data/wiki2015/wiki-0[0-3].jsonl.gz \
        --set data.val_source=../shared/data/wiki2015/wiki-09.jsonl.gz
"""

from ablate import ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=128, n_layers=4, n_heads=4),
    train=TrainConfig(max_steps=300, global_batch=16, micro_batch=16, val_every=50, ckpt_every=100),
)
runs = [
    variant(base, "mha"),
    variant(base, "gqa", {"model.n_kv_heads": 2}),
    variant(base, "mqa", {"model.n_kv_heads": 1}),
]
seeds = [0, 1, 2]
