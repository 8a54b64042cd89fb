"""How long XLA:CPU lets a collective wait for a late simulated device before it aborts the
process, with XLA's default and with paxsearch's flags (trainer/flagsets.with_device_count).

    python benchmarks/diag_collective_timeout.py [DELAY_S ...]     # default: 50 70

One child process per (delay, flags): 8 simulated CPU devices, a psum under shard_map whose
device 0 first sleeps DELAY_S seconds in a host callback, so the other 7 device threads wait in
the rendezvous. Prints each child's exit status (-6: SIGABRT, from XLA's fatal log) and time.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from paxsearch.trainer.flagsets import DEVICE_COUNT_FLAG, with_device_count

# the "xla_abort" fault of the trial workers (search/trial/execute.py), in a process of its own
CHILD = "import sys; from paxsearch.search.trial.execute import late_collective; late_collective(float(sys.argv[1]))"


def run(delay: float, xla_flags: str) -> tuple[int, float]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags, TF_CPP_MIN_LOG_LEVEL="3")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(delay)], env=env, capture_output=True, text=True,
                          timeout=delay + 300)
    return proc.returncode, time.monotonic() - t0


def main(delays: list[float]) -> None:
    settings = {"XLA's default": f"{DEVICE_COUNT_FLAG}=8", "paxsearch": with_device_count(None, 8)}
    print("| device 0 late by | XLA_FLAGS | exit status | seconds |\n|---|---|---|---|")
    for delay in delays:
        for name, flags in settings.items():
            code, took = run(delay, flags)
            print(f"| {delay:.0f} s | {name} (`{flags}`) | {code} | {took:.0f} |", flush=True)


if __name__ == "__main__":
    main([float(a) for a in sys.argv[1:]] or [50.0, 70.0])
