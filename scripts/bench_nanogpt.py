"""One training step of ablate against a nanoGPT-style trainer on nanoGPT's shape, interleaved in one process.

    python scripts/bench_nanogpt.py                    # d256, 6 layers, 8 heads, vocab 16384, seq 512, batch 8
    python scripts/bench_nanogpt.py --dtypes bf16 --steps 12
    python scripts/bench_nanogpt.py --smoke            # a tiny shape, 1 step a side: checks it runs

The reference is the plain loop nanoGPT's train.py runs, written here from its description: a GPT with learned
positions, pre-LayerNorm blocks without biases, one fused QKV projection, causal SDPA, a 4x GELU MLP, the head tied
to the embedding, cross-entropy over the whole logits; AdamW (0.9, 0.95), weight decay on matrices only, gradient
clipping at 1; bf16 as torch.autocast around the forward. ablate's side is the real Trainer (FSDP2 on a 1-rank gloo
group, as `ablate run`) on the nearest architecture it has (GELU MLP, LayerNorm, RoPE in place of learned positions),
so the two models' FLOPs differ only by the position embedding. Steps alternate between the sides so that whatever
else the machine does slows both alike; the medians are compared. Both run eagerly.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ablate.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from ablate.setup.checks import check_run  # noqa: E402
from ablate.training.parallel import init_distributed  # noqa: E402
from ablate.training.trainer import Trainer  # noqa: E402

SHAPES = {  # (vocab, d_model, layers, heads, seq, batch)
    "nanogpt": (16384, 256, 6, 8, 512, 8),
    "smoke": (512, 32, 2, 4, 32, 4),
}


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv, self.attn_out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.fc_out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        batch, seq, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, seq, d)
        x = x + self.attn_out(y)
        return x + self.fc_out(F.gelu(self.fc(self.ln_2(x))))


class ReferenceGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.token, self.position = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, inputs, targets):
        x = self.token(inputs) + self.position(torch.arange(inputs.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.token.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class ReferenceTrainer:
    """nanoGPT's step: forward under autocast (bf16) or not, backward, clip, AdamW, zero_grad."""

    def __init__(self, shape: tuple[int, ...], dtype: str):
        vocab, d, layers, heads, self.seq, self.batch = shape
        torch.manual_seed(0)
        self.model = ReferenceGPT(vocab, d, layers, heads, self.seq)
        matrices = [p for p in self.model.parameters() if p.dim() >= 2]
        vectors = [p for p in self.model.parameters() if p.dim() < 2]
        groups = [{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))
        self.vocab, self.dtype = vocab, dtype

    def train_step(self):
        data = torch.randint(0, self.vocab, (self.batch, self.seq + 1))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bf16"):
            loss = self.model(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def ablate_config(shape: tuple[int, ...], dtype: str, documents: int | None) -> RunConfig:
    vocab, d, layers, heads, seq, batch = shape
    model = ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, ffn="gelu", norm="layernorm")
    return RunConfig(
        experiment="bench_nanogpt",
        name=dtype,
        model=model,
        data=DataConfig(source="default", seq_len=seq, max_documents=documents),
        train=TrainConfig(
            max_steps=10_000, global_batch=batch, micro_batch=batch, dtype=dtype, compile=False, peak_flops=1.0
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per side and dtype")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per side and dtype")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape, 1 warm-up and 1 timed step")
    args = parser.parse_args()
    shape = SHAPES["smoke" if args.smoke else "nanogpt"]
    if args.smoke:
        args.steps, args.warmup = 1, 1
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    print(
        f"shape vocab {shape[0]}, d_model {shape[1]}, {shape[2]} layers, {shape[3]} heads, seq {shape[4]}, "
        f"batch {shape[5]}; {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}"
    )
    d = init_distributed("auto")
    ratios = {}
    with tempfile.TemporaryDirectory() as out:
        for dtype in args.dtypes.split(","):
            run = ablate_config(shape, dtype, 400 if args.smoke else None)
            sides = {
                "ablate": Trainer(check_run(run, d.world), Path(out) / dtype, d, callbacks=[]),
                "nanoGPT-style": ReferenceTrainer(shape, dtype),
            }
            sides["ablate"].start_time = time.perf_counter()
            times = {name: [] for name in sides}
            for i in range(args.warmup + args.steps):
                for name, trainer in sides.items():
                    start = time.perf_counter()
                    trainer.train_step()
                    if i >= args.warmup:
                        times[name].append(time.perf_counter() - start)
            tokens = shape[4] * shape[5]
            for name, values in times.items():
                step = statistics.median(values)
                print(f"{dtype} {name:>13}: step {step * 1e3:.0f} ms, {tokens / step:,.0f} tok/s", flush=True)
            ratios[dtype] = statistics.median(times["nanoGPT-style"]) / statistics.median(times["ablate"])
            assert math.isfinite(sides["ablate"].last_loss)
    for dtype, ratio in ratios.items():
        print(f"ratio step time nanoGPT-style / ablate, {dtype}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
