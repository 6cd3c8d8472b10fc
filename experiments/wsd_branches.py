"""WSD cooldowns from one stable run: the stable phase trains once, and each decay is a branch from its checkpoint.

    ablate run experiments/wsd_branches.py --jobs 2
    ablate report runs/wsd_branches

`stable` holds the peak LR to the end (no cooldown). At 80% of its steps three branches decay over the last 20% with
a linear, cosine or 1-sqrt shape; a fourth starts its decay at 60% (a longer cooldown, linear); a fifth decays like
`decay_linear` while moving the mix toward the textbooks (MiniCPM's higher-quality data in the decay). Branches
share the parent's curve up to their start, and their first step repeats the parent's next one exactly. On the text
of a checkout's ../shared/data (run from the repository's root).
"""

from ablate import DataConfig, ModelConfig, RunConfig, ScheduleConfig, TrainConfig, branch, variant

WIKI, BOOKS = "../shared/data/wiki2015/wiki-0[0-1].jsonl.gz", "../shared/data/openstax/openstax-00.jsonl.gz"
base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=64, n_layers=4, n_heads=4),
    data=DataConfig(source=f"{WIKI}:0.9,{BOOKS}:0.1", seq_len=128, max_documents=3000),
    schedule=ScheduleConfig(name="constant", warmup=0.05),
    train=TrainConfig(max_steps=300, global_batch=16, micro_batch=16, log_every=10, val_every=30, ckpt_every=100),
)
stable = variant(base, "stable")
decay = {"schedule.name": "wsd", "schedule.decay": 0.2}
runs = [
    stable,
    *[
        branch(stable, at=0.8, name=f"decay_{shape}", changes={**decay, "schedule.decay_shape": shape})
        for shape in ("linear", "cosine", "sqrt")
    ],
    branch(stable, at=0.6, name="decay_linear_40pct", changes={**decay, "schedule.decay": 0.4}),
    branch(stable, at=0.8, name="decay_linear_books", changes={**decay, "data.source": f"{WIKI}:0.5,{BOOKS}:0.5"}),
]
seeds = [0, 1, 2]
