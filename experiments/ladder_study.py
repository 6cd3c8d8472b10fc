"""The ladder's six ablations at its smallest size, as an adaptive study: seeds only where a decision is open.

    ablate run experiments/ladder_study.py --until-decided      # rounds until every contrast is decided (or 8 seeds)
    ablate report runs/ladder_study

Each ablation changes one thing against the baseline (SwiGLU, MHA, cosine, AdamW at 3e-3): GeLU, MQA, WSD, Muon, a 3x
LR; ~0.4M parameters with a 4096-token BPE, 64 steps of 16 x 128 tokens, on a checkout's ../shared/data. The rule
below is fixed before any result: validation loss decides, two variants within 0.01 nats are equivalent, alpha 0.05
over all 15 contrasts, at most 8 seeds a variant. docs/reports.md has what it decided and the compute it used.
"""

from ablate import DataConfig, DecisionRule, ModelConfig, RunConfig, TrainConfig, variant

ABLATIONS = {
    "baseline": {},
    "gelu": {"model.ffn": "gelu"},
    "mqa": {"model.n_kv_heads": 1},
    "wsd": {"schedule.name": "wsd"},
    "muon": {"optim.name": "muon"},
    "lr_x3": {"optim.lr": 9e-3},
}

base = RunConfig(
    model=ModelConfig(vocab_size=4096, d_model=64, n_layers=2, n_heads=4),
    data=DataConfig(
        source="../shared/data/wiki2015/wiki-00.jsonl.gz",
        val_source="../shared/data/wiki2015/wiki-09.jsonl.gz",
        seq_len=128,
        max_documents=2000,
        val_sequences=1024,  # ~130k tokens of whole validation documents: 64 sequences held only two wiki articles
    ),
    train=TrainConfig(max_steps=64, global_batch=16, micro_batch=16, log_every=16, val_every=64, ckpt_every=64),
)
runs = [variant(base, name, changes) for name, changes in ABLATIONS.items()]
seeds = [0, 1, 2]
decision = DecisionRule(metrics=("val_loss",), margins={"val_loss": 0.01}, alpha=0.05, max_seeds=8)
