"""`python -m paxsearch.tests.fault_driver FAULTS paxsearch-args...`: the paxsearch CLI with
faults injected into chosen trials, e.g. "1:hang,2:nan,3:segfault" (tests only).

This entry point is the only way to reach search.driver.FAULTS: production commands read no
fault setting from the environment or the study.
"""
import sys

from paxsearch.search import cli
from paxsearch.search.driver import loop as driver


def parse_faults(text: str) -> dict[int, str]:
    out = {}
    for item in text.split(","):
        n, kind = item.split(":", 1)
        out[int(n)] = kind.strip()
    return out


if __name__ == "__main__":
    driver.FAULTS.update(parse_faults(sys.argv[1]))
    sys.exit(cli.main(sys.argv[2:]))
