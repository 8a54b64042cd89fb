"""Storage under concurrency and outages (issue 10, defects 6 and 8)."""
import subprocess
import sys
import time

import pytest

from ... import pg_util
from ...search_util import REPO

OPEN_AT = '''
import sys, time
import optuna
from paxsearch.search.study.storage import open_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
print("ready", flush=True)
start = float(sys.stdin.readline())  # the same instant for every process of the round
time.sleep(max(0.0, start - time.time() - 0.02))
while time.time() < start:
    pass
if sys.argv[2] == "paxsearch":
    storage = open_storage(sys.argv[1])
    optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
else:  # a reader outside paxsearch (optuna-dashboard, a notebook): it creates the schema too, unlocked
    try:
        optuna.storages.RDBStorage(sys.argv[1])
    except Exception:  # its own loss of the race is not ours to judge
        pass
'''


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_drivers_started_at_once_on_a_fresh_run_folder_share_the_schema(tmp_path):
    """Defect 8: several processes creating the schema of one fresh SQLite file at the same
    instant all succeed (5 fresh files, 4 processes on each, all 20 released by the clock once
    every one has imported). On each file one of the four is a plain Optuna reader, which
    creates the schema without paxsearch's lock (SQLite then tells the loser "table ... already
    exists", an OperationalError)."""
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, f"sqlite:///{tmp_path / f'r{round_}' / 'study.db'}",
                               "reader" if i == 0 else "paxsearch"],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for round_ in range(5) for i in range(4)]
    ready = [p.stdout.readline().strip() for p in procs]
    start = time.time() + 0.2
    for p in procs:
        try:
            p.stdin.write(f"{start!r}\n")
            p.stdin.flush()
        except BrokenPipeError:  # it failed before it was ready: its error is read below
            pass
    failures = []
    for p, line in zip(procs, ready, strict=True):
        _, err = p.communicate(timeout=120)
        if p.returncode != 0 or line != "ready":
            failures.append((err.strip().splitlines() or [line])[-1])
    assert not failures, failures


def _outage(dbname: str, until, seconds: float, longest: float = 120.0) -> None:
    """A real outage of one database: no new connections, every open one cut, until `until()`
    holds (at most `longest` s), then `seconds` more."""
    admin = pg_util.connect()
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS false")
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
        deadline = time.time() + longest
        while not until() and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(seconds)
    finally:
        with admin.cursor() as cur:
            cur.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
        admin.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_short_postgresql_outage_is_ridden_out(tmp_path, pg_url):
    """Defect 6: the database goes away as a trial starts and comes back 5 s after the trial
    ended; the driver retries, records the trial and exits 0 with nothing left RUNNING."""
    import optuna
    from optuna.trial import TrialState

    from paxsearch.search.study.storage import driver_url

    from ...search_util import TINY

    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "paxsearch.search.cli", "run", TINY, "--storage", pg_url,
                             "--run-dir", str(run), "--trials", "1", "--no-progress"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    config = run / "trials" / "0" / "config.json"  # written once the trial's attributes are stored
    deadline = time.time() + 300
    while not config.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    log = run / "trials" / "0" / "log.txt"
    # short: at most 35 s, inside the driver's 60 s of retries even when the trial trains slowly (a loaded CI
    # machine once took it past 60 s and the driver, rightly, gave up)
    _outage(pg_url.rsplit("/", 1)[1], lambda: log.exists() and log.read_text().count("== trial 0") == 2, 5.0,
            longest=30.0)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="tiny_space", storage=driver_url(pg_url)).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE], [(t.state, t.user_attrs.get("failure_message"))
                                                                 for t in trials]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_long_postgresql_outage_stops_the_driver_and_leaves_the_trial_to_requeue(tmp_path, pg_url):
    """Defect 6: past the retry budget the driver exits non-zero with one line, and its trial
    is left RUNNING with a dead owner, which the next `resume` / `run` queues again."""
    import optuna
    from optuna.trial import TrialState

    from paxsearch.search.driver.takeover import is_stale
    from paxsearch.search.study import storage as storage_lib

    from ...search_util import TINY

    run = tmp_path / "run"
    retries = 3  # the driver gives up after 1 + 2 + 4 s of retries, not the product's minute (fault_driver.py)
    proc = subprocess.Popen([sys.executable, "-m", "paxsearch.tests.fault_driver", f"storage_retries:{retries}", "run",
                             TINY, "--storage", pg_url, "--run-dir", str(run), "--trials", "1", "--no-progress"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    config = run / "trials" / "0" / "config.json"
    deadline = time.time() + 300
    while not config.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    log = run / "trials" / "0" / "log.txt"
    _outage(pg_url.rsplit("/", 1)[1], lambda: log.exists() and log.read_text().count("== trial 0") == 2,
            sum(storage_lib.RETRY_DELAYS_S[:retries]) + 10.0)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("paxsearch")]
    assert len(lines) == 1 and "unreachable" in lines[0] and "Traceback" not in err, err[-3000:]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name="tiny_space", storage=storage_lib.driver_url(pg_url)).get_trials()
    assert [t.state for t in trials] == [TrialState.RUNNING] and is_stale(trials[0])
