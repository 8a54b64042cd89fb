"""paxsearch's own synthetic corpus and its token pipeline, in NumPy (no seqio, no TensorFlow).

The corpus is generated deterministically in memory: templated English sentences and
small-number arithmetic, so a tiny byte-level LM's loss falls within a few dozen steps.
Splits "train" (20,000 documents) and "validation" (400).

The pipeline is the one trainer/data.py builds with seqio for any other source, step for
step: shard the examples (example i goes to shard i mod num_shards), tokenize as
seqio.ByteVocabulary does (UTF-8 bytes + 3; 0 pad, 1 EOS, 2 UNK), append EOS, trim to seq_len,
repeat (train), pack as seqio's trim_and_pack_dataset packs (windows of seq_len examples, each
packed greedily into rows: an example that does not fit closes the row; the window's last row
is closed too), derive the decoder features as seqio's LMFeatureConverter does, and batch.
Unshuffled, its rows equal seqio's over the same documents (tests/trainer/test_data.py checks
it against a text file of the corpus). The one difference: the train split is shuffled by a
permutation of the shard's examples per epoch (seeded by DataConfig.seed and the epoch), where
seqio shuffles through a 1,000-example buffer.

A training process on the synthetic corpus thus imports neither seqio nor TensorFlow (~7 CPU-s
a process).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import numpy as np

from .config import DataConfig

SPLITS = {"train": (20_000, 1234), "validation": (400, 5678)}  # (count, seed)
VOCAB_SIZE = 256 + 3  # seqio.ByteVocabulary: the bytes after pad (0), EOS (1) and UNK (2)
EOS_ID = 1
Batch = dict[str, np.ndarray]

_ADJECTIVES = ("red", "small", "happy", "old", "quiet", "bright", "green", "lazy")
_NOUNS = ("cat", "dog", "bird", "tree", "river", "house", "child", "robot")
_VERBS = ("sees", "likes", "follows", "finds", "helps", "hears", "paints", "moves")
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def documents(split: str) -> list[str]:
    """The synthetic corpus of one split: same text on every call and every host."""
    count, seed = SPLITS[split]
    return list(_documents_cached(count, seed))


@functools.lru_cache(maxsize=None)
def _documents_cached(count: int, seed: int) -> tuple[str, ...]:
    rng = np.random.default_rng(seed)
    # Document lengths in bytes, roughly: log-uniform over 20..400, so many are short
    # enough to pack several into one row and some span several rows.
    targets = np.exp(rng.uniform(np.log(20), np.log(400), size=count)).astype(int)
    draws = rng.integers(0, 8, size=count * 30 * 5).tolist()  # <= 30 sentences a doc
    i = 0
    docs = []
    for target in targets.tolist():
        sentences: list[str] = []
        length = 0
        while not sentences or length < target:
            kind, a, b, c, d = draws[i:i + 5]
            i += 5
            if kind < 4:
                s = f"the {_ADJECTIVES[a]} {_NOUNS[b]} {_VERBS[c]} the {_NOUNS[d]}."
            elif kind < 6:
                s = f"{a} plus {b} is {a + b}. {_NUMBERS[a]} and {_NUMBERS[b]}."
            else:
                s = " ".join(_NUMBERS[(a + i) % 10] for i in range(3 + b % 4)) + "."
            if sentences and length + len(s) + 1 > target:
                break
            sentences.append(s)
            length += len(s) + 1
        docs.append(" ".join(sentences))
    return tuple(docs)


@functools.lru_cache(maxsize=4)
def _examples(split: str, seq_len: int) -> tuple[np.ndarray, ...]:
    """Each document tokenized, EOS appended, trimmed to seq_len (read-only int32 arrays)."""
    out = []
    for doc in documents(split):
        ids = np.frombuffer(doc.encode("utf-8"), np.uint8).astype(np.int32) + 3
        ex = np.append(ids, np.int32(EOS_ID))[:seq_len]
        ex.setflags(write=False)
        out.append(ex)
    return tuple(out)


def _rows(examples: Iterator[np.ndarray], seq_len: int, pack: bool) -> Iterator[Batch]:
    """One decoder row at a time ({"targets", "segment_ids", "positions"}, each [seq_len])."""
    if not pack:
        for ex in examples:
            targets = np.zeros(seq_len, np.int32)
            targets[:len(ex)] = ex
            nonpad = (targets != 0).astype(np.int32)
            yield {"targets": targets, "segment_ids": nonpad,
                   "positions": np.arange(seq_len, dtype=np.int32) * nonpad}
        return
    while True:
        window = list(itertools.islice(examples, seq_len))
        if not window:
            return
        row: list[np.ndarray] = []
        used = 0
        for ex in window:
            if row and used + len(ex) > seq_len:
                yield _packed_row(row, seq_len)
                row, used = [], 0
            row.append(ex)
            used += len(ex)
        yield _packed_row(row, seq_len)


def _packed_row(segments: list[np.ndarray], seq_len: int) -> Batch:
    lengths = [len(ex) for ex in segments]
    n = sum(lengths)
    targets = np.zeros(seq_len, np.int32)
    segment_ids = np.zeros(seq_len, np.int32)
    positions = np.zeros(seq_len, np.int32)
    targets[:n] = np.concatenate(segments)
    segment_ids[:n] = np.repeat(np.arange(1, len(segments) + 1, dtype=np.int32), lengths)
    positions[:n] = np.concatenate([np.arange(k, dtype=np.int32) for k in lengths])
    return {"targets": targets, "segment_ids": segment_ids, "positions": positions}


def _decoder_features(rows: list[Batch], pack: bool) -> Batch:
    """Stacked rows -> the trainer's batch (seqio.LMFeatureConverter's features, renamed)."""
    targets = np.stack([r["targets"] for r in rows])
    segment_ids = np.stack([r["segment_ids"] for r in rows])
    inputs = np.zeros_like(targets)
    inputs[:, 1:] = targets[:, :-1]
    if pack:  # no token carries over into the next segment (nor into the padding)
        previous = np.zeros_like(segment_ids)
        previous[:, 1:] = segment_ids[:, :-1]
        inputs *= segment_ids == previous
    return {"inputs": inputs, "targets": targets, "weights": (targets != 0).astype(np.float32),
            "segment_ids": segment_ids, "positions": np.stack([r["positions"] for r in rows])}


def _train_examples(seq_len: int, shard: int, num_shards: int, shuffle: bool, seed: int) -> Iterator[np.ndarray]:
    examples = _examples("train", seq_len)[shard::num_shards]
    if not examples:
        return
    for epoch in itertools.count():
        order = (np.random.default_rng([seed, epoch]).permutation(len(examples)) if shuffle
                 else range(len(examples)))
        for i in order:
            yield examples[i]


def train_batches(cfg: DataConfig, seq_len: int, rows: int, shards: range, num_shards: int,
                  start_step: int) -> Iterator[Batch]:
    """This process's batches from start_step on: each shard's `rows` rows, in shard order;
    ends only when a shard holds no example."""
    streams = [_rows(_train_examples(seq_len, s, num_shards, cfg.shuffle, cfg.seed), seq_len, cfg.pack)
               for s in shards]
    for step in itertools.count():
        parts = [list(itertools.islice(stream, rows)) for stream in streams]
        if any(len(p) < rows for p in parts):
            return
        if step >= start_step:
            yield _decoder_features([r for p in parts for r in p], cfg.pack)


def eval_rows(cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int) -> Batch:
    """One shard's rows of the (capped, unshuffled) eval split, at most max_rows (0: all)."""
    examples = _examples(cfg.eval_split, seq_len)
    if cfg.eval_examples:
        examples = examples[:cfg.eval_examples]  # cap the whole split, before sharding
    rows = _rows(iter(examples[shard::num_shards]), seq_len, cfg.pack)
    taken = list(itertools.islice(rows, max_rows) if max_rows else rows)
    if not taken:
        return {k: np.zeros((0, seq_len), np.float32 if k == "weights" else np.int32)
                for k in ("inputs", "targets", "weights", "segment_ids", "positions")}
    return _decoder_features(taken, cfg.pack)
