"""A tiny adaptive study for tests: a baseline, its twin (LR changed by one part in a million) and a clear loser
(LR / 100), on 400 documents of the embedded corpus, a few seconds a run."""

from ablate import DataConfig, DecisionRule, ModelConfig, OptimConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    experiment="tiny_study",
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    data=DataConfig(source="default", max_documents=400, seq_len=32, val_sequences=128, val_fraction=0.2),
    optim=OptimConfig(lr=3e-3),
    train=TrainConfig(
        max_steps=40, global_batch=8, micro_batch=8, log_every=10, val_every=40, ckpt_every=40, peak_flops=1e11
    ),
)
runs = [
    variant(base, "baseline"),
    variant(base, "twin", {"optim.lr": 3e-3 * (1 + 1e-6)}),
    variant(base, "loser", {"optim.lr": 3e-3 / 100}),
]
seeds = [0, 1, 2]
decision = DecisionRule(metrics=("val_loss",), max_seeds=6)
