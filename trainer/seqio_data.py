"""The token pipeline over a seqio task: a registered task (a user's) or local text files.

Imported by trainer/data.py only for such a source: it imports seqio and TensorFlow (~7 CPU-s
a process), which the default synthetic corpus (trainer/synthetic_data.py) never needs.
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterator

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before seqio imports TensorFlow

import numpy as np

from .config import DataConfig
from .errors import DataError
from .quiet import native_stderr_silenced

with native_stderr_silenced():  # TensorFlow's native start-up lines (trainer/quiet.py)
    import seqio
    import tensorflow as tf

_AUTOTUNE = tf.data.AUTOTUNE
Batch = dict[str, np.ndarray]


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


def task(cfg: DataConfig, split: str | None = None, synthetic_name: str = "") -> seqio.Task | seqio.Mixture:
    """The config's seqio task (or mixture), registered if it is one of ours.
    `synthetic_name`: the default task's name, for the error that names it."""
    _hide_accelerators_from_tf()
    name = _text_files_task(tuple(cfg.text_files)) if cfg.text_files else cfg.task
    try:
        found = seqio.get_mixture_or_task(name)
    except ValueError:
        raise DataError(f"unknown seqio task {name!r}: import the module that registers it "
                        f"before training, set DataConfig.text_files, or use the default "
                        f"{synthetic_name!r}") from None
    if "targets" not in found.output_features:
        raise DataError(f"seqio task {name!r} has no 'targets' feature (it has "
                        f"{sorted(found.output_features)}); use a decoder-only LM task")
    if split is not None and split not in found.splits:
        raise DataError(f"seqio task {name!r} has no split {split!r} (it has "
                        f"{sorted(found.splits)}); fix DataConfig.eval_split")
    return found


@functools.lru_cache(maxsize=None)
def _hide_accelerators_from_tf() -> None:
    """Keeps TensorFlow (input pipeline only) off the GPUs/TPUs that JAX uses."""
    for kind in ("GPU", "TPU"):
        try:
            tf.config.set_visible_devices([], kind)
        except (RuntimeError, ValueError):  # already initialized, or no such device type
            pass


def vocab_size(found) -> int:
    return int(found.output_features["targets"].vocabulary.vocab_size)


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


def train_batches(found, cfg: DataConfig, seq_len: int, rows: int, shards: range, num_shards: int,
                  start_step: int) -> Iterator[Batch]:
    """This process's batches from start_step on: each shard's `rows` rows, in shard order."""
    converter = seqio.LMFeatureConverter(pack=cfg.pack)
    streams = []
    for s in shards:
        ds = seqio.get_dataset(
            found, {"targets": seq_len}, converter, dataset_split="train",
            shuffle=cfg.shuffle, seed=cfg.seed, num_epochs=None, verbose=False,
            shard_info=seqio.ShardInfo(index=s, num_shards=num_shards),
            batch_size=rows)
        streams.append(ds.map(_model_features, num_parallel_calls=_AUTOTUNE))
    ds = tf.data.Dataset.zip(tuple(streams)).map(
        lambda *bs: {key: tf.concat([b[key] for b in bs], axis=0) for key in bs[0]})
    ds = _deterministic(ds.skip(start_step).prefetch(_AUTOTUNE))
    return ds.as_numpy_iterator()


def _eval_rows(found, cfg: DataConfig, seq_len: int, shard: int, num_shards: int,
               max_rows: int) -> tf.data.Dataset:
    """Model-feature rows of one shard of the (capped, unshuffled) eval split."""
    ds = found.get_dataset({"targets": seq_len}, split=cfg.eval_split, shuffle=False,
                           num_epochs=1)
    if cfg.eval_examples:
        ds = ds.take(cfg.eval_examples)  # cap the whole split, before sharding
    ds = seqio.LMFeatureConverter(pack=cfg.pack)(ds.shard(num_shards, shard),
                                                 {"targets": seq_len})
    if max_rows:
        ds = ds.take(max_rows)
    return _deterministic(ds.map(_model_features, num_parallel_calls=_AUTOTUNE))


def eval_rows(found, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int) -> Batch:
    """One shard's eval rows as arrays, at most max_rows (0: all)."""
    ds = _eval_rows(found, cfg, seq_len, shard, num_shards, max_rows)
    parts = list(ds.batch(1024).as_numpy_iterator())
    return {k: np.concatenate([p[k] for p in parts]) if parts
            else np.zeros((0, seq_len), ds.element_spec[k].as_numpy_dtype)
            for k in ds.element_spec}


def eval_row_count(found, cfg: DataConfig, seq_len: int, shard: int, num_shards: int, max_rows: int) -> int:
    """How many eval rows another process's shard holds (at most max_rows; 0: all)."""
    ds = _eval_rows(found, cfg, seq_len, shard, num_shards, max_rows)
    return int(ds.reduce(np.int64(0), lambda n, _: n + 1))
