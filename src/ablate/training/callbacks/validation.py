"""The Validation callback: held-out loss (and bits per byte) every `train.val_every` steps and at the end, with the
per-sequence losses kept as the items of paired comparisons between variants."""

from __future__ import annotations

import math

import torch

from ablate import rundir
from ablate.data import tokenizer_stats
from ablate.training.callbacks.base import Callback, TrainerView, due


class Validation(Callback):
    """Held-out loss of the first `sequences` validation sequences every `every` steps and at the end, forward
    passes of at most `micro_batch` sequences per rank; per-sequence losses kept (eval_items/step_N/val_loss.jsonl)
    as the items of paired comparisons between variants. Also in bits per byte (val/bpb: what runs of different
    tokenizers compare on), and summary.json gets the tokenizer's figures on the validation documents."""

    name, order = "validation", 20

    def __init__(self, every: int, sequences: int, micro_batch: int, doc_mask: bool):
        self.every, self.sequences, self.micro_batch, self.doc_mask = every, sequences, micro_batch, doc_mask
        self.last_val_loss = math.nan
        self.scored = None  # (tokens, UTF-8 bytes, their sha256) of the validation targets: fixed, counted once

    def post_step(self, trainer: TrainerView) -> None:
        if due(trainer.step, self.every, trainer.max_steps):
            self.validate(trainer)

    def validate(self, trainer: TrainerView) -> None:
        losses = self.losses(trainer)
        self.last_val_loss = sum(losses.values()) / len(losses) if losses else math.nan
        trainer.log({"val/loss": self.last_val_loss, "val/bpb": self.bits_per_byte(trainer)})
        if trainer.dist.is_main:
            rundir.write_items(
                trainer.run_dir,
                trainer.step,
                "val_loss",
                [{"id": i, "loss": loss} for i, loss in sorted(losses.items())],
            )
        trainer.say(f"step {trainer.step} val_loss {self.last_val_loss:.4f}")

    @torch.no_grad()
    def losses(self, trainer: TrainerView) -> dict[int, float]:
        """Loss of each held-out sequence ({sequence index: mean token loss}), split over ranks for the forward
        passes and gathered on every rank. Every rank runs the same number of forward passes, as FSDP2 needs."""
        d, size = trainer.dist, self.micro_batch
        indices = [int(i) for i in trainer.data.val_indices(self.sequences, trainer.seq_len)]
        count, mine = len(indices), indices[d.rank :: d.world]
        passes = -(-count // (size * d.world))
        losses = {}
        trainer.model.eval()
        for k in range(passes):
            part = mine[k * size : (k + 1) * size]
            chunk = part or [0]  # a rank with nothing left still runs a forward, on item 0, and keeps nothing
            inputs, targets, doc_ids = [
                x.to(d.device, non_blocking=True) for x in trainer.data.val.batch(chunk, trainer.seq_len)
            ]
            # a chunk of logits at a time: a 50k vocabulary never is whole
            per_token = trainer.model.per_token_loss(inputs, targets, doc_ids if self.doc_mask else None)
            losses.update(zip(part, per_token.mean(dim=1).tolist()))
        trainer.model.train()
        gathered = [None] * d.world
        torch.distributed.all_gather_object(gathered, losses)
        return {i: loss for part in gathered for i, loss in part.items()}

    def state_dict(self) -> dict:
        return {"last_val_loss": self.last_val_loss}

    def load_state_dict(self, state: dict) -> None:
        self.last_val_loss = state.get("last_val_loss", math.nan)

    def bits_per_byte(self, trainer: TrainerView) -> float:
        if self.scored is None:
            self.scored = tokenizer_stats.scored_text(trainer.data, self.sequences, trainer.seq_len)
        return tokenizer_stats.bits_per_byte(self.last_val_loss, *self.scored[:2])

    def summary(self, trainer: TrainerView) -> dict:
        val = trainer.data.val
        return {
            "final_val_loss": self.last_val_loss,
            "final_val_bpb": self.bits_per_byte(trainer),
            "val_scored": dict(zip(("tokens", "bytes", "text_sha256"), self.scored)),
            "tokenizer": tokenizer_stats.validation_figures(trainer.data.tokenizer_path, val.tokens, val.doc_starts),
        }
