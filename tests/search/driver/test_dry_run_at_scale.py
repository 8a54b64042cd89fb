"""`run --dry-run` at any size (issue 22, defect 7): the size is counted exactly without building
a config, the static checks run on a uniform sample with its coverage stated, and lines stream
out as points are checked. A 10^6-point space answers in seconds."""
from __future__ import annotations

import time

from paxsearch.search.driver import dryrun
from paxsearch.search.driver.context import check_settings
from paxsearch.search.study.space import load_space

MILLION = dict(seed=list(range(10)), steps=list(range(2, 12)), warmup_steps_for_timing=list(range(10)),
               per_device_batch=list(range(1, 11)), lr=[1e-3 * i for i in range(1, 11)],
               log_every=list(range(1, 11)))


def test_a_million_point_space_answers_in_seconds_with_stated_coverage(make_space):
    space = load_space(make_space("million", decisions=MILLION))
    target = check_settings(space.settings, space)
    built = 0
    config = space.config

    def counting(decisions):
        nonlocal built
        built += 1
        return config(decisions)

    space.config = counting
    lines, stamps = [], []
    t0 = time.perf_counter()

    def emit(line: str) -> None:
        lines.append(line)
        stamps.append(time.perf_counter())

    dryrun.dry_run(space, space.settings, target, emit=emit)
    took = time.perf_counter() - t0
    text = "\n".join(lines)
    assert "size: 1000000 point(s)" in text
    assert "of 100 of 1,000,000 points (0.01% coverage), drawn uniformly at random (seed 0)" in text
    checked = [line for line in lines if line.startswith(("  ok", "  invalid"))]
    assert len(checked) == 100 and len(set(checked)) == 100  # distinct points
    assert built <= 101  # the sample, never the space
    assert "100 sampled point(s)" in lines[-1] and "% of the 1,000,000 points pass (95% interval)" in lines[-1]
    assert stamps[1] - t0 < 5  # the size and settings come out before any point is checked
    assert took < 120, took  # ~0.05-0.1 s a point on a loaded 2-core machine


def test_a_constraint_is_counted_exactly_and_sampled_points_honour_it(tmp_path):
    path = tmp_path / "c.py"
    path.write_text("from paxsearch.tests.space_factory import tiny_space\n"
                    "STUDY, space = tiny_space(decisions=dict(seed=list(range(30)), steps=list(range(2, 32))))\n"
                    "def constraint(d):\n    return d['seed'] < d['steps']\n")
    space = load_space(str(path))
    assert space.size() == sum(1 for s in range(30) for t in range(2, 32) if s < t)
    assert space.point_at(31) == {"seed": 1, "steps": 3}
    lines: list[str] = []
    dryrun.dry_run(space, space.settings, check_settings(space.settings, space), emit=lines.append, check_all=10,
                   sample=20)
    checked = [line for line in lines if line.startswith(("  ok", "  invalid"))]
    assert len(checked) == 20
    for line in checked:
        seed, steps = (int(part.split("=")[1]) for part in line.split()[1:3])
        assert seed < steps
