"""Muon against AdamW at the same LR, weight decay and schedule (and Muon at a higher LR), three seeds.

    ablate run experiments/muon_vs_adamw.py --jobs 2
    ablate report runs/muon_vs_adamw

Muon orthogonalises the momentum of the blocks' 2-D matrices (Newton-Schulz) and scales the update so the AdamW LR
carries over; the embedding, norms and (untied) head stay on AdamW. On a checkout's ../shared/data.
"""

from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=64, n_layers=4, n_heads=4),
    data=DataConfig(
        source="../shared/data/wiki2015/wiki-00.jsonl.gz",
        val_source="../shared/data/wiki2015/wiki-09.jsonl.gz",
        seq_len=128,
        max_documents=2000,
    ),
    train=TrainConfig(max_steps=300, global_batch=16, micro_batch=16, log_every=10, val_every=30, ckpt_every=100),
)
runs = [
    variant(base, "adamw"),
    variant(base, "muon", {"optim.name": "muon"}),
    variant(base, "muon_lr=0.01", {"optim.name": "muon", "optim.lr": 1e-2}),
]  # Muon is known to take higher LRs
seeds = [0, 1, 2]
