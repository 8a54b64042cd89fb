"""Tests of trainer/data.py: batches, determinism, sharding, packing, eval padding, sources."""
import os

os.environ["JAX_PLATFORMS"] = "cpu"  # before anything heavy: no accelerator is needed

import dataclasses
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paxsearch.trainer import data, synthetic_data
from paxsearch.trainer.config import DataConfig
from paxsearch.trainer.errors import DataError

SEQ, BATCH = 128, 8
KEYS = {"inputs", "targets", "weights", "segment_ids", "positions"}


def take(it, n):
    return list(itertools.islice(it, n))


def assert_batches_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert a[k].dtype == b[k].dtype, k


def concat_rows(*batches):
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.fixture(scope="module")
def packed():
    """First 3 batches of the default (packed, shuffled) synthetic stream, one process."""
    return take(data.train_batches(DataConfig(), SEQ, BATCH, 0, 1), 3)


@pytest.fixture(scope="module")
def unpacked():
    """First 20 batches of the unpacked stream (a row's fill varies: 20 batches average it)."""
    return take(data.train_batches(DataConfig(pack=False), SEQ, BATCH, 0, 1), 20)


def check_decoder_batch(b, rows):
    assert set(b) == KEYS
    for k in KEYS - {"weights"}:
        assert b[k].dtype == np.int32 and b[k].shape == (rows, SEQ), k
    assert b["weights"].dtype == np.float32 and b["weights"].shape == (rows, SEQ)
    nonpad = b["targets"] != 0
    np.testing.assert_array_equal(b["weights"], nonpad.astype(np.float32))
    np.testing.assert_array_equal(b["segment_ids"] > 0, nonpad)
    np.testing.assert_array_equal(b["positions"][~nonpad], 0)
    # Within a segment: inputs are the targets shifted right, positions count up.
    same = (b["positions"][:, 1:] > 0)
    np.testing.assert_array_equal(b["inputs"][:, 1:][same], b["targets"][:, :-1][same])
    np.testing.assert_array_equal(b["positions"][:, 1:][same], b["positions"][:, :-1][same] + 1)
    np.testing.assert_array_equal(b["segment_ids"][:, 1:][same], b["segment_ids"][:, :-1][same])
    starts = (b["positions"] == 0) & nonpad
    np.testing.assert_array_equal(b["inputs"][starts], 0)
    assert b["targets"].max() < 259


def test_vocab_size():
    assert data.data_vocab_size(DataConfig()) == 259


def test_packed_batches_shapes_and_decoder_inputs(packed):
    for b in packed:
        check_decoder_batch(b, BATCH)
    assert (packed[0]["targets"] == 1).any()  # EOS appended to documents


def test_packing_puts_several_segments_in_a_row(packed, unpacked):
    segments_per_row = np.concatenate([b["segment_ids"].max(axis=1) for b in packed])
    assert (segments_per_row > 1).any()
    fill = lambda bs: np.mean([b["weights"].mean() for b in bs])
    assert fill(packed) > fill(unpacked) + 0.1  # packing removes padding


def test_unpacked_batches_have_one_segment_per_row(unpacked):
    b = unpacked[0]
    check_decoder_batch(b, BATCH)
    np.testing.assert_array_equal(b["segment_ids"], (b["targets"] != 0).astype(np.int32))
    np.testing.assert_array_equal(b["inputs"][:, 0], 0)


def test_same_config_same_batches_and_resume(packed):
    again = take(data.train_batches(DataConfig(), SEQ, BATCH, 0, 1), 3)
    for a, b in zip(packed, again, strict=True):
        assert_batches_equal(a, b)
    (resumed,) = take(data.train_batches(DataConfig(), SEQ, BATCH, 0, 1, start_step=2), 1)
    assert_batches_equal(resumed, packed[2])
    (other_seed,) = take(data.train_batches(DataConfig(seed=1), SEQ, BATCH, 0, 1), 1)
    assert not np.array_equal(other_seed["targets"], packed[0]["targets"])


def test_global_batch_independent_of_process_count():
    cfg = DataConfig(num_shards=2)
    one = take(data.train_batches(cfg, SEQ, BATCH, 0, 1), 2)
    p0 = take(data.train_batches(cfg, SEQ, BATCH, 0, 2), 2)
    p1 = take(data.train_batches(cfg, SEQ, BATCH, 1, 2), 2)
    for step in range(2):
        assert p0[step]["targets"].shape == (BATCH // 2, SEQ)
        assert_batches_equal(one[step], concat_rows(p0[step], p1[step]))
    assert not np.array_equal(p0[0]["targets"], p1[0]["targets"])  # shards differ


def test_indivisible_numbers_are_rejected():
    with pytest.raises(ValueError, match="global_batch=6.*num_shards=4"):
        data.train_batches(DataConfig(num_shards=4), SEQ, 6, 0, 1)
    with pytest.raises(ValueError, match="num_shards=3.*process_count=2"):
        data.train_batches(DataConfig(num_shards=3), SEQ, 6, 0, 2)


def test_eval_padding_same_count_on_every_process():
    # 33 examples: shard 0 has 17 rows (5 batches of 4), shard 1 has 16 (4 batches).
    cfg = DataConfig(pack=False, eval_examples=33)
    one = data.eval_batches(cfg, SEQ, BATCH, 0, 1)
    p0 = data.eval_batches(cfg, SEQ, BATCH, 0, 2)
    p1 = data.eval_batches(cfg, SEQ, BATCH, 1, 2)
    assert len(one) == len(p0) == len(p1) == 5
    for b in one:
        check_decoder_batch(b, BATCH)
    for b in p0 + p1:
        check_decoder_batch(b, BATCH // 2)
    real_rows = sum(int((b["weights"].sum(1) > 0).sum()) for b in p0 + p1)
    assert real_rows == 33
    assert p1[-1]["weights"].sum() == 0  # a whole padding batch for the short shard
    total = lambda bs: sum(float(b["weights"].sum()) for b in bs)
    assert total(p0) + total(p1) == total(one) > 0
    capped = data.eval_batches(cfg, SEQ, BATCH, 0, 2, max_batches=2)
    assert isinstance(capped, list) and len(capped) == 2
    assert_batches_equal(capped[1], p0[1])


def test_eval_rows_are_read_once_per_process_and_equal_a_fresh_read(tmp_path, monkeypatch):
    """A worker serving several trials keeps each shard's eval rows: whatever the batch, a
    second call reads nothing, and what it returns equals the split read afresh (capped as the
    call asks) with the memo off. A text file that changes is read again."""
    cfg = DataConfig(eval_examples=40)
    calls = []
    read = data._read_rows
    monkeypatch.setattr(data, "_read_rows", lambda *a: calls.append(a[3:]) or read(*a))
    data._EVAL_MEMO.clear()
    kept = {(b, m, p, n): data.eval_batches(cfg, SEQ, b, p, n, max_batches=m)
            for b, m, p, n in ((BATCH, 0, 0, 1), (4, 2, 0, 1), (4, 1, 1, 2), (16, 0, 0, 2))}
    assert sorted(calls) == [(0, 1, 0), (0, 2, 0), (1, 2, 0)]  # (shard, shards, max_rows): each shard once, whole
    assert all(not a.flags.writeable for rows in data._EVAL_MEMO.values() for a in rows.values())
    monkeypatch.setattr(data, "_memo_key", lambda *a: None)
    for (b, m, p, n), batches in list(kept.items())[2:]:  # capped rows of shard 1 of 2; all rows of both
        fresh = data.eval_batches(cfg, SEQ, b, p, n, max_batches=m)
        assert len(fresh) == len(batches) > 0, (b, m, p, n)
        for x, y in zip(fresh, batches, strict=True):
            assert_batches_equal(x, y)
    monkeypatch.undo()

    path = tmp_path / "docs.txt"
    path.write_text("the first file\nof two lines\n")
    text = DataConfig(text_files=(str(path),), eval_examples=8)
    before = data.eval_batches(text, SEQ, BATCH, 0, 1)
    path.write_text("another text, longer than the first one\n")
    after = data.eval_batches(text, SEQ, BATCH, 0, 1)
    assert before[0]["weights"].sum() != after[0]["weights"].sum()


def test_packed_eval_tokens_independent_of_process_count():
    cfg = DataConfig(eval_examples=40)
    total = lambda bs: sum(float(b["weights"].sum()) for b in bs)
    p0 = data.eval_batches(cfg, SEQ, BATCH, 0, 2)
    p1 = data.eval_batches(cfg, SEQ, BATCH, 1, 2)
    assert len(p0) == len(p1)
    assert total(p0) + total(p1) == total(data.eval_batches(cfg, SEQ, BATCH, 0, 1))


def test_text_files(tmp_path):
    lines = [f"line number {i} of the test corpus" for i in range(20)]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines[:10]) + "\n\n" + "\n".join(lines[10:]) + "\n")
    cfg = DataConfig(text_files=(str(path),), pack=False, task="ignored_when_files_given")
    assert data.data_vocab_size(cfg) == 259
    (b,) = take(data.train_batches(cfg, SEQ, BATCH, 0, 1), 1)
    check_decoder_batch(b, BATCH)
    for row in b["targets"]:
        text = bytes((row[(row > 1)] - 3).astype(np.uint8).tolist()).decode()
        assert text in lines  # one document per line, blank line dropped
    assert len(data.eval_batches(cfg, SEQ, BATCH, 0, 1)) == 3  # 20 docs in rows of 8


def test_missing_empty_and_unknown_sources_raise(tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(DataError, match="not found.*nope.txt.*text_files"):
        data.train_batches(DataConfig(text_files=(missing,)), SEQ, BATCH, 0, 1)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(DataError, match="empty"):
        data.eval_batches(DataConfig(text_files=(str(empty),)), SEQ, BATCH, 0, 1)
    with pytest.raises(DataError, match="unknown seqio task 'no_such_task'"):
        data.data_vocab_size(DataConfig(task="no_such_task"))
    with pytest.raises(DataError, match="no split 'test'"):
        data.eval_batches(DataConfig(eval_split="test"), SEQ, BATCH, 0, 1)


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory):
    """The synthetic corpus's splits as text files, one document a line (seqio reads them)."""
    folder = tmp_path_factory.mktemp("corpus")
    paths = {}
    for split in synthetic_data.SPLITS:
        paths[split] = str(folder / f"{split}.txt")
        Path(paths[split]).write_text("\n".join(synthetic_data.documents(split)) + "\n")
    return paths


@pytest.mark.parametrize("pack", [True, False])
def test_synthetic_pipeline_equals_seqios_over_the_same_documents(corpus_files, pack):
    """The synthetic corpus is tokenized, shuffled, packed and batched in NumPy
    (trainer/synthetic_data.py); its rows equal seqio's (ByteVocabulary, EOS, the Task's shuffle
    buffer, LMFeatureConverter's packing) over the same documents read from text files, shuffled
    (seed 3) or not, on both shards, over several packing windows (a window is SEQ examples: 40
    batches hold ~250 a shard), and over the whole eval split (to its end). Seeds and the
    buffer's draining: test_the_shuffle_is_tf_datas_element_for_element."""
    for process_index in (0, 1):
        for shuffle in (False, True):
            cfg = DataConfig(shuffle=shuffle, seed=3, pack=pack, num_shards=2)
            ours = data.train_batches(cfg, SEQ, BATCH, process_index, 2)
            text = dataclasses.replace(cfg, text_files=(corpus_files["train"],))
            seqios = data.train_batches(text, SEQ, BATCH, process_index, 2)
            for a, b in zip(take(ours, 40), take(seqios, 40), strict=True):
                assert_batches_equal(a, b)
        ours_eval = data.eval_batches(DataConfig(pack=pack, eval_examples=0), SEQ, BATCH, process_index, 2)
        seqio_eval = data.eval_batches(DataConfig(pack=pack, eval_examples=0, text_files=(corpus_files["validation"],)),
                                       SEQ, BATCH, process_index, 2)
        assert len(ours_eval) == len(seqio_eval) > 10
        for a, b in zip(ours_eval, seqio_eval, strict=True):
            assert_batches_equal(a, b)


@pytest.mark.parametrize("seed,buffer,n", [(0, 1000, 2500), (7, 10, 100), (2**31 + 5, 16, 40)])
def test_the_shuffle_is_tf_datas_element_for_element(seed, buffer, n):
    """synthetic_data's shuffle against tf.data's own (the op seqio's Task shuffles with): a
    finite input (the buffer drained at its end) and a repeated one."""
    import tensorflow as tf

    finite = tf.data.Dataset.range(n).shuffle(buffer, seed=seed)
    ours = synthetic_data._tf_shuffled(iter(range(n)), buffer, seed)
    assert list(ours) == [int(x) for x in finite.as_numpy_iterator()]
    repeated = tf.data.Dataset.range(n).repeat().shuffle(buffer, seed=seed).take(3 * n)
    ours = itertools.islice(synthetic_data._tf_shuffled(itertools.cycle(range(n)), buffer, seed), 3 * n)
    assert list(ours) == [int(x) for x in repeated.as_numpy_iterator()]


def test_the_synthetic_corpus_needs_neither_seqio_nor_tensorflow():
    """A training process on the default data (batches, eval batches, vocabulary, TensorBoard
    scalars) imports neither seqio nor TensorFlow (~7 CPU-s a process). That a seqio source
    does import them: tests/search/trial/test_worker_imports.py."""
    code = ("import sys, tempfile; from paxsearch.trainer import data, tb; "
            "from paxsearch.trainer.config import DataConfig; "
            "next(data.train_batches(DataConfig(), 128, 8, 0, 1)); data.eval_batches(DataConfig(), 128, 8, 0, 1); "
            "data.data_vocab_size(DataConfig()); "
            "w = tb.ScalarWriter(tempfile.mkdtemp()); w.scalars(1, {'a': 1.0}); w.close(); "
            "print(sorted(m for m in ('seqio', 'tensorflow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_synthetic_corpus_is_deterministic_and_learnable():
    docs = synthetic_data.documents("train")
    assert docs[:50] == list(synthetic_data._documents_cached.__wrapped__(20_000, 1234)[:50])
    lengths = np.array([len(d) for d in docs])
    assert lengths.min() >= 10 and lengths.max() <= 400 and lengths.std() > 50
    bytes_ = np.frombuffer(" ".join(docs[:2000]).encode(), np.uint8)
    pairs = np.zeros((256, 256))
    np.add.at(pairs, (bytes_[:-1], bytes_[1:]), 1)
    joint = pairs / pairs.sum()
    prev = joint.sum(axis=1, keepdims=True)
    nz = joint > 0
    unigram = np.bincount(bytes_) / len(bytes_)
    unigram = unigram[unigram > 0]
    assert -(unigram * np.log2(unigram)).sum() < 5.0  # random bytes: 8 bits
    conditional = -(joint[nz] * np.log2((joint / np.maximum(prev, 1e-12))[nz])).sum()
    assert conditional < 3.0  # next byte is quite predictable from the previous one



def test_empty_shard_raises_instead_of_stopping(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("only one document\n")
    cfg = DataConfig(text_files=(str(path),), num_shards=2)
    assert next(data.train_batches(cfg, SEQ, BATCH, 0, 2))["weights"].sum() > 0
    with pytest.raises(DataError, match=r"shards \[1\]"):
        next(data.train_batches(cfg, SEQ, BATCH, 1, 2))
