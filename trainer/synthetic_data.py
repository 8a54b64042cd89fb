"""paxsearch's own synthetic corpus and its token pipeline, in NumPy (no seqio, no TensorFlow).

The corpus is generated deterministically in memory: templated English sentences and
small-number arithmetic, so a tiny byte-level LM's loss falls within a few dozen steps.
Splits "train" (20,000 documents) and "validation" (400).

The pipeline is the one trainer/data.py builds with seqio for any other source, step for
step: shard the examples (example i goes to shard i mod num_shards), tokenize as
seqio.ByteVocabulary does (UTF-8 bytes + 3; 0 pad, 1 EOS, 2 UNK), append EOS, trim to seq_len,
repeat and shuffle the train split as seqio's Task does (tf.data's shuffle over a 1,000-example
buffer, its Philox stream reproduced here), pack as seqio's trim_and_pack_dataset packs (windows
of seq_len examples, each packed greedily into rows: an example that does not fit closes the
row; the window's last row is closed too), derive the decoder features as seqio's
LMFeatureConverter does, and batch. Its batches equal seqio's over the same documents, shuffled
or not (tests/trainer/test_data.py checks them against a text file of the corpus), so a study
trained before this module existed reruns to the same losses (tests/search/study/test_legacy_study.py).

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
    stream = itertools.cycle(examples)  # seqio repeats the split before it shuffles
    yield from _tf_shuffled(stream, SHUFFLE_BUFFER, seed) if shuffle else stream


SHUFFLE_BUFFER = 1000  # seqio's Task shuffle buffer (SHUFFLE_BUFFER_SIZE)
_TF_DEFAULT_GRAPH_SEED = 87654321  # what tf.data pairs an op seed with when no global seed is set
_M32 = 0xFFFFFFFF


def _philox_blocks(key: tuple[int, int], counter: list[int], n: int) -> np.ndarray:
    """n consecutive outputs of TensorFlow's random::PhiloxRandom (Philox4x32-10) from
    `counter` (4 uint32 words, advanced in place), as n x 4 uint32 in output order."""
    low = (counter[0] | counter[1] << 32) + np.arange(n, dtype=np.uint64)
    c = [low & _M32, low >> np.uint64(32), np.full(n, counter[2], np.uint64), np.full(n, counter[3], np.uint64)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _M32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & _M32, (k1 + np.uint64(0xBB67AE85)) & _M32
    after = (counter[0] | counter[1] << 32) + n  # the low 64 bits never carry here
    counter[0], counter[1] = after & _M32, (after >> 32) & _M32
    return np.stack(c, axis=1)


def _philox_uint32s(seed_lo: int, seed_hi: int) -> Iterator[int]:
    """TensorFlow's SingleSampleAdapter<PhiloxRandom(seed_lo, seed_hi)>: its uint32s one by one."""
    key = (seed_lo & _M32, seed_lo >> 32 & _M32)
    counter = [0, 0, seed_hi & _M32, seed_hi >> 32 & _M32]
    while True:
        yield from _philox_blocks(key, counter, 256).ravel().tolist()


def _tf_shuffled(items: Iterator[np.ndarray], buffer_size: int, seed: int) -> Iterator[np.ndarray]:
    """`items` in the order tf.data's Dataset.shuffle(buffer_size, seed=seed) gives them (TF 2,
    no global seed, first iteration): the op's seeds (87654321, seed mod 2^31-1) draw the
    iterator's two seeds, whose Philox stream picks each element from the ring buffer's live
    part. tests/trainer/test_data.py checks it against TensorFlow's own."""
    draw_seeds = _philox_uint32s(_TF_DEFAULT_GRAPH_SEED, seed % (2**31 - 1))
    random = _philox_uint32s(next(draw_seeds), next(draw_seeds))
    buffer: list = [None] * buffer_size
    start = end = 0
    for item in itertools.chain(items, [None]):
        if item is not None:
            buffer[end % buffer_size] = item
            end += 1
            if end - start < buffer_size:
                continue
        while end > start and (item is None or end - start == buffer_size):
            i = (start + next(random) % (end - start)) % buffer_size
            j = start % buffer_size
            yield buffer[i]
            buffer[i], buffer[j] = buffer[j], buffer[i]
            start += 1


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
