"""The mixture of experts (MoE, a layer's FFN under model.ffn="moe") and its parts: the router, which picks each
token's experts and keeps the balance statistics, and the experts, dispatched in shapes no routing changes (no host
read, one compiled graph) and combined in a fixed order (bit-identical reruns).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.components.parametrization import residual_init_std
from ablate.config import ModelConfig
from ablate.kernels import swiglu


def within_capacity(expert: torch.Tensor, experts: int, capacity: int) -> torch.Tensor:
    """(T, k) bool: True where a token's choice is among the first `capacity` its expert takes, counted over every
    token's first choice, then every second choice... (GShard's order)."""
    one_hot = (expert.T.flatten()[:, None] == torch.arange(experts, device=expert.device)).long()  # no range check
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # how many took the expert before
    return (position < capacity).view(expert.shape[1], expert.shape[0]).T


# torch._grouped_mm runs on CPU and on every CUDA device from torch 2.9 (2.8: Hopper and bf16 only)
HAS_GROUPED_MM = torch.torch_version.TorchVersion(torch.__version__) >= (2, 9)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """x (N, in), its rows in runs by group; weight (G, out, in); ends (G,) int32, where each run ends (the last at
    N) -> (N, out): each row times its group's weight, without reading `ends` on the host.

    torch._grouped_mm where it runs: eager on any device (on CUDA one kernel for bf16 on sm90+; torch's loop of
    matmuls otherwise, which does read `ends`), and in a compiled graph for bf16 (the one dtype its shape check
    admits), for rows of a multiple of 16 bytes. Elsewhere eager reads `ends` once and runs a matmul per group; a
    compiled graph (fp32, odd sizes, torch < 2.9) sends every row through every group's weight and keeps its own:
    fixed shapes at G times the FLOPs."""
    if torch.is_autocast_enabled(x.device.type):  # both in the low precision, as F.linear under autocast
        low = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(low), weight.to(low)
    aligned = all(n * x.element_size() % 16 == 0 for n in weight.shape[1:])
    if HAS_GROUPED_MM and aligned and (x.dtype == torch.bfloat16 or not torch.compiler.is_compiling()):
        return torch._grouped_mm(x, weight.transpose(-2, -1), offs=ends)
    if not torch.compiler.is_compiling():  # eager: one host read of the ends, each group's rows through its weight
        starts = [0, *ends.tolist()]
        return torch.cat([F.linear(x[a:b], w) for a, b, w in zip(starts, starts[1:], weight)])
    group = torch.searchsorted(ends, torch.arange(len(x), device=x.device, dtype=ends.dtype), right=True)[:, None]
    return sum(torch.where(group == g, F.linear(x, w), 0.0) for g, w in enumerate(weight))


class Router(nn.Module):
    """Which moe_top_k experts each token goes to, with what gates. moe_balance="aux_loss" (Switch, GShard): softmax
    probabilities, the top k, their gates renormalised to sum 1 when k > 1 (Switch's top-1 keeps the probability);
    the balancing loss experts * sum_i f_i P_i (f_i: the share of the pass's choices that went to expert i, P_i:
    its mean probability; 1 when balanced). "bias" (DeepSeek-V3, auxiliary-loss-free): sigmoid affinities; the top
    k of affinity + bias are chosen, but gates come from the affinities alone (normalised when k > 1: one gate would
    be 1 and leave the router untrained); after each optimizer step the bias moves by moe_bias_rate * sign(mean
    load - load), the step's load summed over every micro-batch and rank (update_bias, from a callback). The same
    balancing loss is computed on the normalised affinities (moe_aux_loss, DeepSeek-V3's small extra loss, but per
    pass rather than per sequence). The router computes in fp32."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.experts, self.top_k, self.balance = cfg.moe_experts, cfg.moe_top_k, cfg.moe_balance
        self.capacity, self.bias_rate = cfg.moe_capacity, cfg.moe_bias_rate
        self.gate = nn.Linear(cfg.d_model, cfg.moe_experts, bias=False)
        self.register_buffer("bias", torch.zeros(cfg.moe_experts))  # persistent: checkpointed with the weights
        # summed over this step's training passes (see take_step_stats, which the trainer calls before training, so
        # that every pass of a compiled step adds to a tensor: one graph, not one for the first pass and one after)
        self.step_stats: torch.Tensor | None = None

    def forward(self, x: torch.Tensor):
        """x (T, d_model) -> expert (T, k), gate (T, k), keep (T, k) (None: no capacity limit), aux loss, z-loss."""
        with torch.autocast(x.device.type, enabled=False):  # bf16 logits would tie and flip choices
            logits = F.linear(x.float(), self.gate.weight.float())
        if self.balance == "aux_loss":
            probs = logits.softmax(dim=-1)
            gate, expert = probs.topk(self.top_k, dim=-1)
        else:
            affinity = logits.sigmoid()
            expert = (affinity + self.bias).topk(self.top_k, dim=-1).indices
            gate, probs = affinity.gather(-1, expert), affinity / affinity.sum(dim=-1, keepdim=True)
        if self.top_k > 1:
            gate = gate / gate.sum(dim=-1, keepdim=True)
        # choices per expert into a fixed length: bincount's depends on the values (a graph break, a host read)
        chosen = expert.flatten()
        load = torch.zeros_like(self.bias, dtype=torch.long).scatter_add_(0, chosen, torch.ones_like(chosen))
        aux = self.experts * (load / expert.numel() * probs.mean(dim=0)).sum()
        z = logits.logsumexp(dim=-1).square().mean()
        keep = None
        if self.capacity > 0:
            keep = within_capacity(expert, self.experts, math.ceil(self.capacity * expert.numel() / self.experts))
        if self.training and torch.is_grad_enabled():  # training passes only: not validation, evals or stats
            dropped = (~keep).sum() if keep is not None else torch.zeros((), device=x.device)
            stats = torch.cat(
                [load.double(), torch.stack([aux.detach(), z.detach(), dropped, torch.ones_like(z)]).double()]
            )
            self.step_stats = stats if self.step_stats is None else self.step_stats + stats
        return expert, gate, keep, aux, z

    def take_step_stats(self) -> torch.Tensor:
        """This step's [tokens per expert..., aux loss sum, z-loss sum, dropped choices, passes] (float64), reset."""
        empty = torch.zeros(self.experts + 4, dtype=torch.float64, device=self.bias.device)
        stats, self.step_stats = self.step_stats, empty
        return stats if stats is not None else empty.clone()

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor) -> None:
        """DeepSeek-V3's step: experts above the mean load get a smaller bias, those below a larger one."""
        self.bias += self.bias_rate * torch.sign(load.mean() - load).to(self.bias.dtype)


class Experts(nn.Module):
    """n SwiGLU experts as (n, out, in) weights: FSDP2 shards them along the experts like any parameter, and the
    optimizer sees one matrix per expert (the "expert" role: Muon orthogonalises each)."""

    stacks_experts = True  # what ablate.optim.roles looks for

    def __init__(self, n: int, d_model: int, hidden: int, kernels: str):
        super().__init__()
        self.up_proj = nn.Parameter(torch.empty(n, hidden, d_model))
        self.gate_proj = nn.Parameter(torch.empty(n, hidden, d_model))
        self.down_proj = nn.Parameter(torch.empty(n, d_model, hidden))
        self.kernels = kernels

    def init_weights(self, std: float, out_std: float, generator: torch.Generator | None) -> None:
        for weight, scale in ((self.up_proj, std), (self.gate_proj, std), (self.down_proj, out_std)):
            nn.init.normal_(weight, mean=0.0, std=scale, generator=generator)

    def forward(self, x: torch.Tensor, expert: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x (T, d_model), expert and gate (T, k) -> out[t] = sum_j gate[t, j] * expert[t, j](x[t]).

        No shape here depends on the routing, so nothing is read back to the host and a compiled block stays one
        graph: the T*k choices sorted by expert on the device (stably: the same rows meet the same weights in the
        same order each run), one grouped matmul per weight over the experts' runs of rows, the results gathered
        back to (token, choice) and summed with their gates in fp32 in a fixed order (index_add_ summed a token's
        choices in whatever order CUDA's atomics took, in bf16)."""
        tokens, k = expert.shape
        by_expert, order = expert.flatten().sort(stable=True)  # of token-major choices: t's at t*k ... t*k + k-1
        ends = torch.searchsorted(by_expert, torch.arange(len(self.up_proj), device=x.device), right=True).int()
        # each token's row k times, then permuted: the backward sums, never scatters onto repeated rows
        rows = x[:, None].expand(tokens, k, x.shape[-1]).reshape(tokens * k, x.shape[-1])[order]
        h = swiglu(grouped_linear(rows, self.gate_proj, ends), grouped_linear(rows, self.up_proj, ends), self.kernels)
        out = grouped_linear(h, self.down_proj, ends)[order.argsort()].view(tokens, k, -1)
        return (out * gate[..., None].float()).sum(dim=1).to(x.dtype)

    def every(self, x: torch.Tensor) -> torch.Tensor:
        """Every token through every expert, gate 1 (the shared experts)."""
        weights = zip(self.gate_proj, self.up_proj, self.down_proj)
        return sum(F.linear(swiglu(F.linear(x, g), F.linear(x, u), kernels=self.kernels), d) for g, u, d in weights)


class MoE(nn.Module):
    """The mixture-of-experts FFN (ffn="moe"): routed experts, shared experts, and the router's losses for
    Transformer.loss (`extra_loss`, set by each forward)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden, shared = cfg.moe_hidden or cfg.ffn_dim, cfg.moe_shared_experts
        self.z_weight = cfg.moe_z_loss
        default_aux = 0.01 if cfg.moe_balance == "aux_loss" else 0.0
        self.aux_weight = default_aux if cfg.moe_aux_loss is None else cfg.moe_aux_loss
        self.init_std, self.out_init_std = cfg.init_std, residual_init_std(cfg)
        self.router = Router(cfg)
        self.experts = Experts(cfg.moe_experts, cfg.d_model, hidden, cfg.kernels)
        self.shared = Experts(shared, cfg.d_model, hidden, cfg.kernels) if shared else None
        self.extra_loss: torch.Tensor | None = None

    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Router Normal(0, init_std), bias 0; experts as FeedForward's (up, gate, down), routed then shared."""
        nn.init.normal_(self.router.gate.weight, mean=0.0, std=self.init_std, generator=generator)
        self.router.bias.zero_()
        for experts in (self.experts, self.shared):
            if experts is not None:
                experts.init_weights(self.init_std, self.out_init_std, generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        expert, gate, keep, aux, z = self.router(flat)
        if keep is not None:  # over capacity: the choice is dropped (the token keeps its residual) by a zero gate,
            gate = gate.masked_fill(~keep, 0.0)  # computed and not cut out, so no shape depends on the routing
        out = self.experts(flat, expert, gate)
        if self.shared is not None:
            out = out + self.shared.every(flat)
        self.extra_loss = self.aux_weight * aux + self.z_weight * z
        return out.view(x.shape)
