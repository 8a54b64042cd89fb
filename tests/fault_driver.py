"""`python -m paxsearch.tests.fault_driver FAULTS paxsearch-args...`: the paxsearch CLI with
faults injected into chosen trials, e.g. "1:hang,2:nan,3:segfault" (tests only).

FAULTS may also hold driver settings that tests need and no user should change:
"host:NAME" (the host this driver's trials are owned by, so that two drivers on one machine
judge each other by heartbeat as drivers of two machines do), "stale_after:S" (a trial of
another host whose heartbeat is older is taken over), "heartbeat:S" (the beat's period) and
"storage_retries:N" (an unreachable storage is tried again after the first N delays of
storage.RETRY_DELAYS_S only, so that a test sees the driver give up without waiting a minute).

This entry point is the only way to reach search.driver.loop.FAULTS and the driver settings
(search/driver/takeover.py): production commands read no fault setting from the environment or
the study.
"""
import sys

from paxsearch.search import cli
from paxsearch.search.driver import loop, takeover
from paxsearch.search.study import storage

SETTINGS = {"host": ("HOST", str), "stale_after": ("STALE_AFTER_S", float), "heartbeat": ("HEARTBEAT_S", float)}


def parse_faults(text: str) -> dict[int, str]:
    out = {}
    for item in text.split(","):
        n, kind = item.split(":", 1)
        if n == "storage_retries":
            storage.RETRY_DELAYS_S = storage.RETRY_DELAYS_S[:int(kind)]
            continue
        if n in SETTINGS:
            name, type_ = SETTINGS[n]
            setattr(takeover, name, type_(kind))
            continue
        out[int(n)] = kind.strip()
    return out


if __name__ == "__main__":
    loop.FAULTS.update(parse_faults(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
