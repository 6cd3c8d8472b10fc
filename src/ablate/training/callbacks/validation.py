"""The Validation callback: held-out loss (and bits per byte) every `train.val_every` steps and at the end, with the
per-document losses kept as the items of paired comparisons between variants."""

from __future__ import annotations

import math

import numpy as np
import torch

from ablate import rundir
from ablate.data import tokenizer_stats
from ablate.training.callbacks.base import Callback, TrainerView, due


class Validation(Callback):
    """Held-out loss of fixed validation documents every `every` steps and at the end, forward passes of at most
    `micro_batch` windows per rank. The documents are fixed by their text (tokenizer_stats.validation_documents: the
    first ones reaching `sequences` x seq_len x VAL_BYTES_PER_TOKEN UTF-8 bytes), each scored whole in windows of
    seq_len, so runs of any tokenizer on one data config score the same bytes: val/loss is nats per token, val/bpb
    nats / (ln 2 x bytes), what runs of different tokenizers compare on. Per-document items
    (eval_items/step_N/val_loss.jsonl) for paired comparisons between variants: `loss` and `bpb` are each document's
    share, scaled so that their mean over documents is val/loss and val/bpb (a plain mean over items, as the report
    takes it, weighs each document by its tokens or bytes). summary.json gets the tokenizer's figures on them."""

    name, order = "validation", 20

    def __init__(self, every: int, sequences: int, micro_batch: int):
        self.every, self.sequences, self.micro_batch = every, sequences, micro_batch
        self.last_val_loss = self.last_val_bpb = math.nan
        self.docs: tokenizer_stats.ValDocuments | None = None  # fixed: chosen once per process
        self.handed: tuple[int, np.ndarray] | None = None  # (step, document nats) a stack scored for this member

    def pre_train(self, trainer: TrainerView) -> None:
        self.handed = None  # nothing a stack scored before a rollback or resume

    def acts_at(self, trainer: TrainerView) -> bool:
        return due(trainer.step, self.every, trainer.max_steps)

    def post_step(self, trainer: TrainerView) -> None:
        if self.acts_at(trainer):
            self.validate(trainer)

    def documents(self, trainer: TrainerView) -> tokenizer_stats.ValDocuments:
        if self.docs is None:
            budget = self.sequences * trainer.seq_len * tokenizer_stats.VAL_BYTES_PER_TOKEN
            self.docs = tokenizer_stats.validation_documents(trainer.data.tokenizer_path, trainer.data.val, budget)
        return self.docs

    def scoring_key(self, trainer: TrainerView) -> tuple:
        """What this callback's document losses depend on besides the model (a stack's members sharing a key are
        scored in one pass, training.stack_eval; their sequence length and device the stack shares): the
        tokenizer's file, the documents' token ids and places, the passes' size and the end of a document."""
        docs, val = self.documents(trainer), trainer.data.val
        ids = tokenizer_stats.content_sha256(*(val.tokens[a:b] for a, b in zip(docs.starts, docs.ends)))
        path = trainer.data.tokenizer_path
        return (tokenizer_stats.file_sha256(path), ids, docs.starts.tobytes(), self.micro_batch, trainer.data.eos_id)

    def hand(self, step: int, nats: np.ndarray) -> None:
        """A stack's document losses for this member at `step` (training.stack_eval), for its coming post_step."""
        self.handed = (step, nats)

    def validate(self, trainer: TrainerView) -> None:
        docs = self.documents(trainer)
        handed, self.handed = self.handed, None
        nats = handed[1] if handed is not None and handed[0] == trainer.step else self.document_nats(trainer)
        tokens, n_bytes, count = docs.ends - docs.starts, docs.n_bytes, len(nats)
        self.last_val_loss = float(nats.sum() / tokens.sum()) if count else math.nan
        self.last_val_bpb = float(nats.sum() / (math.log(2) * n_bytes.sum())) if n_bytes.sum() else math.nan
        trainer.log({"val/loss": self.last_val_loss, "val/bpb": self.last_val_bpb})
        if trainer.dist.is_main:
            per_token, per_byte = count / tokens.sum(), count / (math.log(2) * max(n_bytes.sum(), 1))
            rows = [
                {"id": d, "loss": n * per_token, "bpb": n * per_byte, "tokens": int(t), "bytes": int(b)}
                for d, (n, t, b) in enumerate(zip(nats.tolist(), tokens, n_bytes))
            ]
            rundir.write_items(trainer.run_dir, trainer.step, "val_loss", rows)
        trainer.say(f"step {trainer.step} val_loss {self.last_val_loss:.4f}")

    @torch.no_grad()
    def document_nats(self, trainer: TrainerView, per_token_loss=None) -> np.ndarray:
        """Summed token losses of each validation document, its windows split over ranks for the forward passes
        and gathered on every rank. Every rank runs the same number of forward passes, as FSDP2 needs.
        per_token_loss: (inputs, targets) -> their (B, S) losses (None: the trainer's model, in eval mode), or a
        stack's (K, B, S) (training.stack_eval): then a (K, documents) array, one row of every member's."""
        if per_token_loss is not None:
            return self._nats(trainer, per_token_loss)
        trainer.model.eval()
        try:
            return self._nats(trainer, lambda inputs, targets: trainer.model.per_token_loss(inputs, targets, None))
        finally:
            trainer.model.train()

    def _nats(self, trainer: TrainerView, per_token_loss) -> np.ndarray:
        d, size, docs = trainer.dist, self.micro_batch, self.documents(trainer)
        windows = docs.windows(trainer.seq_len)
        mine = list(range(d.rank, len(windows), d.world))
        passes = -(-len(windows) // (size * d.world))
        sums = []  # each pass's window sums, left on the device: one read for the whole validation, not one a pass
        for k in range(passes):
            part = mine[k * size : (k + 1) * size]
            chunk = [windows[i] for i in part] or windows[:1]  # a rank with nothing left runs one and keeps nothing
            inputs, targets = [
                x.to(d.device, non_blocking=True)
                for x in trainer.data.val.document_batch(chunk, trainer.seq_len, trainer.data.eos_id)
            ]
            # one document per window: no mask to apply; a chunk of logits at a time: a 50k vocabulary never is whole
            sums.append(per_token_loss(inputs, targets).sum(dim=-1)[..., : len(part)])
        stacked = bool(sums) and sums[0].dim() == 2  # a stack's (K, windows) sums: a row of nats per member
        values = torch.cat(sums, dim=-1).tolist() if sums else []
        out = np.zeros((len(values) if stacked else 1, len(docs.starts)))
        for row, member_values in zip(out, values if stacked else [values]):
            for part in d.gather_objects(dict(zip(mine, member_values))):
                for i, value in part.items():
                    row[windows[i][0]] += value
        return out if stacked else out[0]

    def state_dict(self) -> dict:
        return {"last_val_loss": self.last_val_loss, "last_val_bpb": self.last_val_bpb}

    def load_state_dict(self, state: dict) -> None:
        self.last_val_loss = state.get("last_val_loss", math.nan)
        self.last_val_bpb = state.get("last_val_bpb", math.nan)

    def summary(self, trainer: TrainerView) -> dict:
        val, docs = trainer.data.val, self.documents(trainer)
        return {
            "final_val_loss": self.last_val_loss,
            "final_val_bpb": self.last_val_bpb,
            "val_scored": {
                "tokens": docs.tokens,
                "bytes": int(docs.n_bytes.sum()),
                "text_sha256": docs.text_sha256,
                "documents": len(docs.starts),
            },
            "tokenizer": tokenizer_stats.validation_figures(trainer.data.tokenizer_path, val.tokens, val.doc_starts),
        }
