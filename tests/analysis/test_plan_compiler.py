"""The compiler of a study's plans in `paxsearch report` (Markdown, HTML, CSV), `best` and
`export`: one line, one column; a study whose plans came from several libtpu versions says so;
a study stored before plans named their compiler reads as "unknown"."""
from __future__ import annotations

import pandas as pd
import pytest

from paxsearch.analysis import load, write_report
from paxsearch.search import cli

from .study_builder import SPACE, make_run, trial_spec

NEW = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.52"}
CHIP = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
OBJECTIVES = [{"name": "mfu", "direction": "maximize"}, {"name": "memory", "direction": "minimize"}]
MIXED = ("planned with mixed compilers: jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52 (3 plans); "
         "jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.42.1 (1 plan); 1 analytic plan compiled nothing")


def specs(compilers) -> list[dict]:
    """Plan-only trials whose plans name `compilers` (... for a plan that names none)."""
    out = []
    for number, named in enumerate(compilers):
        decisions = {"mesh": SPACE["mesh"][number % 4], "per_device_batch": 1, "remat": "full",
                     "model_size": "tiny"}
        spec = trial_spec(number, decisions, values=(0.0, 0.0, 0.0), predicted=True)
        spec["values"] = [0.1 + 0.05 * number, (number + 1) * 2.0 ** 30]
        spec["attrs"]["memory_bytes"] = spec["values"][1]
        if named is not ...:
            spec["attrs"]["plan"] = {**spec["attrs"]["plan"], "compiler": named}
        out.append(spec)
    return out


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("mixed") / "run", specs([NEW, NEW, CHIP, None, NEW]),
                    objectives=OBJECTIVES, plan_only=True)


def test_the_report_says_the_study_mixes_compilers(mixed_run):
    paths = write_report(mixed_run)
    assert f"- **compiler**: {MIXED}" in paths["markdown"].read_text()
    html = paths["html"].read_text()
    assert f"<dt>compiler</dt><dd>{MIXED}</dd>" in html
    assert "<th>planned with</th>" in html  # the trial table's column: which trial had which
    csv = pd.read_csv(paths["csv"])
    assert list(csv["planned_with"]) == ["jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"] * 2 + [
        "jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.42.1", "analytic (nothing compiled)",
        "jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52"]
    assert "plan.compiler" not in csv  # one column


def test_best_names_the_trials_compiler_and_the_studys_mix(mixed_run, capsys):
    assert cli.main(["best", str(mixed_run), "--objective", "mfu"]) == 0
    out = capsys.readouterr().out
    assert f"  compiler:  planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52; the study was {MIXED}\n" in out
    assert cli.main(["best", str(mixed_run), "--objective", "memory"]) == 0
    assert "  compiler:  planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52; the study" in capsys.readouterr().out


def test_one_compiler_is_one_line_and_an_old_study_reads_unknown(tmp_path, capsys):
    one = make_run(tmp_path / "one", specs([NEW, NEW]), objectives=OBJECTIVES, plan_only=True)
    paths = write_report(one)
    assert "- **compiler**: planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52\n" in paths["markdown"].read_text()
    assert "<th>planned with</th>" not in paths["html"].read_text()  # no column: one compiler
    assert cli.main(["best", str(one)]) == 0
    assert "  compiler:  planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.52\n" in capsys.readouterr().out
    old = make_run(tmp_path / "old", specs([..., ...]), objectives=OBJECTIVES, plan_only=True)
    assert cli.main(["best", str(old)]) == 0
    assert "  compiler:  planned with an unknown compiler (stored before plans named theirs)" in \
        capsys.readouterr().out
    assert set(load.load_trials(old)["planned_with"]) == {"unknown"}
    assert load.study_info(old)["planned_with"] == ("planned with an unknown compiler (stored before plans "
                                                    "named theirs)")
