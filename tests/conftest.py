"""Test session setup: 8 simulated CPU devices, set before anything imports JAX; the fixtures
every folder shares:

- cli            `paxsearch ARGS` in a subprocess (search_util.cli)
- run_dir        a run folder path for this test (not created: the CLI creates it)
- make_space     the space factory over the tiny model (space_factory.tiny_space): writes a
                 space file and returns its path
- tiny_config_file  a `paxsearch train` config file of the tiny model
- tiny_grid_run  one finished study of the tiny space that several tests read (run once)
- pg_database    one fresh PostgreSQL database for the whole session, dropped at the end
- pg_url         that database's URL, emptied after each test that uses it

and, for every test (autouse), the CPU's matmul peak measured once per session.
"""
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest

os.environ["JAX_PLATFORMS"] = "cpu"
from paxsearch.trainer.flagsets import with_device_count  # noqa: E402  (imports no JAX)

os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)  # and collectives 10 minutes to abort
# The suite compiles hundreds of tiny programs and runs each for a few steps: LLVM's -O0 halves
# XLA:CPU's compile time (a tiny model's jitted init 11 -> 3 CPU-s, its gradient 6.4 -> 3.4) and
# changes no HLO pass (fusion, sharding, scheduling happen before the backend) nor any value's
# IEEE semantics. Tests check behaviour, never speed; benchmarks/ run with XLA's defaults.
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# XLA:CPU's loop emitters instead of its MLIR fusion emitters halve it again (the tiny model's
# step 2.8 -> 1.5 s, its init 1.4 -> 0.8 s; tests/trainer/test_model_family.py 167 -> 83 CPU-s).
# Unlike -O0 this reaches the fusion pass: on the tiny model XLA's FLOP count moves 0.03% and
# the peak 256 bytes, the loss 1e-6. Every figure a test compares is compiled under the same
# flags (subprocesses inherit them), and TPU plans never see them (search/planning/topology.py keeps
# XLA:CPU's flags from libtpu, whose XLA does not know this one).
if "--xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
# One persistent compilation cache for the whole session: this process's compiles and every
# subprocess's (trial workers read JAX_COMPILATION_CACHE_DIR through workers/pool.py), so the
# same tiny program is compiled once per session, not once per test and process.
# Under pytest-xdist the controller imports this file first and its workers inherit the folder.
_OWN_CACHE = not (os.environ.get("PAXSEARCH_TEST_XLA_CACHE") or os.environ.get("_PAXSEARCH_SESSION_XLA_CACHE"))
_SESSION_CACHE = Path(os.environ.get("PAXSEARCH_TEST_XLA_CACHE") or os.environ.get("_PAXSEARCH_SESSION_XLA_CACHE")
                      or Path(tempfile.gettempdir()) / f"paxsearch-test-xla-cache-{os.getpid()}")
os.environ["_PAXSEARCH_SESSION_XLA_CACHE"] = str(_SESSION_CACHE)
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_SESSION_CACHE)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# No plan cache shared between tests (search/planning/plan_cache.py): a test that plans compiles
# what it checks; one that tests the cache names its own folder (--plan-cache DIR).
os.environ["PAXSEARCH_PLAN_CACHE"] = "off"

from . import costs as test_costs  # noqa: E402
from . import pg_util, search_util, space_factory  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def cpu_peak_measured_once(tmp_path_factory):
    """MFU on CPU divides by this machine's measured matmul peak (trainer/flops.py), which is
    cached in $PAXSEARCH_CACHE/cpu_peak.json only when measured on an idle machine. The suite
    keeps the machine busy, so every trial worker, `paxsearch train` and train() measured it
    again (~1-2 s each). The session measures it once (or takes the user's cached figure) into
    a cache folder of its own that every test and subprocess reads through PAXSEARCH_CACHE;
    the user's cache is never written."""
    from paxsearch.trainer import flops

    before = os.environ.get("PAXSEARCH_CACHE")
    user_cache = flops._cache_file()
    session = tmp_path_factory.mktemp("paxsearch_cache")
    if user_cache.exists():
        shutil.copy(user_cache, session / user_cache.name)
    os.environ["PAXSEARCH_CACHE"] = str(session)
    with mock.patch.object(flops.os, "getloadavg", lambda: (0.0, 0.0, 0.0)):
        flops.measured_cpu_peak("float32")  # stored in the session folder whatever the load
    assert Path(flops._cache_file()).parent == session
    yield
    if before is None:
        os.environ.pop("PAXSEARCH_CACHE", None)
    else:
        os.environ["PAXSEARCH_CACHE"] = before


@pytest.fixture(scope="session")
def cli():
    """`cli(*args, env=None, timeout=600, check=True, faults=None)`: see search_util.cli."""
    return search_util.cli


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"


@pytest.fixture
def make_space(tmp_path):
    """`make_space(name="tiny_space", study=..., decisions=..., **fields)` writes tmp_path/<name>.py
    through space_factory.tiny_space (with no arguments: tests/spaces/tiny_space.py's space) and
    returns its path; the study is named `name`."""
    def make(name: str = "tiny_space", **kwargs) -> str:
        return space_factory.write_space(tmp_path / f"{name}.py", **kwargs)
    return make


@pytest.fixture
def tiny_config_file(tmp_path):
    """A `paxsearch train` config file: the tiny model on mesh 8x1x1, per-device batch 1, 2 steps,
    no eval, a log line every step (space_factory.tiny_config())."""
    return space_factory.write_config(tmp_path / "tiny.py")


@pytest.fixture(scope="session")
def tiny_grid_run(tmp_path_factory):
    """(run folder, its `paxsearch run` output): tests/spaces/tiny_space.py with per-device batch
    2, i.e. its 3 meshes one trial each (`run --trials 50 --set per_device_batch=2`), run once for
    the session. Tests that read it must leave its study as it is (reports, exports and trains
    into other folders are fine); the folder holding it holds nothing else."""
    run = tmp_path_factory.mktemp("tiny_grid") / "grid"
    out = search_util.cli("run", search_util.TINY, "--run-dir", run, "--trials", 50, "--set", "per_device_batch=2",
                          "--no-progress")
    return run, out


@pytest.fixture(scope="session")
def pg_database():
    """A uniquely named PostgreSQL database created for this test session and dropped at its
    end (server on 127.0.0.1:5432, trust auth); skips where no server answers."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = pg_util.connect()
    except psycopg2.OperationalError as e:
        pytest.skip(f"no PostgreSQL on {pg_util.HOST}:{pg_util.PORT} ({e})")
    admin.autocommit = True
    name = f"paxsearch_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        with admin.cursor() as cur:
            cur.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()


@pytest.fixture
def pg_url(pg_database):
    """The session database's URL (postgresql://postgres@127.0.0.1:5432/NAME). It starts empty
    for each test: after the test every connection to it is closed and its schema dropped."""
    yield pg_util.url(pg_database)
    pg_util.empty(pg_database)


def pytest_sessionfinish(session, exitstatus):
    """The session's compilation cache goes with the session that made it (not with an xdist
    worker, and not when the caller named one with PAXSEARCH_TEST_XLA_CACHE)."""
    if _OWN_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under `-n N --dist loadgroup` (pyproject's addopts) a test file runs on one xdist worker,
    so its module-scoped fixtures are built once; the tests that read the session's tiny grid
    study run together, so it is run once.

    The groups are handed out costliest first (longest processing time first: with pyproject's
    --no-loadscope-reorder xdist takes them in collection order), so that no worker starts a
    long file while the other runs out of work. A group's cost is the CPU seconds its selected
    tests took in the last profile (tests/costs.json, tests/costs.py); a test
    not in it counts COST_UNKNOWN_S."""
    groups: dict[str, list] = {}
    for item in items:
        group = "tiny_grid" if "tiny_grid_run" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    costs = test_costs.load()
    ordered = sorted(groups.values(), key=lambda g: -sum(costs.get(i.nodeid, test_costs.COST_UNKNOWN_S) for i in g))
    items[:] = [item for group in ordered for item in group]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With $PAXSEARCH_TEST_COSTS_LOG set, each test's CPU seconds go there (tests/costs.py)."""
    if not os.environ.get(test_costs.LOG_ENV):
        yield
        return
    cpu0, wall0 = test_costs.cpu_seconds(), time.time()
    yield
    test_costs.log(item.nodeid, test_costs.cpu_seconds() - cpu0, time.time() - wall0)
