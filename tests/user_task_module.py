"""A user's own seqio task, registered on import (`paxsearch run --import paxsearch.tests.user_task_module
--set data.task=user_test_task`): a byte-level LM task over a small in-memory corpus.

When $PAXSEARCH_TEST_TASK_MARKER names a file, every process that reads the task's data
appends its pid there, so a test can tell that a search worker (not only the driver) read it."""
import functools
import os

import seqio
import tensorflow as tf

NAME = "user_test_task"

_DOCS = [f"user document {i}: " + "the quick brown fox jumps over the lazy dog. " * (1 + i % 5) for i in range(64)]


def _dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del shuffle_files, seed
    marker = os.environ.get("PAXSEARCH_TEST_TASK_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(f"{os.getpid()} {split}\n")
    docs = _DOCS if split == "train" else _DOCS[:16]
    return tf.data.Dataset.from_tensor_slices({"targets": tf.constant(docs)})


if NAME not in seqio.TaskRegistry.names():
    seqio.TaskRegistry.add(
        NAME,
        source=seqio.FunctionDataSource(_dataset_fn, splits=("train", "validation")),
        output_features={"targets": seqio.Feature(seqio.ByteVocabulary(), add_eos=True)},
        preprocessors=[functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
                       seqio.preprocessors.append_eos])
