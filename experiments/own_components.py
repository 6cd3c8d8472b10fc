"""Your own idea from your experiment file, with no package edit: an optimizer (Lion), an FFN (squared ReLU), an
attention score modification (a recency bias with a typed option), a cloze task from a local file and a metric a
callback logs, each registered here and used like ablate's own on every path (--jobs, --stack, torchrun, SLURM).

ablate run experiments/own_components.py --jobs 2
ablate report runs/own_components --metric ffn_out_rms:lower
"""

from dataclasses import dataclass

import torch
from torch import nn

import ablate
from ablate import Callback, DataConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig, variant
from ablate.optim import shard_elements


@ablate.register_optimizer("lion")
class Lion(torch.optim.Optimizer):
    """Chen et al. 2023: the sign of an interpolated momentum, decoupled weight decay; one state per parameter."""

    def __init__(self, groups, cfg):
        super().__init__(groups, dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.lerp_(p.grad, 1 - beta2)

    @staticmethod
    def state_elements(shapes, world):  # the momentum
        return shard_elements(shapes.root + shapes.all_blocks, world)

    @staticmethod
    def transient_elements(shapes, world):  # sign(...) of the largest parameter
        return max(shard_elements([s], world) for s in shapes.root + shapes.block)


@ablate.register_component("ffn", "relu2")
class SquaredReLU(nn.Module):
    """So et al. 2021 (Primer): relu(x W1)^2 W2."""

    def __init__(self, config, layer_index):
        super().__init__()
        self.up = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)).square())


@ablate.register_component("score_mod", "recency")
class Recency:
    """Scores of far keys lowered by recency x log(1 + distance): a soft pull towards recent tokens."""

    @dataclass
    class Options:
        recency: float = 0.5

    def __init__(self, config):
        self.weight = ablate.options_for(config, Recency).recency

    def __call__(self, score, b, h, q_idx, kv_idx):
        return score - self.weight * torch.log1p((q_idx - kv_idx).clamp(min=0).float())


ablate.register_task("capitals", "data/capitals.jsonl", context="question", choices="options", answer="label")


class FfnOutputRms(Callback):
    """Logs the RMS of the last block's FFN output weights at every validation step: a metric to decide on."""

    name = "ffn_out_rms"

    def __init__(self, every: int):
        self.every = every

    def post_step(self, trainer):
        if trainer.step % self.every == 0 or trainer.step == trainer.max_steps:
            last = list(trainer.model.layers[-1].ffn.parameters())[-1]
            trainer.log({"ffn_out_rms": ablate.whole(last.detach()).pow(2).mean().sqrt().item()})


base = RunConfig(
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    data=DataConfig(max_documents=400, seq_len=32, val_sequences=16),
    train=TrainConfig(max_steps=12, global_batch=8, micro_batch=8, val_every=6, ckpt_every=6, log_every=6),
    eval=EvalConfig(tasks="capitals", limit=0),
)
runs = [
    variant(base, "baseline"),
    variant(base, "relu2_recency", {"model.ffn": "relu2", "model.score_mod": "recency"}),
    variant(base, "lion", {"optim.name": "lion", "optim.lr": 3e-4}),
]
seeds = [0, 1, 2]
callbacks = [FfnOutputRms(every=6)]
