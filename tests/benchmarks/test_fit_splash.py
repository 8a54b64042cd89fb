"""benchmarks/fit_splash.py: the splash kernels' rates inside the chip's profiled steps are the v5e entry's
(trainer/hardware.py V5E_SPLASH_STEP_GRID), and priced from the other runs' steps they come closer to a left-out
step than the kernels measured alone."""
import json

import pytest

from paxsearch.trainer import hardware


@pytest.mark.slow  # parses 44 chip steps; CI runs it
def test_the_in_step_table_is_what_fit_splash_finds_and_prices_left_out_steps_closer(tmp_path):
    from paxsearch.benchmarks import fit_splash

    out = tmp_path / "fit.json"
    assert fit_splash.main(["--json", str(out)]) == 0
    found = json.loads(out.read_text())
    table = {(r.kernel, r.block, r.head_dim, r.group, r.seq, r.kv_rows): r.share.value
             for r in hardware.V5E_SPLASH_STEP_GRID}
    fitted = {tuple(row[:-1]): row[-1] for row in found["table"]}
    assert set(fitted) == set(table)
    for key, share in fitted.items():
        assert share == pytest.approx(table[key], abs=0.0006), key
    inside = "in-step table inside its shapes, else alone x factor"
    for left_out in ("left_out", "left_out_step"):  # each run (run 8: shapes no other ran), each step from the rest
        mean = {label: sum(map(abs, errors.values())) / len(errors) for label, errors in found[left_out].items()}
        worst = {label: max(map(abs, errors.values())) for label, errors in found[left_out].items()}
        assert len(found[left_out][inside]) == 41, left_out
        assert mean[inside] < mean["alone"] and mean[inside] < mean["alone x in-step factor by kind"], left_out
        assert worst[inside] < worst["alone"] and worst[inside] <= worst["in-step table"], left_out
    # a step among the shapes the others measured: the table inside them 1.38% of the step on average, alone 1.79%
    assert mean[inside] < 0.85 * mean["alone"]


def test_a_kernel_the_steps_ran_is_read_with_the_grids_key():
    """read_kernels keys each kernel as cost.splash_grid_key does (seq, block, head dim, group, batch x K/V heads)."""
    import os

    from paxsearch.benchmarks import fit_splash

    folder = os.path.join(fit_splash.DATA, "chip_steps_v5e_run7")
    kernels, steps = fit_splash.read_kernels(folder)
    mine = [k for k in kernels if k.step == "m100-s2k-fl-b2-full"]
    assert {k.kernel for k in mine} == set(fit_splash.KERNELS)
    assert {k.key for k in mine} == {(2048, 512, 64, 3, 8)}  # batch 2 x 4 K/V heads; 12 query heads of 64
    assert all(k.flops > 0 and 0 < k.seconds < 0.01 and k.executions == 12 for k in mine)
    assert 0.04 < steps["chip_steps_v5e_run7/m100-s2k-fl-b2-full"] < 0.06


def test_one_folder_of_steps_gives_the_table_and_says_the_left_out_check_was_not_run(tmp_path, capsys):
    import os

    from paxsearch.benchmarks import fit_splash

    out = tmp_path / "fit.json"
    assert fit_splash.main(["--steps", os.path.join(fit_splash.DATA, "chip_steps_v5e_run7"), "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["table"] and found["left_out"] == {}
    assert "not run" in capsys.readouterr().out
    assert fit_splash.main(["--steps", str(tmp_path)]) == 2  # no steps there: one line, non-zero
