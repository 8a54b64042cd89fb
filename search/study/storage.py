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
        raise StorageError(f"cannot open storage {mask_url(url)}: {scrub(_first_line(e), url)}") from None


def _create_schema_once(url: str, path: str | None, kwargs: dict) -> optuna.storages.RDBStorage:
    """RDBStorage creates the schema of a fresh database (tables, alembic version row). Drivers
    started at once would race on it (IntegrityError on alembic_version): beside a SQLite file
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
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            if attempt == 3:
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


def retry(fn, *args, **kwargs):
    """fn(*args, **kwargs), tried again after transient storage errors with growing delays
    (RETRY_DELAYS_S); StorageError (one line) when the storage stays away."""
    for delay in (*RETRY_DELAYS_S, None):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not is_transient(e):
                raise
            if delay is None:
                raise StorageError(f"the storage stayed unreachable for {sum(RETRY_DELAYS_S):.0f} s "
                                   f"({_first_line(e.__cause__ or e)}); the trial left RUNNING is queued again "
                                   "by the next `paxsearch resume` or `run`") from None
            time.sleep(delay)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


class StudyLock:
    """A lock held across machines while a trial is proposed and created."""

    def __init__(self, url: str, study_name: str):
        self.url, self.study_name = resolve_url(url), study_name
        self._thread_lock = threading.Lock()
        self._engine = None
        self._key = zlib.crc32(f"paxsearch:{study_name}".encode()) & 0x7FFFFFFF

    @contextlib.contextmanager
    def hold(self):
        with self._thread_lock:
            path = sqlite_path(self.url)
            if path:
                with open(path + ".lock", "a+") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    try:
                        yield
                    finally:
                        fcntl.flock(f, fcntl.LOCK_UN)
            elif self.url.startswith("postgres"):
                with self._pg_lock():
                    yield
            else:  # other databases: one driver per study is safe; several may overlap
                yield

    @contextlib.contextmanager
    def _pg_lock(self):
        import sqlalchemy

        if self._engine is None:
            self._engine = sqlalchemy.create_engine(driver_url(self.url), poolclass=sqlalchemy.pool.NullPool)
        with self._engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
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
