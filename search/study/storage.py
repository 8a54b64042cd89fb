"""Where a study lives: the default SQLite file of a run folder, or a shared RDB URL.

Also the study lock: proposing a trial (budget check, sampling, deduplication, creation) is
done under one lock per study, so drivers on many machines never create more trials than the
budget nor the same config twice: an fcntl lock beside a SQLite file, a PostgreSQL advisory
lock for a PostgreSQL study.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import zlib

import optuna

from ...store import urls
from ...store.urls import ENV_PREFIX, driver_url, mask_url, parse_url, scrub, sqlite_path  # noqa: F401  (re-exported)
from ..errors import UserError


class StorageError(UserError, RuntimeError):
    """The storage cannot be opened or read; the message never holds a password."""


def default_url(run_dir: str) -> str:
    return f"sqlite:///{os.path.join(os.path.abspath(run_dir), 'study.db')}"


def resolve_url(spec: str) -> str:
    """store.urls.resolve_url, its error a StorageError (one line for the user)."""
    try:
        return urls.resolve_url(spec)
    except urls.StorageUrlError as e:
        raise StorageError(str(e)) from None


def open_storage(url: str, create: bool = True) -> optuna.storages.BaseStorage:
    """An Optuna RDB storage (plain optuna schema, so optuna-dashboard opens it). With
    create=False (worker, resume, ls), a SQLite file that does not exist is refused in one line
    and nothing is created: no folder, no empty database, no lock file."""
    url = resolve_url(url)
    try:
        urls.parse_url(url)  # a URL that cannot be read: one line, before anything is touched
    except urls.StorageUrlError as e:
        raise StorageError(str(e)) from None
    path = sqlite_path(url)
    kwargs = {"connect_args": {"timeout": 120}} if path else {"pool_pre_ping": True}
    if path and not create and not os.path.isfile(path):
        raise StorageError(f"storage {mask_url(url)}: no such SQLite file; pass the study.db that `paxsearch run` "
                           "wrote (or create the study first with `paxsearch run SPACE --storage URL --create-only`)")
    if path:
        from .run_folder import FolderError, check_writable

        try:
            check_writable(os.path.dirname(path) or ".", "the SQLite file's folder", "pass another sqlite:/// path")
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        except FolderError as e:
            raise StorageError(f"storage {mask_url(url)}: {e}") from None
        except OSError as e:
            raise StorageError(f"storage {mask_url(url)}: cannot create its folder: {e.strerror}") from None
    try:
        return _create_schema_once(url, path, kwargs)
    except ImportError:
        raise StorageError(f"cannot open storage {mask_url(url)}: its database driver is not installed "
                           "(for PostgreSQL: pip install 'paxsearch[postgres]')") from None
    except urls.StorageUrlError as e:
        raise StorageError(str(e)) from None
    except Exception as e:
        lasting = lasting_error(e, then="")
        if lasting is not None:
            raise StorageError(f"storage {mask_url(url)}: {lasting}") from None
        raise StorageError(f"cannot open storage {mask_url(url)}: {scrub(_first_line(e), url)}") from None


def _create_schema_once(url: str, path: str | None, kwargs: dict) -> optuna.storages.RDBStorage:
    """RDBStorage creates the schema of a fresh database (tables, alembic version row). Drivers
    started at once would race on it (IntegrityError on alembic_version, or SQLite's "table ...
    already exists"): beside a SQLite file
    they take turns under the file lock. A creator outside paxsearch (a reader such as
    optuna.load_study or optuna-dashboard opening the file first, or another driver on a server)
    takes no lock: the loser of that race tries again, when the schema is there."""
    if not path:
        return _rdb_storage(url, kwargs)
    with open(path + ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            return _rdb_storage(url, kwargs)
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _rdb_storage(url: str, kwargs: dict) -> optuna.storages.RDBStorage:
    import sqlalchemy.exc

    for attempt in range(4):
        try:
            return optuna.storages.RDBStorage(driver_url(url), engine_kwargs=kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError) as e:
            # SQLite says the race as OperationalError "table ... already exists"; any other
            # OperationalError (a locked file, a refused connection) is not this race
            lost_race = not isinstance(e, sqlalchemy.exc.OperationalError) or "already exists" in str(e)
            if attempt == 3 or not lost_race:
                raise
            time.sleep(0.5 * (attempt + 1))  # the winner is creating the schema: it is there next time
    raise AssertionError("unreachable")


RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)  # ~60 s: a database restart, a failover, a network blip


def is_transient(e: BaseException) -> bool:
    """A storage error that may pass: a lost or refused connection (not bad data, not a bug)."""
    import sqlalchemy.exc

    cause = e.__cause__ if isinstance(e, optuna.exceptions.StorageInternalError) else e
    if isinstance(cause, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        return True
    return isinstance(cause, sqlalchemy.exc.DBAPIError) and bool(cause.connection_invalidated)


# SQLite result codes that no wait mends: the disk is full, the file is read-only or no database
_SQLITE_FULL, _SQLITE_READONLY, _SQLITE_PERM, _SQLITE_CORRUPT, _SQLITE_NOTADB = 13, 8, 3, 11, 26
_SQLITE_LASTING = {_SQLITE_FULL: "free some space on its disk", _SQLITE_READONLY: "make it writable",
                   _SQLITE_PERM: "make it writable", _SQLITE_CORRUPT: "restore it from a copy",
                   _SQLITE_NOTADB: "pass the study.db that `paxsearch run` wrote"}


MID_RUN = ", then `paxsearch resume` (or `run`) queues again the trial left RUNNING"


def lasting_error(e: BaseException, then: str = MID_RUN) -> StorageError | None:
    """The one-line StorageError of a SQLite error that waiting cannot mend (disk full, read-only,
    corrupt file), else None; `then` ends its fix (by default: the trial in flight stays RUNNING
    for `resume`)."""
    import sqlite3

    cause: BaseException | None = e
    for _ in range(4):  # StorageInternalError -> sqlalchemy OperationalError -> sqlite3 error
        if cause is None or isinstance(cause, sqlite3.Error):
            break
        cause = getattr(cause, "orig", None) or cause.__cause__
    if not isinstance(cause, sqlite3.Error):
        return None
    code = getattr(cause, "sqlite_errorcode", None)
    fix = _SQLITE_LASTING.get(code & 0xFF) if isinstance(code, int) else None
    if fix is None:
        return None
    return StorageError(f"the study database cannot be written ({cause}); {fix}{then}")


def retry(fn, *args, **kwargs):
    """fn(*args, **kwargs), tried again after transient storage errors with growing delays
    (RETRY_DELAYS_S); StorageError (one line) when the storage stays away, or at once when its
    SQLite file cannot be written (disk full, read-only: lasting_error)."""
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            lasting = lasting_error(e)
            if lasting is not None:
                raise lasting from None
            if not is_transient(e):
                raise
            if delay is None:
                raise StorageError(f"the storage stayed unreachable for {sum(RETRY_DELAYS_S):.0f} s "
                                   f"({_first_line(e.__cause__ or e)}); the trial left RUNNING is queued again "
                                   "by the next `paxsearch resume` or `run`") from None
            time.sleep(delay)


def first_line(e: BaseException) -> str:
    """`Type: first line of the message`, at most 300 characters (scrub() it before showing)."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


_first_line = first_line


def open_bounded(url: str, seconds: float) -> optuna.storages.RDBStorage:
    """The same storage through a fresh engine whose every wait is bounded by about `seconds`:
    SQLite's busy timeout, PostgreSQL's connect, lock and statement timeouts. For the writes of
    a driver that is shutting down (a locked database must not hold it for SQLite's usual 120 s,
    and the driver's own engine may have connections held by threads that are stuck)."""
    url = resolve_url(url)
    if sqlite_path(url):
        kwargs: dict = {"connect_args": {"timeout": max(0.1, seconds)}}
    elif url.startswith("postgres"):
        ms = max(100, int(seconds * 1000))
        kwargs = {"connect_args": {"connect_timeout": max(1, int(seconds)),
                                   "options": f"-c lock_timeout={ms} -c statement_timeout={ms}"}}
    else:
        kwargs = {}
    return optuna.storages.RDBStorage(driver_url(url), engine_kwargs=kwargs, skip_compatibility_check=True,
                                      skip_table_creation=True)


@contextlib.contextmanager
def removed_on_failure(url: str):
    """A SQLite file that the block creates is removed when the block fails (a full disk, a
    refused setting, Ctrl-C), with its journal, its lock file and the folders made for it that
    are left empty: a study that could not be created leaves nothing behind."""
    path = sqlite_path(resolve_url(url))
    if not path or os.path.exists(path):
        yield
        return
    made = []
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        made.append(folder)
        folder = os.path.dirname(folder)
    try:
        yield
    except BaseException:
        for leftover in (path, path + "-journal", path + "-wal", path + "-shm", path + ".lock"):
            with contextlib.suppress(OSError):
                os.remove(leftover)
        for folder in made:  # deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


class LockTimeout(RuntimeError):
    """The study lock was not free within the time given to StudyLock.hold."""


def _flock(f, deadline: float | None) -> None:
    if deadline is None:
        fcntl.flock(f, fcntl.LOCK_EX)
        return
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout("the study lock is held elsewhere") from None
            time.sleep(0.05)


class StudyLock:
    """A lock held across machines while a trial is proposed and created."""

    def __init__(self, url: str, study_name: str):
        self.url, self.study_name = resolve_url(url), study_name
        self._thread_lock = threading.Lock()
        self._engine = None
        self._key = zlib.crc32(f"paxsearch:{study_name}".encode()) & 0x7FFFFFFF

    @contextlib.contextmanager
    def hold(self, timeout: float | None = None):
        """Held while the block runs; with `timeout` (seconds), LockTimeout when the lock (of
        this process's other threads or of another driver) is not free by then."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise LockTimeout("the study lock is held by another thread of this driver")
        try:
            path = sqlite_path(self.url)
            if path:
                with open(path + ".lock", "a+") as f:
                    _flock(f, deadline)
                    try:
                        yield
                    finally:
                        fcntl.flock(f, fcntl.LOCK_UN)
            elif self.url.startswith("postgres"):
                with self._pg_lock(deadline):
                    yield
            else:  # other databases: one driver per study is safe; several may overlap
                yield
        finally:
            self._thread_lock.release()

    @contextlib.contextmanager
    def _pg_lock(self, deadline: float | None = None):
        import sqlalchemy

        if self._engine is None:
            self._engine = sqlalchemy.create_engine(driver_url(self.url), poolclass=sqlalchemy.pool.NullPool)
        with self._engine.connect() as conn:
            if deadline is None:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            else:
                try_lock = sqlalchemy.text("SELECT pg_try_advisory_lock(:k)")
                while not conn.execute(try_lock, {"k": self._key}).scalar():
                    if time.monotonic() >= deadline:
                        raise LockTimeout("the study lock is held by another driver")
                    time.sleep(0.05)
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                conn.commit()


def write_study_json(run_dir: str, study_name: str, url: str, space_file: str) -> None:
    """RUN/study.json: how to find the study again (storage null = RUN/study.db; `env:NAME`
    when the URL came from the environment; any password masked)."""
    os.makedirs(run_dir, exist_ok=True)
    storage = None if url == default_url(run_dir) else mask_url(url)
    data = {"study_name": study_name, "storage": storage, "space_file": space_file}
    from .run_folder import write_whole

    write_whole(os.path.join(run_dir, "study.json"), json.dumps(data, indent=2))


def read_study_json(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, "study.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_superseded(t) -> bool:
    """A trial whose config was queued again (a lost host, a dead driver, Ctrl-C): its copy counts, not it."""
    return bool(t.user_attrs.get("superseded"))
