"""A space offering a compiler flag set on a TPU generation it does not apply to (issue 20 §2):
`run --dry-run` counts those points as removed by the static checks, each with the one line
naming the set, the generation and the sets that apply; no compile."""
from __future__ import annotations

from paxsearch.search.driver import dryrun
from paxsearch.search.driver.context import check_settings
from paxsearch.search.study.space import load_space
from paxsearch.trainer import flagsets


def test_dry_run_removes_the_points_of_a_set_the_generation_does_not_take(make_space):
    v6e_set = next(n for n in flagsets.for_generation("v6e") if n.startswith("v6e_"))
    path = make_space("v6e_flags", study=dict(target="tpu:v6e-8", objectives=["mfu", "memory"]),
                      decisions=dict(flags=["default", "collective_fusion", v6e_set]), mesh="1x8x1")
    space = load_space(path)
    lines: list[str] = []
    dryrun.dry_run(space, space.settings, check_settings(space.settings, space), emit=lines.append)
    checked = {line.split("flags=")[1].split()[0]: line for line in lines if line.startswith(("  ok", "  invalid"))}
    assert set(checked) == {"default", "collective_fusion", v6e_set}
    assert checked["default"].startswith("  ok") and checked[v6e_set].startswith("  ok")
    bad = checked["collective_fusion"]
    assert bad.startswith("  invalid") and "'collective_fusion' does not apply to TPU v6e" in bad
    assert f"sets for v6e: {', '.join(flagsets.for_generation('v6e'))}" in bad
    assert lines[-1] == "3 point(s): 2 pass the static checks, 1 invalid"
