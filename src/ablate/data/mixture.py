"""Which training sequences come next: one shuffled stream (SequenceSampler), or a weighted mixture of streams, one
per source (MixtureSampler), and the fixed validation set of a mixture.

A mixture draws each sequence from the source furthest below its target share (smooth weighted round-robin):
deterministic, and after n sequences each source's count stays within about one sequence of weight x n, so the token
shares track the weights within ~1/n at any point, however the draws are split into batches. Within a source,
sequences are shuffled per (seed, source, epoch); a source that runs out starts a new, reshuffled epoch.

A mixture's sequences are numbered source after source: source k owns global indices first[k] .. first[k+1]-1.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class SequenceSampler:
    """Shuffled sequence indices, epoch after epoch. The state is (epoch, cursor): each epoch's order is a
    permutation drawn from (seed, *stream, epoch), so nothing grows with the number of steps. `stream` keeps a
    mixture's sources apart; () is the plain sampler's order."""

    def __init__(self, num_sequences: int, seed: int, stream: tuple[int, ...] = ()):
        if num_sequences < 1:
            raise ValueError(
                f"SequenceSampler needs at least one sequence, got {num_sequences}: more data or a shorter data.seq_len"
            )
        self.num_sequences, self.seed, self.stream = num_sequences, seed, tuple(stream)
        self.epoch, self.cursor = 0, 0
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self.epoch:  # recomputed, never stored: a function of (seed, stream, epoch)
            rng = np.random.default_rng((self.seed, *self.stream, self.epoch))
            self._order = rng.permutation(self.num_sequences)
            self._order_epoch = self.epoch
        return self._order

    def take(self, n: int) -> np.ndarray:
        out = []
        while n > 0:
            k = min(n, self.num_sequences - self.cursor)
            out.append(self._epoch_order()[self.cursor : self.cursor + k])
            self.cursor += k
            n -= k
            if self.cursor == self.num_sequences:
                self.epoch, self.cursor = self.epoch + 1, 0
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def tokens_per_source(self) -> dict[str, int]:
        """{}: one stream has no sources to count (MixtureSampler's has one entry per source)."""
        return {}

    def source_stats(self) -> dict[str, dict]:
        """{}: one stream has no per-source figures for summary.json (MixtureSampler's has)."""
        return {}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        if epoch < 0 or not 0 <= cursor < self.num_sequences:
            raise ValueError(f"sampler state {state} does not fit {self.num_sequences} sequences")
        self.epoch, self.cursor = epoch, cursor


def first_indices(sizes) -> np.ndarray:
    """The global index of each source's first sequence, and the total at the end (K+1 numbers)."""
    return np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])


def source_of(first: np.ndarray, indices) -> np.ndarray:
    """The source (0..K-1) of each global sequence index."""
    return np.searchsorted(first, np.asarray(indices, dtype=np.int64), side="right") - 1


def _furthest_below(weights, counts, total: int, open_sources) -> int:
    """The source whose count lags its share of `total` draws the most (the first one on a tie)."""
    return max(open_sources, key=lambda k: weights[k] * total - counts[k])


class MixtureSampler:
    """Global sequence indices from several sources in proportion to `weights` (normalised here). The state is
    per source (epoch, cursor, sequences drawn ever, sequences drawn under the current weights) and the weights:
    a few numbers per source. Loading a state saved under other weights keeps every source's position and applies
    the new weights from there."""

    def __init__(self, sizes, weights, seed: int, names, seq_len: int):
        if not len(sizes) == len(weights) == len(names) or len(set(names)) != len(names):
            raise ValueError(
                f"a mixture needs one size, weight and distinct name per source; got {len(sizes)} "
                f"sizes, {len(weights)} weights, names {list(names)}"
            )
        if min(weights) <= 0:
            raise ValueError(f"mixture weights must be > 0, got {list(weights)}")
        self.names, self.seq_len = tuple(names), seq_len
        self.weights = tuple(float(w) / sum(weights) for w in weights)
        self.first = first_indices(sizes)
        self.num_sequences = int(self.first[-1])
        self.streams = [SequenceSampler(int(n), seed, stream=(k,)) for k, n in enumerate(sizes)]
        self.drawn = [0] * len(sizes)  # sequences drawn from each source since the run began
        self.since = [0] * len(sizes)  # ... since the current weights apply: the share rule looks at these

    def choose(self, n: int) -> np.ndarray:
        """The source of each of the next n sequences (advances the share counts, not the streams)."""
        chosen, total, everyone = np.empty(n, dtype=np.int64), sum(self.since), range(len(self.streams))
        for i in range(n):
            total += 1
            k = _furthest_below(self.weights, self.since, total, everyone)
            self.since[k] += 1
            chosen[i] = k
        return chosen

    def take(self, n: int) -> np.ndarray:
        chosen = self.choose(n)
        out = np.empty(n, dtype=np.int64)
        for k, stream in enumerate(self.streams):
            where = np.flatnonzero(chosen == k)
            out[where] = self.first[k] + stream.take(len(where))
            self.drawn[k] += len(where)
        return out

    def tokens_per_source(self) -> dict[str, int]:
        """Tokens drawn from each source so far (batches later skipped or rolled back included)."""
        return {name: n * self.seq_len for name, n in zip(self.names, self.drawn)}

    def epochs_per_source(self) -> dict[str, float]:
        """Passes over each source so far: 2.5 = twice through, halfway through the third (reshuffled) pass."""
        return {name: s.epoch + s.cursor / s.num_sequences for name, s in zip(self.names, self.streams)}

    def source_stats(self) -> dict[str, dict]:
        """For summary.json: each source's weight, tokens drawn, their share of all drawn, and epochs."""
        tokens, epochs = self.tokens_per_source(), self.epochs_per_source()
        total = sum(tokens.values()) or 1
        return {
            name: {"weight": w, "tokens": tokens[name], "share": tokens[name] / total, "epochs": epochs[name]}
            for name, w in zip(self.names, self.weights)
        }

    def state_dict(self) -> dict:
        return {
            "sources": {
                name: {**s.state_dict(), "drawn": d, "since": c}
                for name, s, d, c in zip(self.names, self.streams, self.drawn, self.since)
            },
            "weights": dict(zip(self.names, self.weights)),
        }

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("sources")
        if not isinstance(saved, dict) or sorted(saved) != sorted(self.names):
            held = sorted(saved) if isinstance(saved, dict) else "one unweighted stream"
            raise ValueError(f"sampler state of sources {held} does not fit this mixture of {sorted(self.names)}")
        for name, stream in zip(self.names, self.streams):
            stream.load_state_dict(saved[name])
        self.drawn = [int(saved[name]["drawn"]) for name in self.names]
        same_weights = state.get("weights") == dict(zip(self.names, self.weights))
        # new weights apply from here: the share rule starts counting afresh instead of making up for the past
        self.since = [int(saved[name]["since"]) if same_weights else 0 for name in self.names]


def balanced(text_streams) -> Iterator[str]:
    """Texts from several iterators, the next one always from the source that has given the fewest characters
    so far: a capped tokenizer training run sees about as much text of each source. One iterator: unchanged."""
    iterators = [iter(s) for s in text_streams]
    chars, live = [0] * len(iterators), list(range(len(iterators)))
    while live:
        k = min(live, key=lambda j: chars[j])
        text = next(iterators[k], None)
        if text is None:
            live.remove(k)
            continue
        chars[k] += len(text)
        yield text
