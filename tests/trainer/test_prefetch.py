"""The input prefetcher: same training as without it, errors surface in the caller, no hangs."""
import threading
import time

import pytest

from paxsearch.trainer.config import DataConfig
from paxsearch.trainer.errors import DataError
from paxsearch.trainer.plan import build_program
from paxsearch.trainer.prefetch import Prefetcher
from paxsearch.trainer.train import train

from ..trainer_util import tiny


def _run_in_thread(fn, timeout_s: float):
    """fn() in a thread; (result, error). Fails the test, instead of hanging it, past timeout_s."""
    out = {}

    def target():
        try:
            out["result"] = fn()
        except BaseException as e:  # handed back to the test
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"did not finish within {timeout_s} s (hang)"
    return out.get("result"), out.get("error")


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_prefetching_loop_gives_the_same_losses_as_no_prefetch():
    cfg = tiny(ici=(2, 4, 1), steps=5, log_every=1)
    program = build_program(cfg, count_flops=False)
    runs = {depth: train(cfg, program=program, prefetch=depth) for depth in (0, 1, 2)}
    losses = {depth: [m.loss for m in r.history] for depth, r in runs.items()}
    assert len(losses[0]) == 5
    assert losses[0][-1] < losses[0][0]  # it trains
    assert losses[1] == losses[0]
    assert losses[2] == losses[0]
    grad_norms = {depth: [m.grad_norm for m in r.history] for depth, r in runs.items()}
    assert grad_norms[2] == grad_norms[0]


@pytest.mark.slow  # quick-loop budget (issue 18): a whole training run; CI runs it
def test_data_error_in_the_prefetch_thread_is_raised_by_train(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("only one document\n")
    # two shards, one document: shard 1 holds nothing, so the pipeline raises DataError
    # from inside the prefetch thread on its first batch
    cfg = tiny(steps=3, data=DataConfig(text_files=(str(path),), num_shards=2))
    program = build_program(cfg, count_flops=False)
    _, error = _run_in_thread(lambda: train(cfg, program=program, prefetch=2), timeout_s=300)
    assert isinstance(error, DataError), error
    assert "shards [0, 1]" in str(error) and "num_shards" in str(error)
    _, error0 = _run_in_thread(lambda: train(cfg, program=program, prefetch=0), timeout_s=300)
    assert type(error0) is type(error) and str(error0) == str(error)


def test_prefetcher_order_read_ahead_and_error_object():
    boom = DataError("shard 3 is corrupt; fix the data")
    read = []

    def source():
        for i in range(6):
            read.append(i)
            yield i
        raise boom

    p = Prefetcher(source(), lambda x: x * 10, depth=2)
    assert next(p) == 0
    deadline = time.monotonic() + 30
    while len(read) < 4 and time.monotonic() < deadline:  # 1 taken + 2 queued + 1 in hand
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(read) == 4, read  # read ahead, but no further than the depth allows
    assert [next(p) for _ in range(5)] == [10, 20, 30, 40, 50]
    with pytest.raises(DataError) as excinfo:
        next(p)
    assert excinfo.value is boom  # the very exception the source raised
    with pytest.raises(StopIteration):
        next(p)
    p.close()


def test_prefetcher_place_error_surfaces_and_close_does_not_hang():
    def place(x):
        if x == 2:
            raise ValueError("cannot place batch 2")
        return x

    p = Prefetcher(iter(range(10)), place, depth=2)
    assert [next(p), next(p)] == [0, 1]
    with pytest.raises(ValueError, match="cannot place batch 2"):
        next(p)

    def endless():
        while True:
            yield 1

    q = Prefetcher(endless(), lambda x: x, depth=2)
    assert next(q) == 1
    _, error = _run_in_thread(q.close, timeout_s=30)  # producer blocked on a full queue
    assert error is None
    assert not q._thread.is_alive()


def test_prefetcher_depth_zero_reads_in_the_caller():
    read = []

    def source():
        for i in range(3):
            read.append(threading.current_thread().name)
            yield i

    p = Prefetcher(source(), lambda x: x + 1, depth=0)
    assert list(p) == [1, 2, 3]
    assert set(read) == {threading.current_thread().name}
    with pytest.raises(ValueError, match="depth"):
        Prefetcher(iter(()), lambda x: x, depth=-1)
