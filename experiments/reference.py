"""The reference run: a 1.9M-parameter model trained on 1M tokens of the embedded corpus (about 2 minutes on 2 CPU
cores), then scored on four cloze tasks. The speed and regression reference of docs/performance.md (its final_loss is
kept bit-identical across changes that should not move it) and the run scripts/bench_eval.py loads.

ablate run experiments/reference.py
"""

from ablate import DataConfig, EvalConfig, ModelConfig, RunConfig, ScheduleConfig, TrainConfig

runs = [
    RunConfig(
        name="baseline",
        model=ModelConfig(vocab_size=8192, d_model=128, n_layers=4, n_heads=4),
        data=DataConfig(source="default", seq_len=256),
        schedule=ScheduleConfig(name="cosine", warmup=0.05),
        train=TrainConfig(max_steps=250, global_batch=16, micro_batch=16, val_every=125, ckpt_every=125),
        # a small, fast slice of the cloze suite at the end (~30 s); `ablate eval RUN` scores all of it
        eval=EvalConfig(tasks="arc_easy,hellaswag,piqa,copa", limit=200),
    )
]
