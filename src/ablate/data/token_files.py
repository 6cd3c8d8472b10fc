"""The token files of a prepared data cache, as training reads them: each split memory-mapped (documents
concatenated, each followed by eos), cut into sequences with their document ids, the training order and the windows
of the validation documents. ablate.data.prepare writes these files (<split>.bin, <split>_docs.npy, a mixture's
<split>_sources.npy).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ablate.data import mixture
from ablate.data.mixture import SequenceSampler


@dataclass
class TokenData:
    """One tokenized split, memory-mapped: documents concatenated, each followed by eos. A mixture's split holds
    its sources one after another, sequences numbered source after source; no window crosses into the next source."""

    tokens: np.ndarray  # np.memmap of uint16 or uint32 ids
    doc_starts: np.ndarray  # int64 offset of each document's first token (sorted)
    source_names: tuple[str, ...] = ()  # a mixture's sources, in data.source order; () for one stream
    source_starts: np.ndarray | None = None  # a mixture: each source's first token offset, then the end

    def sequences_per_source(self, seq_len: int) -> np.ndarray:
        if self.source_starts is None:
            return np.asarray([(len(self.tokens) - 1) // seq_len])  # -1: the last window needs one more target
        return (np.diff(self.source_starts) - 1) // seq_len  # ... inside its own source

    def num_sequences(self, seq_len: int) -> int:
        return int(self.sequences_per_source(seq_len).sum())

    def source_of(self, indices, seq_len: int) -> np.ndarray:
        """Each sequence's source, an index into source_names (all 0 for one stream)."""
        return mixture.source_of(mixture.first_indices(self.sequences_per_source(seq_len)), indices)

    def tokens_per_source(self, indices, seq_len: int) -> dict[str, int]:
        """Tokens these sequences hold, per source name ({} for one stream): a step's data/tokens/<source>."""
        counts = np.bincount(self.source_of(indices, seq_len), minlength=len(self.source_names))
        return {name: int(n) * seq_len for name, n in zip(self.source_names, counts)}

    def _window_starts(self, indices: np.ndarray, seq_len: int) -> np.ndarray:
        if self.source_starts is None:
            return indices * seq_len
        first = mixture.first_indices(self.sequences_per_source(seq_len))
        source = mixture.source_of(first, indices)
        return self.source_starts[source] + (indices - first[source]) * seq_len

    def batch(self, indices, seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """inputs (B, S), targets (B, S) = inputs shifted by one, doc_ids (B, S): each position's document counted
        from the window's first document (0, 0, 1, 1, 1, 2, ...), for intra-document attention masks."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.num_sequences(seq_len)):
            raise IndexError(f"sequence index out of range [0, {self.num_sequences(seq_len)}) at seq_len {seq_len}")
        starts = self._window_starts(indices, seq_len)
        windows = np.stack([np.asarray(self.tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])
        positions = starts[:, None] + np.arange(seq_len)
        doc_of = np.searchsorted(self.doc_starts, positions, side="right") - 1
        doc_ids = (doc_of - doc_of[:, :1]).astype(np.int32)
        return (
            torch.from_numpy(windows[:, :-1].copy()),
            torch.from_numpy(windows[:, 1:].copy()),
            torch.from_numpy(doc_ids),
        )

    def document_batch(self, windows, seq_len: int, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """inputs and targets (B, seq_len) of windows (document, first target, end) inside whole documents: a
        window's inputs are the tokens before its targets (a document's first target follows the eos before it, or
        an eos put there for the split's first); targets past `end` are -100, not scored."""
        inputs = np.full((len(windows), seq_len), eos_id, dtype=np.int64)
        targets = np.full((len(windows), seq_len), -100, dtype=np.int64)
        for row, (_, first, end) in enumerate(windows):
            targets[row, : end - first] = self.tokens[first:end]
            before = self.tokens[max(first - 1, 0) : end - 1]
            inputs[row, end - first - len(before) : end - first] = before
        return torch.from_numpy(inputs), torch.from_numpy(targets)


@dataclass
class PreparedData:
    train: TokenData
    val: TokenData
    tokenizer_path: str
    vocab_size: int
    eos_id: int
    cache_dir: str
    stats: dict
    weights: tuple[float, ...] = ()  # a mixture's weights (sum 1), in the order of train.source_names

    def sampler(self, seq_len: int, seed: int):
        """The training order: a SequenceSampler, or for a mixture a MixtureSampler over its sources."""
        if not self.weights:
            return SequenceSampler(self.train.num_sequences(seq_len), seed=seed)
        return mixture.MixtureSampler(
            self.train.sequences_per_source(seq_len), self.weights, seed, self.train.source_names, seq_len
        )


def open_split(folder: str, split: str, dtype: str, names=()) -> TokenData:
    """A cache folder's split, memory-mapped; `names`: a mixture's source names, for a split held out per source."""
    opened = TokenData(
        tokens=np.memmap(os.path.join(folder, f"{split}.bin"), dtype=dtype, mode="r"),
        doc_starts=np.load(os.path.join(folder, f"{split}_docs.npy"), mmap_mode="r"),
    )
    bounds = os.path.join(folder, f"{split}_sources.npy")  # a mixture's split held out per source
    if os.path.exists(bounds):
        opened.source_names, opened.source_starts = tuple(names), np.load(bounds)
    return opened
