"""Token batches for the trainer: seqio tasks, packed, sharded per host, resumable.

The default source is the seqio Task "paxsearch_synthetic", registered here on first use
over a corpus generated deterministically in memory (templated English sentences and
small-number arithmetic, so a tiny byte-level LM's loss falls within a few dozen steps).
A config may instead name any registered seqio task, or local text files (one document
per line). A dataset that cannot load raises DataError; nothing falls back silently.

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

import functools
import hashlib
import math
import os
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before seqio imports TensorFlow

import numpy as np

from .config import DataConfig
from .errors import ConfigError, DataError
from .quiet import native_stderr_silenced

with native_stderr_silenced():  # TensorFlow's native start-up lines (trainer/quiet.py)
    import seqio
    import tensorflow as tf

SYNTHETIC_TASK = "paxsearch_synthetic"
_SYNTHETIC_DOCS = {"train": (20_000, 1234), "validation": (400, 5678)}  # (count, seed)
_AUTOTUNE = tf.data.AUTOTUNE
Batch = dict[str, np.ndarray]

_ADJECTIVES = ("red", "small", "happy", "old", "quiet", "bright", "green", "lazy")
_NOUNS = ("cat", "dog", "bird", "tree", "river", "house", "child", "robot")
_VERBS = ("sees", "likes", "follows", "finds", "helps", "hears", "paints", "moves")
_NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _synthetic_documents(split: str) -> list[str]:
    """The synthetic corpus of one split: same text on every call and every host."""
    count, seed = _SYNTHETIC_DOCS[split]
    return list(_synthetic_documents_cached(count, seed))


@functools.lru_cache(maxsize=None)
def _synthetic_documents_cached(count: int, seed: int) -> tuple[str, ...]:
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


def _synthetic_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del shuffle_files, seed  # the Task shuffles examples (after sharding) with its seed
    return tf.data.Dataset.from_tensor_slices(
        {"targets": tf.constant(_synthetic_documents(split))})


def _lines_to_examples(ds: tf.data.Dataset) -> tf.data.Dataset:
    """Text lines -> {"targets": line}, dropping blank lines."""
    ds = ds.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
    return ds.map(lambda line: {"targets": line}, num_parallel_calls=_AUTOTUNE)


def _register(name: str, source: seqio.DataSource, preprocessors: list) -> None:
    """Registers a byte-level decoder-only LM task once (later calls are no-ops)."""
    if name in seqio.TaskRegistry.names():
        return
    features = {"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)}
    steps = [functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
             seqio.preprocessors.append_eos]
    seqio.TaskRegistry.add(name, source=source, output_features=features,
                           preprocessors=preprocessors + steps)


def _text_files_task(paths: tuple[str, ...]) -> str:
    """Checks the files and registers a task over them; returns its name."""
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"text file not found: {path!r}; fix DataConfig.text_files "
                            "(existing local files, one document per line)")
        with open(path, "rb") as f:
            if not any(line.strip() for line in f):
                raise DataError(f"text file is empty: {path!r}; give DataConfig.text_files "
                                "files with at least one non-blank line (one document per line)")
    abs_paths = [os.path.abspath(p) for p in paths]
    name = "paxsearch_text_" + hashlib.sha1("\n".join(abs_paths).encode()).hexdigest()[:12]
    source = seqio.TextLineDataSource({"train": abs_paths, "validation": abs_paths})
    _register(name, source, [_lines_to_examples])
    return name


def _task(cfg: DataConfig, split: str | None = None) -> seqio.Task | seqio.Mixture:
    """The config's seqio task (or mixture), registered if it is one of ours."""
    _hide_accelerators_from_tf()
    if cfg.text_files:
        name = _text_files_task(tuple(cfg.text_files))
    else:
        name = cfg.task
        if name == SYNTHETIC_TASK:
            _register(name, seqio.FunctionDataSource(_synthetic_dataset_fn,
                                                     splits=tuple(_SYNTHETIC_DOCS)), [])
    try:
        task = seqio.get_mixture_or_task(name)
    except ValueError:
        raise DataError(f"unknown seqio task {name!r}: import the module that registers it "
                        f"before training, set DataConfig.text_files, or use the default "
                        f"{SYNTHETIC_TASK!r}") from None
    if "targets" not in task.output_features:
        raise DataError(f"seqio task {name!r} has no 'targets' feature (it has "
                        f"{sorted(task.output_features)}); use a decoder-only LM task")
    if split is not None and split not in task.splits:
        raise DataError(f"seqio task {name!r} has no split {split!r} (it has "
                        f"{sorted(task.splits)}); fix DataConfig.eval_split")
    return task


@functools.lru_cache(maxsize=None)
def _hide_accelerators_from_tf() -> None:
    """Keeps TensorFlow (input pipeline only) off the GPUs/TPUs that JAX uses."""
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):  # already initialized, or no such device type
            pass


def data_vocab_size(cfg: DataConfig) -> int:
    """Vocabulary size of the task's "targets" feature (ByteVocabulary: 259)."""
    return int(_task(cfg).output_features["targets"].vocabulary.vocab_size)


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


def _model_features(f: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """seqio LM features -> the trainer's names; adds segments/positions when unpacked."""
    targets = f["decoder_target_tokens"]
    nonpad = tf.cast(targets != 0, tf.int32)
    positions = tf.cumsum(tf.ones_like(targets), axis=-1, exclusive=True) * nonpad
    return {"inputs": f["decoder_input_tokens"], "targets": targets,
            "weights": tf.cast(f["decoder_loss_weights"], tf.float32),
            "segment_ids": f.get("decoder_segment_ids", nonpad),
            "positions": f.get("decoder_positions", positions)}


def _deterministic(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options)


def train_batches(cfg: DataConfig, seq_len: int, global_batch: int, process_index: int,
                  process_count: int, start_step: int = 0) -> Iterator[Batch]:
    """This process's batches (global_batch / process_count rows) from start_step on, forever."""
    num_shards, rows, shards = _shard_layout(cfg, global_batch, process_index, process_count)
    task = _task(cfg, "train")
    converter = seqio.LMFeatureConverter(pack=cfg.pack)
    streams = []
    for s in shards:
        ds = seqio.get_dataset(
            task, {"targets": seq_len}, converter, dataset_split="train",
            shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=None, verbose=False,
            shard_info=seqio.ShardInfo(index=s, num_shards=num_shards),
            batch_size=rows)
        streams.append(ds.map(_model_features, num_parallel_calls=_AUTOTUNE))
    ds = tf.data.Dataset.zip(tuple(streams)).map(
        lambda *bs: {key: tf.concat([b[key] for b in bs], axis=0) for key in bs[0]})
    ds = _deterministic(ds.skip(start_step).prefetch(_AUTOTUNE))
    return _forever(ds.as_numpy_iterator(), shards)


def _forever(batches: Iterator[Batch], shards: range) -> Iterator[Batch]:
    """The batches; a typed error instead of StopIteration if a shard holds no data."""
    yield from batches
    raise DataError(f"the train split ran out on shards {list(shards)}: a shard holds no "
                    "documents; use fewer DataConfig.num_shards or more data")


def _eval_rows(task, cfg: DataConfig, seq_len: int, shard: int, num_shards: int,
               max_rows: int) -> tf.data.Dataset:
    """Model-feature rows of one shard of the (capped, unshuffled) eval split."""
    ds = task.get_dataset({"targets": seq_len}, split=cfg.eval_split, shuffle=False,
                          num_epochs=1)
    if cfg.eval_examples:
        ds = ds.take(cfg.eval_examples)  # cap the whole split, before sharding
    ds = seqio.LMFeatureConverter(pack=cfg.pack)(ds.shard(num_shards, shard),
                                                 {"targets": seq_len})
    if max_rows:
        ds = ds.take(max_rows)
    return _deterministic(ds.map(_model_features, num_parallel_calls=_AUTOTUNE))


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
            return None  # _task raises the one-line error
        return tuple((path, st.st_size, st.st_mtime_ns) for path, st in stats)
    return () if cfg.task == SYNTHETIC_TASK else None


def _memo_key(cfg: DataConfig, seq_len: int, shard: int, num_shards: int) -> tuple | None:
    """The key a shard's eval rows are kept under; None when they are not kept."""
    small = 0 < cfg.eval_examples and cfg.eval_examples * seq_len <= _EVAL_MEMO_TOKENS
    stamp = _source_stamp(cfg) if small else None
    return None if stamp is None else (cfg, seq_len, shard, num_shards, stamp)


def _shard_rows(task, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int,
                key: tuple | None) -> Batch:
    """One shard's eval rows as arrays, at most max_rows (0: all).

    The split is read unshuffled and packed in order, so the first n rows do not depend on
    how many are taken. With a capped split (eval_examples) from one of our own sources, a
    process keeps each shard's rows (_memo_key): a trial worker serving several trials then
    reads the split once, not once a trial (the seqio pipeline costs ~1.5 CPU-s a trial on a
    tiny model), whatever each trial's batch. The kept arrays are read-only. `key`: _memo_key's."""
    if key is None:
        return _read_rows(task, cfg, seq_len, shard, num_shards, max_rows)
    if key not in _EVAL_MEMO:
        rows = _read_rows(task, cfg, seq_len, shard, num_shards, 0)
        for array in rows.values():
            array.setflags(write=False)
        while len(_EVAL_MEMO) >= _EVAL_MEMO_SIZE:
            _EVAL_MEMO.pop(next(iter(_EVAL_MEMO)))
        _EVAL_MEMO[key] = rows
    rows = _EVAL_MEMO[key]
    return {k: v[:max_rows] for k, v in rows.items()} if max_rows else dict(rows)


def _read_rows(task, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int) -> Batch:
    ds = _eval_rows(task, cfg, seq_len, shard, num_shards, max_rows)
    parts = list(ds.batch(1024).as_numpy_iterator())
    return {k: np.concatenate([p[k] for p in parts]) if parts
            else np.zeros((0, seq_len), ds.element_spec[k].as_numpy_dtype)
            for k in ds.element_spec}


def eval_batches(cfg: DataConfig, seq_len: int, global_batch: int, process_index: int,
                 process_count: int, max_batches: int = 0) -> list[Batch]:
    """This process's eval batches: finite, as many on every process, padding weight 0.

    The batch count is the largest over all shards (capped at max_batches when > 0);
    a shard that runs short is padded with all-zero rows.
    """
    num_shards, rows, shards = _shard_layout(cfg, global_batch, process_index, process_count)
    task = _task(cfg, cfg.eval_split)
    max_rows = max_batches * rows
    local: dict[int, Batch] = {}
    counts = []
    for s in range(num_shards):
        memo = _memo_key(cfg, seq_len, s, num_shards)
        if s in shards or memo is not None:
            local[s] = _shard_rows(task, cfg, seq_len, s, num_shards, max_rows, memo)
            counts.append(len(local[s]["targets"]))
        else:  # another process's shard: only its row count matters here
            ds = _eval_rows(task, cfg, seq_len, s, num_shards, max_rows)
            counts.append(int(ds.reduce(np.int64(0), lambda n, _: n + 1)))
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
