"""Token batches for the trainer: packed, sharded per host, resumable.

The default source is paxsearch's synthetic corpus "paxsearch_synthetic", generated
deterministically in memory and tokenized, packed and batched in NumPy
(trainer/synthetic_data.py: no seqio, no TensorFlow). A config may instead name any registered
seqio task, or local text files (one document per line), read through seqio
(trainer/seqio_data.py, imported only then). A dataset that cannot load raises DataError;
nothing falls back silently.

Sharding: the source is split into `num_shards` shards (ShardInfo; 0 = one per process).
Shard s yields its own packed stream in batches of global_batch / num_shards rows; process
p of P holds shards p*k .. p*k+k-1 (k = num_shards / P) and its local batch is their
batches concatenated in shard order. So for a fixed num_shards the global batch is the
same, row for row, whatever the number of processes.

Batch features (numpy, [rows, seq_len]): "targets" (int32 token ids, 0 = padding),
"inputs" (int32, targets shifted right by one within each segment, 0 at a segment's
start), "weights" (float32 loss weights, 0 on padding), "segment_ids" (int32, 1, 2, ...
per packed document, 0 on padding) and "positions" (int32, index within the segment).
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import synthetic_data
from .config import DataConfig
from .errors import ConfigError, DataError

SYNTHETIC_TASK = "paxsearch_synthetic"
Batch = dict[str, np.ndarray]


def _synthetic(cfg: DataConfig) -> bool:
    return not cfg.text_files and cfg.task == SYNTHETIC_TASK


def _source(cfg: DataConfig, split: str | None = None) -> Any:
    """The config's seqio task (trainer/seqio_data.py), or None for the synthetic corpus;
    DataError (one line) when it cannot be read or has no such split."""
    if not _synthetic(cfg):
        from . import seqio_data  # seqio and TensorFlow: only for a seqio task or text files

        return seqio_data.task(cfg, split, SYNTHETIC_TASK)
    if split is not None and split not in synthetic_data.SPLITS:
        raise DataError(f"task {SYNTHETIC_TASK!r} has no split {split!r} (it has "
                        f"{sorted(synthetic_data.SPLITS)}); fix DataConfig.eval_split")
    return None


def data_vocab_size(cfg: DataConfig) -> int:
    """Vocabulary size of the task's "targets" feature (ByteVocabulary: 259)."""
    source = _source(cfg)
    if source is None:
        return synthetic_data.VOCAB_SIZE
    from . import seqio_data

    return seqio_data.vocab_size(source)


def _shard_layout(cfg: DataConfig, global_batch: int, process_index: int,
                  process_count: int) -> tuple[int, int, range]:
    """(num_shards, rows per shard batch, this process's shards), after checking numbers."""
    if global_batch < 1 or process_count < 1:
        raise ConfigError(f"global_batch={global_batch} and process_count={process_count} "
                          "must be positive")
    if not 0 <= process_index < process_count:
        raise ConfigError(f"process_index {process_index} is not in [0, {process_count})")
    num_shards = cfg.num_shards or process_count
    if num_shards % process_count:
        raise ConfigError(f"DataConfig.num_shards={num_shards} does not divide by "
                          f"process_count={process_count}; use a multiple of it (or 0)")
    if global_batch % num_shards:
        raise ConfigError(f"global_batch={global_batch} does not divide by "
                          f"num_shards={num_shards}; use a multiple of {num_shards}")
    k = num_shards // process_count
    return num_shards, global_batch // num_shards, range(process_index * k, (process_index + 1) * k)


def train_batches(cfg: DataConfig, seq_len: int, global_batch: int, process_index: int,
                  process_count: int, start_step: int = 0) -> Iterator[Batch]:
    """This process's batches (global_batch / process_count rows) from start_step on, forever."""
    num_shards, rows, shards = _shard_layout(cfg, global_batch, process_index, process_count)
    source = _source(cfg, "train")
    if source is None:
        batches = synthetic_data.train_batches(cfg, seq_len, rows, shards, num_shards, start_step)
    else:
        from . import seqio_data

        batches = seqio_data.train_batches(source, cfg, seq_len, rows, shards, num_shards, start_step)
    return _forever(batches, shards)


def _forever(batches: Iterator[Batch], shards: range) -> Iterator[Batch]:
    """The batches; a typed error instead of StopIteration if a shard holds no data."""
    yield from batches
    raise DataError(f"the train split ran out on shards {list(shards)}: a shard holds no "
                    "documents; use fewer DataConfig.num_shards or more data")


_EVAL_MEMO: dict[tuple, Batch] = {}
_EVAL_MEMO_SIZE = 8  # shards' rows kept per process, oldest dropped first
_EVAL_MEMO_TOKENS = 1 << 22  # eval_examples x seq_len at most (<= a row per example: <= 80 MiB a config)


def _source_stamp(cfg: DataConfig) -> tuple | None:
    """What identifies the eval split's content: the text files' sizes and modification
    times, () for the synthetic corpus (generated in memory); None for any other task,
    whose source this process cannot see change."""
    if cfg.text_files:
        try:
            stats = [(os.path.abspath(p), os.stat(p)) for p in cfg.text_files]
        except OSError:
            return None  # _source raises the one-line error
        return tuple((path, st.st_size, st.st_mtime_ns) for path, st in stats)
    return () if _synthetic(cfg) else None


def _memo_key(cfg: DataConfig, seq_len: int, shard: int, num_shards: int) -> tuple | None:
    """The key a shard's eval rows are kept under; None when they are not kept."""
    small = 0 < cfg.eval_examples and cfg.eval_examples * seq_len <= _EVAL_MEMO_TOKENS
    stamp = _source_stamp(cfg) if small else None
    return None if stamp is None else (cfg, seq_len, shard, num_shards, stamp)


def _shard_rows(source, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int,
                key: tuple | None) -> Batch:
    """One shard's eval rows as arrays, at most max_rows (0: all).

    The split is read unshuffled and packed in order, so the first n rows do not depend on
    how many are taken. With a capped split (eval_examples) from one of our own sources, a
    process keeps each shard's rows (_memo_key): a trial worker serving several trials then
    reads the split once, not once a trial (the seqio pipeline costs ~1.5 CPU-s a trial on a
    tiny model), whatever each trial's batch. The kept arrays are read-only. `key`: _memo_key's;
    `source`: _source's."""
    if key is None:
        return _read_rows(source, cfg, seq_len, shard, num_shards, max_rows)
    if key not in _EVAL_MEMO:
        rows = _read_rows(source, cfg, seq_len, shard, num_shards, 0)
        for array in rows.values():
            array.setflags(write=False)
        while len(_EVAL_MEMO) >= _EVAL_MEMO_SIZE:
            _EVAL_MEMO.pop(next(iter(_EVAL_MEMO)))
        _EVAL_MEMO[key] = rows
    rows = _EVAL_MEMO[key]
    return {k: v[:max_rows] for k, v in rows.items()} if max_rows else dict(rows)


def _read_rows(source, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int) -> Batch:
    if source is None:
        return synthetic_data.eval_rows(cfg, seq_len, shard, num_shards, max_rows)
    from . import seqio_data

    return seqio_data.eval_rows(source, cfg, seq_len, shard, num_shards, max_rows)


def _row_count(source, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int) -> int:
    """How many eval rows another process's shard holds (at most max_rows; 0: all)."""
    if source is None:
        return len(synthetic_data.eval_rows(cfg, seq_len, shard, num_shards, max_rows)["targets"])
    from . import seqio_data

    return seqio_data.eval_row_count(source, cfg, seq_len, shard, num_shards, max_rows)


def eval_batches(cfg: DataConfig, seq_len: int, global_batch: int, process_index: int,
                 process_count: int, max_batches: int = 0) -> list[Batch]:
    """This process's eval batches: finite, as many on every process, padding weight 0.

    The batch count is the largest over all shards (capped at max_batches when > 0);
    a shard that runs short is padded with all-zero rows.
    """
    num_shards, rows, shards = _shard_layout(cfg, global_batch, process_index, process_count)
    source = _source(cfg, cfg.eval_split)
    max_rows = max_batches * rows
    local: dict[int, Batch] = {}
    counts = []
    for s in range(num_shards):
        memo = _memo_key(cfg, seq_len, s, num_shards)
        if s in shards or memo is not None:
            local[s] = _shard_rows(source, cfg, seq_len, s, num_shards, max_rows, memo)
            counts.append(len(local[s]["targets"]))
        else:  # another process's shard: only its row count matters here
            counts.append(_row_count(source, cfg, seq_len, s, num_shards, max_rows))
    n_batches = max(math.ceil(c / rows) for c in counts)
    out = []
    for i in range(n_batches):
        batch = {}
        for key in ("inputs", "targets", "weights", "segment_ids", "positions"):
            chunks = []
            for s in shards:
                chunk = local[s][key][i * rows:(i + 1) * rows]
                pad = np.zeros((rows - len(chunk), seq_len), chunk.dtype)
                chunks.append(np.concatenate([chunk, pad]))
            batch[key] = np.concatenate(chunks)
        out.append(batch)
    return out
