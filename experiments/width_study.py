"""Width study: d_model 32 / 64 / 128 at 4 layers, 3 seeds (9 runs), with val loss and four cloze tasks.

    ablate run experiments/width_study.py --jobs 2
    ablate report runs/width_study --scale model.d_model     # or without --scale: widths as variants
On the wiki shards of a checkout's ../shared/data: --set data.source=../shared/data/wiki2015/wiki-00.jsonl.gz
--set data.val_source=../shared/data/wiki2015/wiki-09.jsonl.gz
"""

from ablate import DataConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig, grid

base = RunConfig(
    model=ModelConfig(vocab_size=8192, n_layers=4, n_heads=4),
    data=DataConfig(source="default", seq_len=256),
    train=TrainConfig(max_steps=200, global_batch=16, micro_batch=16, log_every=10, val_every=50, ckpt_every=100),
    eval=EvalConfig(tasks="arc_easy,hellaswag,piqa,sciq", every=50, limit=200),
)
runs = grid(base, {"model.d_model": [32, 64, 128]})
seeds = [0, 1, 2]
