"""Muon (optim.name="muon"): orthogonalised Nesterov momentum on the hidden matrices, AdamW on everything else,
in one optimizer object, so the trainer, set_lr and DCP checkpoints treat it as they treat AdamW.

For a hidden matrix W with gradient G:
    m <- momentum * m + (1 - momentum) * G               (state "momentum_buffer")
    u <- (1 - momentum) * G + momentum * m               (Nesterov: one step further along the momentum)
    W <- W * (1 - lr * weight_decay) - lr * 0.2 * sqrt(max(rows, cols)) * NewtonSchulz(u)
Embedding, vectors and the untied head follow AdamW with the config's betas, eps and the role's weight decay.

Under FSDP2 every parameter is a DTensor holding a block of rows on each rank, but orthogonalising needs the whole
matrix (one rank's rows alone would give a different, wrong update). Each rank gathers the whole momentum-updated
matrix, orthogonalises it, and keeps its own rows: the same numbers as one process, whatever the world size.
Every rank repeats the same Newton-Schulz work: simple, and small next to forward and backward at this
harness's model sizes (handing each rank a share of the matrices would remove the repetition).
"""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from ablate.config import OptimConfig
from ablate.optim.registry import register
from ablate.optim.state import ParamShapes, shard_elements

# Newton-Schulz applies p(s) = a*s + b*s^3 + c*s^5 to every singular value s of X (X, X X^T X, (X X^T)^2 X share
# X's singular vectors), so iterating it moves every s towards where p levels off, without an SVD. The textbook
# cubic converges to exactly 1 but starts slowly: its slope at 0 is 1.5. These quintic coefficients trade exactness
# for speed: the slope at 0 is a = 3.4445, so small singular values grow about 3.4x per step, while b and c keep p
# below ~1.2 on [0, 1] (p(1) = 0.70). After 5 steps every s that started above ~0.003 (after X is divided by its
# Frobenius norm) lies in about [0.68, 1.2]:
# not orthogonal exactly, but an update direction whose scale no longer depends on the gradient's spectrum.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(matrix: torch.Tensor, steps: int) -> torch.Tensor:
    """A matrix with the singular vectors of `matrix` and its singular values moved into about [0.7, 1.2].
    A stack (n, rows, cols), the experts' matrices, is orthogonalised matrix by matrix, in one batched pass."""
    # bf16 on CUDA (tensor cores; the iteration only needs a band, not exact values); float32 on CPU, where
    # bf16 matmuls are slower than float32 on most processors
    x = matrix.to(torch.bfloat16 if matrix.is_cuda else torch.float32)
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # work on the wide side: the Gram matrix x @ x.T is then the smaller one
        x = x.mT
    # the Frobenius norm bounds the largest singular value: all start in [0, 1] (each matrix's own, for a stack)
    x = x / ((x.norm() if x.ndim == 2 else x.norm(dim=(-2, -1), keepdim=True)) + 1e-7)
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(matrix.dtype)


def orthogonalized(update: torch.Tensor, steps: int) -> torch.Tensor:
    """newton_schulz of the whole matrix (or stack of expert matrices, sharded along the experts); for a DTensor,
    returned sharded like `update` (this rank's rows)."""
    if not isinstance(update, DTensor):
        return newton_schulz(update, steps)
    whole = newton_schulz(update.full_tensor(), steps)  # the same numbers on every rank
    # src_data_rank=None: each rank cuts its own shard from its own copy, no communication. DTensor and FSDP2
    # split rows alike (ceil(rows / world) per rank, fewer on the last), uneven shards included.
    return distribute_tensor(whole, update.device_mesh, update.placements, src_data_rank=None)


def update_scale(rows: int, cols: int) -> float:
    """Moonlight's rule, which lets Muon reuse AdamW's lr and weight decay: an orthogonal rows x cols matrix has
    min(rows, cols) unit singular values, so its entries have RMS 1/sqrt(max(rows, cols)), far below AdamW's
    per-entry updates (RMS about 0.2 in practice). Scaling by 0.2*sqrt(max(rows, cols)) gives every matrix, of any
    shape, an update RMS near AdamW's."""
    return 0.2 * math.sqrt(max(rows, cols))


MUON_ROLES = ("hidden", "expert")  # orthogonalised; every other role takes AdamW's update


def _batchable(optimizers: list[Muon]) -> bool:
    """Whether `optimizers`' groups match position by position: role, Newton-Schulz steps, parameter shapes."""

    def layout(optimizer):
        return [(g["role"], g["ns_steps"], [tuple(p.shape) for p in g["params"]]) for g in optimizer.param_groups]

    sharded = any(isinstance(p, DTensor) for o in optimizers for g in o.param_groups for p in g["params"])
    return not sharded and all(isinstance(o, Muon) and layout(o) == layout(optimizers[0]) for o in optimizers)


@register("muon")
class Muon(torch.optim.Optimizer):
    # No device-side skip (its AdamW part keeps the step count on the host): the trainer reads each step's loss
    # and gradient norm before the update, and skips a non-finite one on the host.
    takes_found_inf = False

    def __init__(self, groups: list[dict], cfg: OptimConfig):
        defaults = {
            "lr": cfg.lr,
            "betas": (cfg.beta1, cfg.beta2),
            "eps": cfg.eps,
            "weight_decay": 0.0,
            "momentum": cfg.momentum,
            "ns_steps": cfg.ns_steps,
        }
        super().__init__(groups, defaults)

    @staticmethod
    def width_lr_multiplier(shape: tuple[int, ...], base_shape: tuple[int, ...]) -> float:
        """μP for Muon, by the spectral condition (Yang, Simon & Bernstein 2023): a hidden matrix's update should
        have spectral norm ~ sqrt(fan_out / fan_in). Orthogonalised, the update's singular values are all ~1 and
        update_scale multiplies them by 0.2 sqrt(max(rows, cols)); so lr goes as sqrt(out / in) / sqrt(max(out,
        in)) relative to the base matrix: 1/sqrt(m) for a matrix both of whose sides grow m times (AdamW: 1/m)."""
        (out, fan_in), (base_out, base_in) = shape[-2:], base_shape[-2:]
        spectral = math.sqrt((out / fan_in) / (base_out / base_in))
        return spectral * math.sqrt(max(base_out, base_in) / max(out, fan_in))

    @staticmethod
    def state_elements(shapes: ParamShapes, world: int) -> int:
        """One state (momentum) for the blocks' hidden matrices, experts' stacks too; AdamW's two for the rest."""
        matrices = [s for s in shapes.all_blocks if len(s) >= 2]
        others = shapes.root + [s for s in shapes.all_blocks if len(s) < 2]
        return shard_elements(matrices, world) + 2 * shard_elements(others, world)

    @staticmethod
    def transient_elements(shapes: ParamShapes, world: int) -> int:
        """One parameter at a time: for a hidden matrix, the momentum-updated gradient (a shard), the whole matrix
        gathered and Newton-Schulz's iterates (about three more of the matrix and three of its Gram matrix); for the
        others (AdamW), one shard-sized temporary."""
        hidden = [s for s in shapes.block if len(s) >= 2]  # an experts' stack: a Gram matrix per expert
        orthogonalise = max(
            shard_elements([s], world) + 4 * math.prod(s) + 3 * math.prod(s[:-2]) * min(s[-2:]) ** 2 for s in hidden
        )
        others = max(shard_elements([s], world) for s in shapes.root + [s for s in shapes.block if len(s) < 2])
        return max(orthogonalise, others)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if group["role"] in MUON_ROLES:
                    self._muon_update(param, group, orthogonalized(self._nesterov(param, group), group["ns_steps"]))
                else:
                    self._adamw_update(param, group)
        return loss

    @staticmethod
    @torch.no_grad()
    def stacked_step(optimizers: list[Muon]) -> None:
        """Each optimizer's step() (a stack's members, training.stack: each its own state, learning rate and
        weight decay), with each hidden matrix's Newton-Schulz batched over the optimizers: one orthogonalisation
        of a (K, rows, cols) stack per parameter position instead of K. Optimizers whose groups differ in structure
        or Newton-Schulz steps each take their own step()."""
        if not _batchable(optimizers):
            for optimizer in optimizers:
                optimizer.step()
            return
        for groups in zip(*(o.param_groups for o in optimizers)):
            for params in zip(*(group["params"] for group in groups)):
                taking = [(o, p, g) for o, p, g in zip(optimizers, params, groups) if p.grad is not None]
                if groups[0]["role"] not in MUON_ROLES:
                    for optimizer, param, group in taking:
                        optimizer._adamw_update(param, group)
                    continue
                if not taking:
                    continue
                momenta = torch.stack([o._nesterov(p, g) for o, p, g in taking])
                directions = orthogonalized(momenta, groups[0]["ns_steps"])  # a batch of matrices: each its own
                for (optimizer, param, group), direction in zip(taking, directions):
                    optimizer._muon_update(param, group, direction)

    def _nesterov(self, param: torch.Tensor, group: dict) -> torch.Tensor:
        """The momentum buffer moved by this step's gradient; the Nesterov direction to orthogonalise."""
        state = self.state[param]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(param)
        momentum, buffer = group["momentum"], state["momentum_buffer"]
        buffer.lerp_(param.grad, 1 - momentum)
        return param.grad.lerp(buffer, momentum)

    def _muon_update(self, param: torch.Tensor, group: dict, direction: torch.Tensor) -> None:
        lr = group["lr"]
        param.mul_(1 - lr * group["weight_decay"])  # decoupled, as AdamW's
        param.add_(direction, alpha=-lr * update_scale(*param.shape[-2:]))  # an expert stack: per matrix

    def _adamw_update(self, param: torch.Tensor, group: dict) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)  # on CPU: reading it never waits for a GPU
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        (beta1, beta2), lr, grad = group["betas"], group["lr"], param.grad
        state["step"] += 1
        step = state["step"].item()
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (state["exp_avg_sq"] / (1 - beta2**step)).sqrt_().add_(group["eps"])
        param.mul_(1 - lr * group["weight_decay"])
        param.addcdiv_(state["exp_avg"], denominator, value=-lr / (1 - beta1**step))
