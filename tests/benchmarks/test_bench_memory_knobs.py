"""benchmarks/bench_memory_knobs.py, the memory knobs, context parallelism and pipeline stages in one
script: each mode's command parses to its options (the command before the modes too) and reaches its
own rows, without a compile (a filter that matches no row, or stages that do not divide the chips,
stop it with one line)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paxsearch.benchmarks import bench_memory_knobs

from ..search_util import REPO


def test_the_command_before_the_modes_is_the_knobs_mode():
    args = bench_memory_knobs.parse(["v5e-4", "16384"])
    assert (args.mode, args.slice, args.only) == ("knobs", "v5e-4", "16384")
    args = bench_memory_knobs.parse([])
    assert (args.mode, args.slice, args.only) == ("knobs", "v5e-4", "")


def test_context_and_pipeline_parse_their_own_options():
    args = bench_memory_knobs.parse(["context", "v5e-8", "16384", "context 4"])
    assert (args.mode, args.slice, args.seq_len, args.only) == ("context", "v5e-8", 16384, "context 4")
    assert bench_memory_knobs.parse(["context"]).seq_len is None  # the model's own 16384
    args = bench_memory_knobs.parse(["pipeline", "--stages", "0", "--target", "tpu:v5p-256"])
    assert (args.mode, args.stages, args.target, args.baseline) == ("pipeline", 0, "tpu:v5p-256", False)


@pytest.mark.parametrize("argv, names", [
    (["v5e-4", "no such row"], list(bench_memory_knobs.VARIANTS)),
    (["context", "v5e-8", "1024", "no such mesh"], list(bench_memory_knobs.CONTEXT_MESHES)),
])
def test_each_mode_reaches_its_own_rows(argv, names):
    with pytest.raises(SystemExit) as e:
        bench_memory_knobs.main(argv)
    mode = "context" if argv[0] == "context" else "knobs"
    assert f"bench_memory_knobs {mode}: no row holds 'no such" in str(e.value)
    assert all(n in str(e.value) for n in names)


def test_pipeline_rows_are_the_pipelined_70b_and_its_unpipelined_peer():
    rows = bench_memory_knobs.pipeline_rows(bench_memory_knobs.parse(["pipeline", "--baseline"]), 64)
    assert [name for name, _ in rows] == ["stage=4 fsdp=16 M=8 R=2", "fsdp=64"]
    staged, flat = rows[0][1], rows[1][1]
    assert (staged.pipeline.microbatches, staged.pipeline.repeats) == (8, 2)
    assert staged.per_device_batch == 8 and flat.per_device_batch == 2  # the same global batch
    assert staged.model == flat.model and staged.model.seq_len == 4096
    only = bench_memory_knobs.pipeline_rows(bench_memory_knobs.parse(["pipeline", "--stages", "0"]), 64)
    assert [(name, cfg.per_device_batch) for name, cfg in only] == [("fsdp=64", 8)]
    with pytest.raises(SystemExit, match="--stages 3 does not divide the 64 chips"):
        bench_memory_knobs.main(["pipeline", "--stages", "3"])  # tpu:v5p-128: 64 chips


def test_the_script_runs_as_recorded_and_a_bad_filter_is_one_line():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_memory_knobs.py"), "v5e-4",
                           "no such row"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"bench_memory_knobs knobs: no row holds 'no such row'; rows: {'; '.join(bench_memory_knobs.VARIANTS)}"]
