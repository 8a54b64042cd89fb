"""What each test costs, in CPU seconds (its own process's and its subprocesses'), so that
tests/conftest.py hands the costliest xdist groups out first.

    PAXSEARCH_TEST_COSTS_LOG=/tmp/costs.jsonl pytest -m "slow or not slow" ...   # one line per test
    python -m paxsearch.tests.costs /tmp/costs.jsonl                              # -> tests/costs.json

CPU seconds, not wall seconds: they hardly move with the machine's load. Tests under 1 CPU-s
are left out of the table and count COST_UNKNOWN_S, as does a test added since the last profile.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

TABLE = Path(__file__).with_name("costs.json")
LOG_ENV = "PAXSEARCH_TEST_COSTS_LOG"
COST_UNKNOWN_S = 1.0


def load() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(TABLE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no table: collection order stays the files' order


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def log(nodeid: str, cpu_s: float, wall_s: float) -> None:
    """Append one test's cost to $PAXSEARCH_TEST_COSTS_LOG (when set)."""
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"id": nodeid, "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2),
                                "at": time.time()}) + "\n")


def write_table(log_path: str) -> int:
    costs = {}
    for line in Path(log_path).read_text().splitlines():
        row = json.loads(line)
        if row["cpu_s"] >= 1.0:
            costs[row["id"]] = round(row["cpu_s"], 1)
    TABLE.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {v}" for k, v in sorted(costs.items())) + "\n}\n")
    return len(costs)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m paxsearch.tests.costs COSTS_LOG.jsonl")
    print(f"{write_table(sys.argv[1])} tests of 1 CPU-s or more -> {TABLE}")
