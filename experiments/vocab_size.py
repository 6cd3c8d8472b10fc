"""Vocabulary size: BPE of 8k, 16k and 32k tokens trained on the same text, 3 seeds.

Loss per token is not comparable across tokenizers (a larger vocabulary puts more text in each token), so
`ablate report` compares these runs in bits per byte of the validation text, and says so. `ablate tokenizer`
gives each vocabulary's fertility and continued-word rate on the same text.

    ablate tokenizer default --tokenizers bpe:8192,bpe:16384,bpe:32768
    ablate run experiments/vocab_size.py --jobs 2                          # embedded corpus
    ablate run experiments/vocab_size.py --jobs 2 --set data.source=../shared/data/wiki2015/wiki-0[0-3].jsonl.gz \
        --set data.val_source=../shared/data/wiki2015/wiki-09.jsonl.gz
    ablate report runs/vocab_size
The embedding grows with the vocabulary (128 x 32768 = 4.2M parameters against 1.0M): the report's runs table
shows each run's parameters beside its bits per byte.
"""

from ablate import ModelConfig, RunConfig, TrainConfig, variant

base = RunConfig(
    model=ModelConfig(vocab_size=8192, d_model=128, n_layers=4, n_heads=4),
    train=TrainConfig(max_steps=300, global_batch=16, micro_batch=16, val_every=50, ckpt_every=100),
)
runs = [variant(base, f"bpe{size // 1024}k", {"model.vocab_size": size}) for size in (8192, 16384, 32768)]
seeds = [0, 1, 2]
