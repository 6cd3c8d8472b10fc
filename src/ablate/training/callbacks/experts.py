"""The ExpertBalance callback of models with experts (model.ffn="moe"): their routing metrics, and the router bias
update that balances them (model.moe_balance="bias")."""

from __future__ import annotations

import torch

from ablate.training.callbacks.base import Callback, TrainerView, due


class ExpertBalance(Callback):
    """After each step of a model with experts (model.ffn="moe"): every MoE layer's routing of the step (tokens per
    expert, balancing and router z-losses, choices dropped over capacity), summed over its micro-batches and every
    rank; with `update_bias` (moe_balance="bias"), each router's bias moved from that load (DeepSeek-V3), once per
    optimizer step and alike on every rank, so any world size routes the same. First in order, so validation and
    the checkpoint see the moved bias. A skipped update still moves the bias (the load was measured); a rollback
    restores it with the weights. Every `log_every` steps: per layer the share of choices each expert took and its
    max over mean (1: balanced), the mean losses, the share of choices dropped."""

    name, order = "expert_balance", 5

    def __init__(self, log_every: int, update_bias: bool):
        self.log_every, self.update_bias = log_every, update_bias

    def pre_train(self, trainer: TrainerView) -> None:
        for router in trainer.model.routers().values():
            router.take_step_stats()  # a rolled-back step's routing is forgotten

    def acts_at(self, trainer: TrainerView) -> bool:
        return due(trainer.step, self.log_every, trainer.max_steps)

    def post_step(self, trainer: TrainerView) -> None:
        routers = trainer.model.routers()
        stats = torch.stack([router.take_step_stats() for router in routers.values()])
        stats = trainer.dist.sum_tensor(stats)  # every rank's passes: [load per expert..., aux, z, dropped, passes]
        loads, (aux, z, dropped, passes) = stats[:, :-4], stats[:, -4:].unbind(dim=1)
        if self.update_bias:
            for router, load in zip(routers.values(), loads):
                router.update_bias(load)
        if not self.acts_at(trainer):
            return
        shares = (loads / loads.sum(dim=1, keepdim=True).clamp(min=1)).tolist()
        fields = {
            "moe/aux_loss": (aux / passes.clamp(min=1)).mean().item(),
            "moe/z_loss": (z / passes.clamp(min=1)).mean().item(),
            "moe/dropped": (dropped.sum() / loads.sum().clamp(min=1)).item(),
        }
        for layer, share in zip(routers, shares):
            fields[f"moe/load_max_over_mean/layer{layer}"] = max(share) * len(share)
            fields[f"moe/load/layer{layer}"] = [round(x, 5) for x in share]  # metrics.jsonl only: not a scalar
        trainer.log(fields)
