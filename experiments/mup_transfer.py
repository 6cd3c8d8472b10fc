"""Does the best learning rate transfer across width? An LR sweep at four widths (d_model 32 to 256, 8x), seven
learning rates a factor 2 apart, two seeds, under the standard parametrization and under μP (base_width 32): 112
small runs. Under "sp" the optimum falls as the model widens; under "mup" it stays where d_model=32 put it.

    ablate run experiments/mup_transfer.py --stack 14 --jobs 2
    ablate report runs/mup_transfer --scale model.d_model
    python scripts/check_transfer.py experiments/mup_transfer.py       # the coordinate check, the same models
On the wiki shards of a checkout's ../shared/data: --set data.source=../shared/data/wiki2015/wiki-00.jsonl.gz
--set data.val_source=../shared/data/wiki2015/wiki-09.jsonl.gz. The measured sweep: docs/recipes.md.
"""

from ablate import DataConfig, ModelConfig, RunConfig, ScheduleConfig, TrainConfig, grid

base = RunConfig(
    # base_width is read only under "mup": the width whose numbers "sp" gives exactly (the tuned proxy)
    model=ModelConfig(vocab_size=2048, d_model=32, n_layers=2, n_heads=4, base_width=32),
    data=DataConfig(source="default", seq_len=128, val_sequences=32),
    schedule=ScheduleConfig(name="cosine", warmup=0.05),
    train=TrainConfig(max_steps=120, global_batch=8, micro_batch=8, log_every=20, val_every=0, ckpt_every=0),
)
runs = grid(
    base,
    {
        "model.parametrization": ["sp", "mup"],
        "model.d_model": [32, 64, 128, 256],
        "optim.lr": [0.05 / 2**k for k in range(7)],  # 5e-2 down to 7.8e-4
    },
)
seeds = [0, 1]
