"""Batch-size schedules at equal tokens: a constant batch of 32 against growing batches that end at 32.

    ablate run experiments/batch_ramp.py --jobs 2
    ablate report runs/batch_ramp

Every variant sees the same 614k tokens (150 steps of the constant batch); smaller early batches take more, cheaper
steps. `ramp` grows linearly in tokens from 8 to 32 over the first half of the tokens; `ramp_sqrt_lr` also scales
the LR by sqrt(batch / 32); `dynamic` starts at 8 and doubles each time the tokens seen double past 77k. Growing
the batch during training is the batch-size warmup of the lecture seed 002 (the critical batch grows as training
goes on); the doubling rule is ours: the batch-size paper's abstract (seed 001) proposes a dynamic scheduler but
does not give its rule. On a checkout's ../shared/data.
"""

from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

TOKENS = 150 * 32 * 128
base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=64, n_layers=4, n_heads=4),
    data=DataConfig(
        source="../shared/data/wiki2015/wiki-00.jsonl.gz",
        val_source="../shared/data/wiki2015/wiki-09.jsonl.gz",
        seq_len=128,
        max_documents=2000,
    ),
    train=TrainConfig(max_steps=150, global_batch=32, micro_batch=8, log_every=10, val_every=25, ckpt_every=100),
)
ramp = {"train.batch_schedule": "ramp", "train.batch_start": 8, "train.batch_ramp_tokens": TOKENS // 2}
runs = [
    variant(base, "constant_32"),
    variant(base, "ramp", ramp),
    variant(base, "ramp_sqrt_lr", {**ramp, "train.batch_lr_scaling": "sqrt"}),
    variant(
        base,
        "dynamic",
        {"train.batch_schedule": "dynamic", "train.batch_start": 8, "train.batch_ramp_tokens": TOKENS // 8},
    ),
]
seeds = [0, 1]
