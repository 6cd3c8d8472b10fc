"""A scale ladder of six real ablations: which eval signal ranks small models as a larger model would.

    ablate plan experiments/ladder.py
    ablate run experiments/ladder.py --jobs 2
    ablate eval runs/ladder --every-checkpoint --tasks small --limit 100
    ablate report runs/ladder --scale model.d_model,model.n_layers

Each ablation changes one thing against the baseline (SwiGLU, MHA, cosine, AdamW at 3e-3): GeLU, MQA, WSD, Muon,
a 3x LR. Three sizes (about 0.4M, 1.3M and 5.8M parameters with a 4096-token BPE), tokens growing with size, three
seeds; four checkpoints kept per run (25/50/75/100% of training) so every task x metric is scored along training.
The report compares each smaller size's ranking of the six variants with the largest's (decision accuracy), per task
and metric, beside validation loss. On a checkout's ../shared/data.
"""

from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

# (name, d_model, n_layers, n_heads, steps): 16 x 128 tokens per step
SIZES = [("s", 64, 2, 4, 64), ("m", 128, 4, 4, 120), ("l", 256, 6, 4, 160)]
ABLATIONS = {
    "baseline": {},
    "gelu": {"model.ffn": "gelu"},
    "mqa": {"model.n_kv_heads": 1},
    "wsd": {"schedule.name": "wsd"},
    "muon": {"optim.name": "muon"},
    "lr_x3": {"optim.lr": 9e-3},
}


def _base(d_model: int, n_layers: int, n_heads: int, steps: int) -> RunConfig:
    quarter = steps // 4
    return RunConfig(
        model=ModelConfig(vocab_size=4096, d_model=d_model, n_layers=n_layers, n_heads=n_heads),
        data=DataConfig(
            source="../shared/data/wiki2015/wiki-00.jsonl.gz",
            val_source="../shared/data/wiki2015/wiki-09.jsonl.gz",
            seq_len=128,
            max_documents=2000,
        ),
        train=TrainConfig(
            max_steps=steps,
            global_batch=16,
            micro_batch=16,
            log_every=10,
            val_every=quarter,
            ckpt_every=quarter,
            keep_checkpoints=4,
        ),
    )


runs = [
    variant(_base(d, n, h, steps), f"{name}@{size}", changes)
    for size, d, n, h, steps in SIZES
    for name, changes in ABLATIONS.items()
]
seeds = [0, 1, 2]
