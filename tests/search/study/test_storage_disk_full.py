"""A full disk and the study's storage (issue 22, leftovers of defect 8): a study.db that fills
up is one line at once (not a minute of retries as for an outage); a new study that cannot be
created leaves no study.db, lock file or folder. (A driver that stops on a full run folder
queues its trial in flight again: cli/test_filesystem_inputs.py.)"""
import time

import optuna
import pytest
import sqlalchemy

from paxsearch.search.study import storage as storage_lib

from ...search_util import TINY
from ..cli.test_filesystem_inputs import error_lines, in_small_fs


def test_a_full_study_database_is_one_line_at_once_not_a_storage_outage(tmp_path):
    """SQLite's own SQLITE_FULL (max_page_count reached) through retry(): a StorageError saying
    what to do, raised at once; a lost connection (a transient error) is still retried."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    storage = storage_lib.open_storage(url)
    study = optuna.create_study(study_name="s", storage=storage)
    pages = sqlalchemy.text("PRAGMA page_count")
    with storage.engine.connect() as conn:
        full_at = conn.execute(pages).scalar()

    def cap(dbapi_conn, _record):
        dbapi_conn.execute(f"PRAGMA max_page_count = {full_at}")

    sqlalchemy.event.listen(storage.engine, "connect", cap)
    storage.engine.dispose()  # every connection from now on is capped at the current size
    t0 = time.monotonic()
    with pytest.raises(storage_lib.StorageError, match=r"database or disk is full.*free some space on its disk, "
                                                       r"then `paxsearch resume`"):
        storage_lib.retry(storage.set_study_user_attr, study._study_id, "big", "x" * 100_000)
    assert time.monotonic() - t0 < 2.0

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
        return "ok"

    assert storage_lib.retry(flaky) == "ok" and len(calls) == 2


def test_a_new_study_on_a_full_disk_leaves_nothing_behind(tmp_path):
    """The disk fills while study.db is created: one line, and no study.db, lock file or run
    folder left (the folder the study's disk holds is as it was)."""
    full = tmp_path / "full"
    proc = in_small_fs(full, "size=64k", "run", TINY, "--run-dir", full / "run", "--trials", "1", "--no-progress",
                       after=f"ls -A {full} > {tmp_path / 'left.txt'};")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert error_lines(proc) == [f"paxsearch: error: storage sqlite:///{full}/run/study.db: the study database cannot "
                                 "be written (database or disk is full); free some space on its disk"], proc.stderr
    assert (tmp_path / "left.txt").read_text() == ""

