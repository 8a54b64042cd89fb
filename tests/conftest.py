"""Test session setup: 8 simulated CPU devices, set before anything imports JAX; fixtures
shared by every folder."""
import os
import uuid

import pytest

os.environ["JAX_PLATFORMS"] = "cpu"
from paxsearch.trainer.flagsets import with_device_count  # noqa: E402  (imports no JAX)

os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from . import pg_util  # noqa: E402


@pytest.fixture
def pg_url():
    """A fresh PostgreSQL database for this test, dropped afterwards."""
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = pg_util.connect()
    except psycopg2.OperationalError as e:
        pytest.skip(f"no PostgreSQL on 127.0.0.1:5432 ({e})")
    admin.autocommit = True
    name = f"paxsearch_test_{uuid.uuid4().hex[:10]}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    try:
        yield pg_util.url(name)
    finally:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.close()
