"""Storage under concurrency and outages (issue 10, defects 6 and 8)."""
import os
import subprocess
import sys
import time

import pytest

from .search_util import REPO

OPEN_AT = '''
import sys, time
import optuna
from paxsearch.search.storage import open_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
start = float(sys.argv[2])
while time.time() < start:
    pass
storage = open_storage(sys.argv[1])
optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
'''


def test_drivers_started_at_once_on_a_fresh_run_folder_share_the_schema(tmp_path):
    """Defect 8: several processes creating the schema of one fresh SQLite file at the same
    instant all succeed (rounds of 4 processes released by the clock)."""
    failures = []
    for round_ in range(5):
        url = f"sqlite:///{tmp_path / f'r{round_}' / 'study.db'}"
        start = time.time() + 4.0
        procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT, url, str(start)], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            if p.returncode != 0:
                failures.append(err.strip().splitlines()[-1])
    assert not failures, failures
