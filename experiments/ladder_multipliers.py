"""Effects in the currency of compute: each arm at several budgets around its rung's, at two sizes.

    ablate plan experiments/ladder_multipliers.py
    ablate run experiments/ladder_multipliers.py --jobs 2
    ablate report runs/ladder_multipliers --scale model.d_model --baseline baseline

A baseline (SwiGLU, MHA, AdamW at 3e-3) and two ablations, Muon and MQA, at d_model 64 and 128 (2 layers, a 4096-token
BPE, 16 x 128 tokens a step, on a checkout's ../shared/data). Each arm is `compute_points`: one WSD run per seed to
its longest budget (the baseline's 4x, the ablations' 2x the rung's steps), and branches from its stable phase that
decay to the shorter budgets (0.5x, 1x), so every point ends annealed. The baseline's points give its loss-vs-compute
curve on each rung (spanning 8x: an ablation worth more than 2x still lands between its points); an ablation's compute
multiplier is the baseline's compute at the ablation's loss over the ablation's compute (FLOPs from each model's own
count, so MQA's smaller attention is paid for in FLOPs, not tokens). The 1x runs, named as the arms, are what the
pairwise comparisons see. docs/reports.md has what it measured and the compute it took (60 runs).
"""

from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, compute_points, variant

ARMS = {"baseline": {}, "muon": {"optim.name": "muon"}, "mqa": {"model.n_kv_heads": 1}}
RUNGS = {64: 64, 128: 96}  # d_model: the rung's budget in steps (1x)
# the baseline's curve reaches 4x: an ablation worth more than 2x the compute still lands between its points
BASELINE_BUDGETS = (0.5, 1, 2, 4)

base = RunConfig(
    model=ModelConfig(vocab_size=4096, d_model=64, n_layers=2, n_heads=4),
    data=DataConfig(
        source="../shared/data/wiki2015/wiki-00.jsonl.gz",
        val_source="../shared/data/wiki2015/wiki-09.jsonl.gz",
        seq_len=128,
        max_documents=2000,
        val_sequences=1024,  # ~130k tokens of whole validation documents
    ),
    train=TrainConfig(max_steps=64, global_batch=16, micro_batch=16, log_every=16, val_every=32, ckpt_every=64),
)
runs = [
    run
    for d_model, steps in RUNGS.items()
    for arm, changes in ARMS.items()
    for run in compute_points(
        variant(base, arm, {**changes, "model.d_model": d_model, "train.max_steps": steps}),
        f"{arm}@d{d_model}",
        budgets=BASELINE_BUDGETS if arm == "baseline" else (0.5, 1, 2),
    )
]
seeds = [0, 1, 2]
multiplier_baseline = "baseline"  # recorded in every run folder: `ablate report` measures against it unasked
