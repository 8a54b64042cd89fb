"""The local PostgreSQL server of the development and CI machines (127.0.0.1:5432, trust auth,
user postgres, database `test`), for the multi-worker study tests."""
from __future__ import annotations

HOST, PORT, USER, ADMIN_DB = "127.0.0.1", 5432, "postgres", "test"


def connect(dbname: str = ADMIN_DB):
    import psycopg2

    return psycopg2.connect(host=HOST, port=PORT, user=USER, dbname=dbname, connect_timeout=3)


def url(dbname: str, password: str | None = None, driver: str = "") -> str:
    """The URL of database `dbname` (`driver` e.g. "+psycopg2"; a password is accepted by trust auth)."""
    auth = USER if password is None else f"{USER}:{password}"
    return f"postgresql{driver}://{auth}@{HOST}:{PORT}/{dbname}"


def empty(dbname: str) -> None:
    """Make `dbname` empty again (every study gone): close whatever is still connected to it
    (a killed worker's session, an outage test's refusal) and recreate its public schema."""
    admin = connect()
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f"ALTER DATABASE {dbname} ALLOW_CONNECTIONS true")
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
    finally:
        admin.close()
    conn = connect(dbname)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("DROP SCHEMA public CASCADE")
            cur.execute("CREATE SCHEMA public")
    finally:
        conn.close()
