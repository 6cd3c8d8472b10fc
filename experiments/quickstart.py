"""Quickstart: an ablation decided in a few minutes on 2 CPU cores. Three variants x 3 seeds of a 0.4M-parameter
model, 205k tokens each (50 steps of 32 x 128): the default learning rate, one 10x too low, and QK-norm.

ablate run experiments/quickstart.py && ablate report runs/quickstart
"""

from ablate import DataConfig, ModelConfig, RunConfig, ScheduleConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=4096, d_model=64, n_layers=3, n_heads=4),
    # 128 validation sequences: the item set the report holds each difference against (a difference smaller than
    # that set can resolve needs more items, not more seeds)
    data=DataConfig(source="default", seq_len=128, val_sequences=128),
    schedule=ScheduleConfig(name="cosine", warmup=0.05),
    # no in-run evals: at this size the cloze tasks sit at chance, and 9 runs x ~30 s of them would double the time
    train=TrainConfig(max_steps=50, global_batch=32, micro_batch=32, log_every=10, val_every=25, ckpt_every=0),
)
runs = [
    variant(base, "baseline"),  # optim.lr's default, 3e-3
    variant(base, "low_lr", {"optim.lr": 3e-4}),
    variant(base, "qk_norm", {"model.qk_norm": True}),
]
seeds = [0, 1, 2]
