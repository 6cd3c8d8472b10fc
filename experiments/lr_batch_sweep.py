"""An LR x batch-size grid, two seeds: 12 small runs. On 2 CPU cores, two at a time:

    ablate run experiments/lr_batch_sweep.py --jobs 2
    ablate status runs/lr_batch_sweep
    ablate report runs/lr_batch_sweep
Batch 32 takes twice the tokens per step: the report compares runs at equal tokens.
"""

from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, grid

base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=64, n_layers=4, n_heads=4),
    data=DataConfig(source="default", seq_len=256),
    train=TrainConfig(max_steps=200, global_batch=16, micro_batch=16, log_every=10, val_every=25, ckpt_every=100),
)
runs = grid(
    base, {"optim.lr": [1e-3, 3e-3, 1e-2], "train.global_batch": [16, 32]}
)  # named lr=0.001,global_batch=16 ...
seeds = [0, 1]
