"""benchmarks/bench_plan_method.py, the plan-time benchmark (the HLO passes against the full compile, and
with --phases one full compile's phases, compiled once against twice): the options parse to their mode,
an option of the other mode or a bad --phases config is one error line before any process starts, and
the 'twice' method still reaches the function build_program asks (trainer/plan.compile_only)."""
from __future__ import annotations

import inspect

import pytest

from paxsearch.benchmarks import bench_plan_method
from paxsearch.trainer import plan as plan_lib


def test_the_comparison_is_the_default_and_phases_take_their_defaults():
    args = bench_plan_method.parse(["--only", "v5e-256 16B", "--no-llama"])
    assert (args.phases, args.repeat, args.only, args.no_llama, args.preset) == (
        False, 1, ["v5e-256 16B"], True, None)
    args = bench_plan_method.parse(["--phases"])
    assert (args.phases, args.repeat, args.preset, args.target, args.ici, args.per_device_batch, args.remat) == (
        True, 2, "llama2-70b", "tpu:v5p-256", (1, 128, 1), 1, "full")
    args = bench_plan_method.parse(["--phases", "--preset", "llama3-8b", "--target", "tpu:v5e-64", "--ici",
                                    "1x64x1", "--repeat", "1"])
    assert (args.preset, args.target, args.ici, args.repeat) == ("llama3-8b", "tpu:v5e-64", (1, 64, 1), 1)


@pytest.mark.parametrize("argv, line", [
    (["--preset", "llama3-8b"], "--preset only with --phases"),
    (["--phases", "--no-rows"], "--no-rows not with --phases"),
    (["--phases", "--preset", "no-such"], "unknown model preset 'no-such'"),
    (["--phases", "--target", "tpu:v9-8"], "unknown TPU slice 'v9-8'"),
    (["--phases", "--ici", "1x128"], "--ici 1x128: data x fsdp x tensor"),
])
def test_a_bad_option_is_one_error_line(argv, line, capsys):
    with pytest.raises(SystemExit) as e:
        bench_plan_method.main(argv)
    assert e.value.code == 2 and line in capsys.readouterr().err


def test_the_report_mode_reads_stored_results_without_planning(tmp_path, capsys):
    assert bench_plan_method.main(["--report", "--out", str(tmp_path)]) == 0
    assert "| case | full: wall s" in capsys.readouterr().out


def test_twice_forces_the_second_compile_through_trainer_plan(monkeypatch):
    monkeypatch.setattr(plan_lib, "compile_only", plan_lib.compile_only)  # restored after the test
    assert "compile_only(devices)" in inspect.getsource(plan_lib.build_program)  # what the dump hangs on
    bench_plan_method.force_second_compile()
    assert plan_lib.compile_only([object()]) is False
