"""`run --dry-run` on a sampled space states how many points the static checks remove: an
estimate from the sample with its 95% interval, in points (issue 19 §6)."""
from __future__ import annotations

import re

from paxsearch.search.driver import dryrun
from paxsearch.search.driver.context import check_settings
from paxsearch.search.study.space import load_space


def test_sampled_dry_run_states_the_points_removed_with_an_interval(make_space):
    # mesh 3x1x1 cannot fill the 8 devices of cpu:8: half the 40 points are invalid
    space = load_space(make_space("half_bad", decisions=dict(mesh=["8x1x1", "3x1x1"], seed=list(range(20)))))
    lines: list[str] = []
    dryrun.dry_run(space, space.settings, check_settings(space.settings, space), emit=lines.append, check_all=10,
                   sample=24)
    checked = [line for line in lines if line.startswith(("  ok", "  invalid"))]
    bad = sum(line.startswith("  invalid") for line in checked)
    assert len(checked) == 24 and 0 < bad < 24
    assert all(("mesh=3x1x1" in line) == line.startswith("  invalid") for line in checked)
    m = re.search(r"the static checks remove about ([\d,]+) of them \(([\d,]+)-([\d,]+)\)", lines[-1])
    assert m, lines[-1]
    about, low, high = (int(x.replace(",", "")) for x in m.groups())
    assert about == round(40 * bad / 24)
    assert low <= 20 <= high and low <= about <= high  # the true count (20) inside the interval
