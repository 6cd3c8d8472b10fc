"""Mixture of experts against a dense FFN at equal active parameters, 3 seeds.

The dense SwiGLU FFN of d_model 128 has a hidden size of 352; each MoE layer sends a token to 2 of 8 experts of
hidden size 176, so a token meets the same FFN parameters (2 x 176 = 352) while the layer holds 4x as many.
Two ways of keeping the experts balanced: Switch's auxiliary loss, and DeepSeek-V3's per-expert bias.

    ablate run experiments/moe_vs_dense.py --jobs 2                        # embedded corpus
    ablate run experiments/moe_vs_dense.py --jobs 2 --set data.source=../shared/data/wiki2015/wiki-0[0-3].jsonl.gz \
        --set data.val_source=../shared/data/wiki2015/wiki-09.jsonl.gz
    ablate report runs/moe_vs_dense
metrics.jsonl has each MoE layer's expert load (moe/load_max_over_mean/layer{i}) and the balancing loss.
"""

from ablate import ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=128, n_layers=4, n_heads=4),
    train=TrainConfig(max_steps=300, global_batch=16, micro_batch=16, val_every=50, ckpt_every=100),
)
moe = {"model.ffn": "moe", "model.moe_experts": 8, "model.moe_top_k": 2, "model.moe_hidden": 176}
runs = [
    variant(base, "dense"),
    variant(base, "moe_aux_loss", moe),
    variant(base, "moe_bias", {**moe, "model.moe_balance": "bias"}),
]
seeds = [0, 1, 2]
