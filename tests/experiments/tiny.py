"""A tiny experiment for tests: two variants on 400 documents of the embedded corpus, a few seconds each."""

from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    experiment="tiny",
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    data=DataConfig(source="default", max_documents=400, seq_len=32, val_sequences=8),
    train=TrainConfig(
        max_steps=8, global_batch=8, micro_batch=4, log_every=1, val_every=4, ckpt_every=4, peak_flops=1e11
    ),
)
runs = [variant(base, "mha"), variant(base, "mqa", {"model.n_kv_heads": 1})]
seeds = [0]
