"""Which compiler flag sets this libtpu accepts per TPU generation: each (set, slice) compiles
the tiny model's train step (mesh data 2 x fsdp x tensor 2 on 8 chips, 1 x 2 x 2 on 4) for a
compile-only topology in a fresh process (libtpu reads
LIBTPU_INIT_ARGS when it loads) and prints one row: accepted, or refused with XLA's line.

Question: which compiler flag sets does this libtpu accept, per TPU generation?
Peer: none: the compiler's own verdict (accepted, or refused with XLA's line) is the answer.

    PYTHONPATH=<dir holding a paxsearch link> python benchmarks/probe_flagsets.py [SET ...] [--slices v6e-8,...]

One compile at a time. The result table is recorded in benchmarks/RESULTS.md."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from paxsearch.search.planning import topology as topo
from paxsearch.trainer import flagsets

SLICES = ("v4-8", "v5e-8", "v5p-8", "v6e-8")

COMPILE = """
import sys
from paxsearch.search.study import configio
from paxsearch.tests.space_factory import tiny_config
from paxsearch.trainer.plan import build_program
from paxsearch.search.planning.topology import topology_devices
devices = topology_devices(sys.argv[1])
n = len(devices)  # data x fsdp x tensor: all-gathers, all-reduces and reduce-scatters all appear
cfg = configio.build(tiny_config(mesh=(2, n // 4, 2) if n >= 8 else (1, n // 2, 2), per_device_batch=2))
build_program(cfg, devices, count_flops=False)
print("compiled")
"""


def probe(name: str, slice_name: str, raw: str | None = None) -> tuple[str, float]:
    """('accepted' | 'refused: <line>', seconds) for set `name` (or the LIBTPU_INIT_ARGS `raw`)
    on compile-only `slice_name`."""
    flags = {"LIBTPU_INIT_ARGS": raw} if raw is not None else flagsets.env_for(name, "tpu", {})
    env = {**os.environ, **flags, **topo.compile_only_env(topo.parse_slice(slice_name)),
           "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", COMPILE, slice_name], env=env, capture_output=True, text=True,
                          timeout=900)
    seconds = time.perf_counter() - t0
    if proc.returncode == 0 and "compiled" in proc.stdout:
        return "accepted", seconds
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    why = next((ln for ln in reversed(lines) if "Error" in ln or "FAILED" in ln or "nknown" in ln),
               lines[-1] if lines else "no output")
    return f"refused: {why[:300]}", seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sets", nargs="*", help="flag sets (default: every set with LIBTPU_INIT_ARGS, unless --raw)")
    ap.add_argument("--slices", default=",".join(SLICES))
    ap.add_argument("--raw", action="append", default=[], metavar="LABEL=FLAGS",
                    help="probe these LIBTPU_INIT_ARGS (not a set) under LABEL")
    args = ap.parse_args()
    print("| set | slice | result | seconds |\n|---|---|---|---|", flush=True)
    sets = args.sets or ([] if args.raw else [n for n in flagsets.names() if flagsets.FLAG_SETS[n].libtpu_init_args])
    todo: list[tuple[str, str | None]] = [(n, None) for n in sets]
    todo += [(label, flags) for label, flags in (r.split("=", 1) for r in args.raw)]
    for name, raw in todo:
        for slice_name in args.slices.split(","):
            result, seconds = probe(name, slice_name, raw)
            print(f"| {name} | {slice_name} | {result} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
