"""write_report on stored studies: files, self-containment, labels, and a headless screenshot."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fiddle.experimental import serialization

from paxsearch.analysis import best_trial, load, pareto, tables, write_report

from .. import pg_util
from .study_builder import SPACE, grid_specs, make_run, trial_spec

CHROMIUM = Path("/usr/bin/chromium")
WIDTH = 1400  # the window width the issue asks the report to fit (issue 21)


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("measured") / "run", grid_specs())


@pytest.fixture(scope="module")
def measured_report(measured_run) -> dict:
    return write_report(measured_run)


def plan_only_specs() -> list[dict]:
    """Compiled-only trials: values are (predicted MFU, predicted memory)."""
    specs = []
    for number, mesh in enumerate(SPACE["mesh"]):
        for batch in SPACE["per_device_batch"]:
            decisions = {"mesh": mesh, "per_device_batch": batch, "remat": "full",
                         "model_size": "tiny"}
            if batch == 4 and mesh == "8x1x1":
                specs.append(trial_spec(len(specs), decisions, failure_kind="predicted_oom"))
                continue
            spec = trial_spec(len(specs), decisions, values=(0.0, 0.0, 0.0), predicted=True)
            mfu, memory = 0.1 + 0.05 * batch + 0.02 * number, batch * 2.0 ** 30
            spec["values"] = [mfu, memory]
            spec["attrs"]["memory_bytes"] = memory
            specs.append(spec)
    return specs


PLAN_ONLY_OBJECTIVES = [{"name": "mfu", "direction": "maximize"},
                        {"name": "memory", "direction": "minimize"}]


def test_report_writes_every_file(measured_run, measured_report):
    for key in ("html", "markdown", "csv", "parquet", "pareto_png"):
        assert measured_report[key].is_file() and measured_report[key].stat().st_size > 0
    assert measured_report["html"] == measured_run / "report.html"
    assert measured_report["pareto_png"] == measured_run / "report" / "pareto.png"
    effects = {k for k in measured_report if k.startswith("effect_png:")}
    assert effects == {f"effect_png:{name}" for name in SPACE}
    for key in effects:
        assert measured_report[key].read_bytes().startswith(b"\x89PNG")


def test_trials_csv_and_parquet_have_one_row_per_trial(measured_report):
    n_trials = len(grid_specs())
    csv = pd.read_csv(measured_report["csv"])
    parquet = pd.read_parquet(measured_report["parquet"])
    assert len(csv) == len(parquet) == n_trials
    assert csv["on_front"].sum() > 0 and csv["is_knee"].sum() == 1
    assert set(csv["state"]) == {"COMPLETE", "FAIL"}


def test_html_is_self_contained(measured_report):
    page = measured_report["html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert re.search(r'<img id="pareto-plot"[^>]*src="data:image/png;base64,', page)
    assert page.count("data:image/png;base64,") == 1 + len(SPACE)


def test_html_and_markdown_state_conventions_and_environment(measured_report):
    for key in ("html", "markdown"):
        text = measured_report[key].read_text()
        for needle in ("MFU convention", "3 x forward", "peak FLOP/s per device", "5e+10",
                       "device kind", "cpu", "jax 0.10.2", "Pareto front",
                       "Failures by kind", "predicted_oom", "compile_error", "invalid"):
            assert needle in text, (key, needle)
        assert "PREDICTED" not in text  # measured study
        # a study stored before plans named their compiler still reads, and says so
        assert "planned with an unknown compiler (stored before plans named theirs)" in text


def test_markdown_lists_front_best_and_failures(measured_run, measured_report):
    text = measured_report["markdown"].read_text()
    frame = load.load_trials(measured_run)
    front = pareto.pareto_front(frame)
    for number in front["number"]:
        assert re.search(rf"^\| {number} \|", text, re.M)
    assert "| best mfu |" in text and "| knee |" in text
    assert "](report/pareto.png)" in text
    n_failed = int((frame["state"] == "FAIL").sum())
    counts = [int(n) for n in re.findall(r"^### \w+ \((\d+)\)", text, re.M)]
    assert sum(counts) == n_failed
    assert "\\|" in text  # the failure messages' pipes are escaped


def test_predicted_vs_measured_side_by_side(measured_report):
    text = measured_report["markdown"].read_text()
    assert "## Predicted vs measured" in text
    assert "predicted step time" in text and "ratio step time" in text


def test_plan_only_study_is_labelled_predicted_everywhere(tmp_path):
    run = make_run(tmp_path / "run", plan_only_specs(), objectives=PLAN_ONLY_OBJECTIVES,
                   plan_only=True)
    paths = write_report(run)
    for key in ("html", "markdown"):
        text = paths[key].read_text()
        assert "PREDICTED" in text or "Predicted figures" in text
        assert "Pareto front (predicted)" in text
        assert "MFU (predicted)" in text and "measured)" not in text
        assert "Predicted vs measured" not in text  # nothing was measured
    assert set(k for k in paths if k.startswith("effect_png:")) == \
        {f"effect_png:{name}" for name in SPACE}
    assert len(pd.read_csv(paths["csv"])) == len(plan_only_specs())


def test_report_from_storage_url_and_out_dir(tmp_path):
    run = make_run(tmp_path / "run", grid_specs()[:8])
    url = f"sqlite:///{run / 'study.db'}"
    paths = write_report(url, out_dir=tmp_path / "elsewhere", study_name="sweep")
    assert paths["html"].parent == tmp_path / "elsewhere"
    assert "sqlite:///" in paths["markdown"].read_text()


def test_best_trial_returns_the_fiddle_config(measured_run):
    frame = load.load_trials(measured_run)
    best = pareto.best_per_objective(frame)
    for objective in ("mfu", "loss", "memory"):
        number, config_json = best_trial(measured_run, objective)
        assert number == best[objective]
        config = serialization.load_json(config_json)
        decisions = frame.set_index("number").loc[number]
        assert config.mesh == decisions["d.mesh"]
        assert config.per_device_batch == decisions["d.per_device_batch"]
    number, _ = best_trial(measured_run, "knee")
    assert number == pareto.knee(frame)
    with pytest.raises(ValueError, match="objective must be one of"):
        best_trial(measured_run, "speed")


def test_best_trial_of_plan_only_knee_uses_its_objectives(tmp_path):
    run = make_run(tmp_path / "run", plan_only_specs(), objectives=PLAN_ONLY_OBJECTIVES,
                   plan_only=True)
    number, _ = best_trial(run, "knee")
    assert number == pareto.knee(load.load_trials(run), ["mfu", "memory"])
    with pytest.raises(LookupError, match="no completed trial"):
        best_trial(run, "loss")


def _distinct_colours(png: Path) -> int:
    from matplotlib import image
    rgb = (image.imread(str(png))[..., :3] * 255).astype(np.uint32).reshape(-1, 3)
    return len(np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]))


needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs /usr/bin/chromium (Debian package 'chromium'; CI installs it)")


def chromium(*arguments: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium with networking off (no DNS, a dead proxy)."""
    command = [str(CHROMIUM), "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}",
               "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
               "--hide-scrollbars", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@needs_chromium
def test_report_renders_offline_in_headless_chromium(measured_report, tmp_path):
    """Open report.html with networking off; the screenshot must show the Pareto plot."""
    shot = tmp_path / "report.png"
    done = chromium(f"--screenshot={shot}", f"--window-size={WIDTH},2000",
                    measured_report["html"].as_uri(), profile=tmp_path / "profile")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    # Text and tables alone give ~200 colours; the embedded plots add thousands.
    assert _distinct_colours(shot) > 500


# Widths in the rendered page: the page's own, the window's, the trial table's and its box's.
WIDTH_PROBE = """<script>
  var table = document.getElementById("trials"), box = table.parentElement;
  document.body.setAttribute("data-widths", [document.documentElement.scrollWidth, window.innerWidth,
      table.scrollWidth, box.clientWidth, Math.ceil(box.getBoundingClientRect().right)].join(","));
</script></body>"""


@needs_chromium
@pytest.mark.parametrize("width", [WIDTH, 700])
def test_report_fits_the_window_and_wide_tables_scroll(measured_report, tmp_path, width):
    """At the issue's 1400 px (and at 700 px, where the trial table is wider than the window)
    nothing runs past the window's edge: the page is no wider than the window, and the trial
    table scrolls inside its box."""
    page = tmp_path / "probe.html"
    page.write_text(measured_report["html"].read_text().replace("</body>", WIDTH_PROBE))
    done = chromium(f"--window-size={width},2000", "--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'data-widths="([\d,]+)"', done.stdout)
    assert found, done.stdout[-500:]
    page_width, window, table, box, right = map(int, found.group(1).split(","))
    assert window == width
    assert page_width <= width and right <= width, found.group(1)
    if width < WIDTH:
        assert table > box  # wider than its box: it scrolls there, the page does not


@needs_chromium
def test_trial_table_sorts_on_click(measured_run, measured_report, tmp_path):
    """The inline script sorts the trial table: two clicks on MFU put the best MFU first."""
    probe = """<script>
      var th = Array.prototype.find.call(document.querySelectorAll("#trials th"),
                                         function (h) { return h.textContent === "MFU"; });
      th.click(); th.click();
      document.body.setAttribute("data-first",
                                 document.querySelector("#trials tbody tr").cells[0].textContent);
    </script></body>"""
    page = tmp_path / "probe.html"
    page.write_text(measured_report["html"].read_text().replace("</body>", probe))
    done = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    first = re.search(r'data-first="(\d+)"', done.stdout)
    assert first, done.stdout[-500:]
    best = pareto.best_per_objective(load.load_trials(measured_run), ["mfu"])["mfu"]
    assert int(first.group(1)) == best


@pytest.mark.postgres
def test_report_of_a_postgres_study_never_shows_the_password(tmp_path, pg_database, pg_url):
    # trust auth: any password is accepted; SQLAlchemy 2.1 maps a bare postgresql:// to
    # psycopg 3, so name the psycopg2 driver
    url = pg_util.url(pg_database, password="hunter2-secret", driver="+psycopg2")
    name = f"analysis_{tmp_path.name}"
    make_run(tmp_path / "run", grid_specs()[:6], study_name=name, storage=url)
    paths = write_report(url, out_dir=tmp_path / "out", study_name=name)  # a URL: the caller names the folder
    assert paths["html"] == tmp_path / "out" / "report.html"
    for path in paths.values():
        assert b"hunter2-secret" not in path.read_bytes(), path
    assert "postgres:***@127.0.0.1" in paths["markdown"].read_text()


def test_predicted_vs_measured_matches_plan_only_trials_by_decisions():
    from paxsearch.analysis import tables
    frame = pd.DataFrame({
        "number": [0, 1, 2], "state": ["COMPLETE"] * 3, "predicted": [True, False, False],
        "d.mesh": ["1x8x1", "1x8x1", "2x4x1"],
        "plan.predicted_step_time": [2.0, np.nan, 4.0],
        "step_time": [np.nan, 3.0, 2.0], "mfu": [0.3, 0.2, 0.4],
    })
    table = tables.predicted_vs_measured(frame).set_index("number")
    assert list(table.index) == [1, 2]  # measured trials only
    assert table.loc[1, "plan.predicted_step_time"] == 2.0  # from plan-only trial 0
    assert table.loc[1, "ratio step_time"] == pytest.approx(1.5)
    assert table.loc[2, "ratio step_time"] == pytest.approx(0.5)  # its own plan figure
    assert tables.predicted_vs_measured(frame[frame["predicted"]]).empty


def test_predicted_corrected_and_measured_mfu_side_by_side(measured_run, measured_report):
    """Every trial with a prediction gets a corrected MFU: the unmeasured ones (failed after
    compiling) from the model fit on the measured ones, each measured one from the model fit
    on the others (leave-one-out)."""
    import math

    from paxsearch.analysis.corrected import _plan, corrected_table
    from paxsearch.store import correction

    text = measured_report["markdown"].read_text()
    section = text.split("## Predicted, corrected and measured MFU\n", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in section.splitlines() if line.startswith("| trial"))
    assert "| predicted MFU | corrected MFU | corrected, low | corrected, high | MFU |" in header
    assert "leave-one-out" in section and "log_step_time" in section  # what the model is, in words
    assert 'id="corrected"' in measured_report["html"].read_text()

    frame = load.load_trials(measured_run)
    table, note = corrected_table(frame)
    table = table.set_index("number")
    assert table["corrected_mfu"].notna().all()  # every trial with a prediction
    assert (table["corrected_mfu_low"] < table["corrected_mfu"]).all()  # inside its 90% interval
    assert (table["corrected_mfu"] < table["corrected_mfu_high"]).all()
    unmeasured = table[table["mfu"].isna()]
    assert len(unmeasured) and set(unmeasured["outcome"]) <= {"predicted_oom", "compile_error", "runtime_oom"}
    measured = frame[frame["number"].isin(table.index[table["mfu"].notna()])].sort_values("number")
    plans = [_plan(row) for _, row in measured.iterrows()]
    logs = [math.log(m / p) for m, p in zip(measured["mfu"], measured["plan.predicted_mfu"], strict=True)]
    first = int(measured["number"].iloc[0])
    held_out = correction.fit(plans[1:], logs[1:]).predict(plans[0])[0]
    assert table.loc[first, "corrected_mfu"] == pytest.approx(0.3 * math.exp(held_out))
    assert held_out != pytest.approx(correction.fit(plans, logs).predict(plans[0])[0])  # not its own fit
    last = int(unmeasured.index[-1])
    row = frame.set_index("number").loc[last]
    assert table.loc[last, "corrected_mfu"] == pytest.approx(
        correction.fit(plans, logs).corrected(_plan(row), 0.3))
    low, high = correction.fit(plans, logs).interval(_plan(row), 0.3, 0.9)
    assert (table.loc[last, "corrected_mfu_low"], table.loc[last, "corrected_mfu_high"]) == pytest.approx((low, high))
    assert "Mean |figure / measured - 1|" in note and "measured inside the interval" in note


def _roofline(on_chip: float, exposed: dict[tuple[str, str, tuple], float]) -> dict:
    """A stored roofline (search/planning/roofline/model.py Roofline.to_dict's keys the report reads)."""
    collectives = [{"kind": kind, "axes": list(axes), "link": link, "count": 1, "executions": 1.0, "bytes": 1.0,
                    "seconds": seconds, "exposed_seconds": seconds} for (kind, link, axes), seconds in exposed.items()]
    return {"predicted": True, "roofline_s": on_chip, "exposed_comm_s": sum(exposed.values()),
            "step_time_s": on_chip + sum(exposed.values()), "collectives": collectives}


def test_step_parts_split_the_exposed_time_by_link():
    roof = _roofline(8.0, {("all-gather", "ici", ("fsdp",)): 0.5, ("all-reduce", "ici", ("fsdp",)): 0.25,
                           ("all-reduce", "dcn", ("data",)): 0.75, ("host-d2h", "host", ()): 0.125,
                           ("collective-permute", "ici", ("tensor",)): 0.0})
    parts = tables.step_parts(json.dumps(roof))
    assert parts == {"step.on_chip_s": 8.0, "step.exposed_ici_s": 0.75, "step.exposed_dcn_s": 0.75,
                     "step.exposed_host_s": 0.125, "step.largest_exposed": "all-reduce over data (dcn), 0.75 s"}
    # no roofline (an analytic plan, one that failed to parse): no parts, no made-up figures
    assert tables.step_parts(None) is None
    assert tables.step_parts(json.dumps({"predicted": True, "error": "roofline failed: ValueError"})) is None
    assert tables.step_parts(json.dumps(_roofline(2.0, {})))["step.largest_exposed"] == "none"
    # a stored value that is not a figure (a damaged row) leaves the trial out, not the report
    assert tables.step_parts("{not json") is None
    assert tables.step_parts(json.dumps({**roof, "collectives": [{"link": "ici", "exposed_seconds": "x"}]})) is None


def test_report_shows_where_each_front_trials_predicted_step_goes(tmp_path):
    specs = plan_only_specs()
    for spec in specs:
        plan = spec["attrs"].get("plan")
        if plan is not None and spec["values"] is not None:
            dcn = 0.1 * spec["attrs"]["decisions"]["per_device_batch"]
            plan["roofline"] = _roofline(1.0, {("all-gather", "ici", ("fsdp",)): 0.2,
                                               ("all-reduce", "dcn", ("data",)): dcn})
            plan["predicted_step_time"] = 1.2 + dcn
    run = make_run(tmp_path / "run", specs, objectives=PLAN_ONLY_OBJECTIVES, plan_only=True)
    paths = write_report(run)
    frame = load.trials_frame(load.open_study(run).study)
    on_front = pareto.pareto_mask(frame, ["mfu", "memory"])
    steps = tables.step_breakdown(frame, on_front)
    assert sorted(steps["number"]) == sorted(frame.loc[on_front, "number"]) and len(steps) > 1
    total = steps[["step.on_chip_s", "step.exposed_ici_s", "step.exposed_dcn_s", "step.exposed_host_s"]].sum(axis=1)
    assert np.allclose(total, steps["plan.predicted_step_time"])
    md = paths["markdown"].read_text()
    assert "## Where the predicted step goes" in md
    assert ("| trial | predicted step time | on chip | exposed ICI | exposed DCN | exposed host "
            "| exposed the longest |") in md
    assert "all-reduce over data (dcn), 0.4 s" in md  # a batch-4 front trial: 0.4 s over DCN
    assert 'id="step-parts"' in paths["html"].read_text()


def test_no_roofline_no_step_section(measured_report):
    for key in ("markdown", "html"):
        assert "Where the predicted step goes" not in measured_report[key].read_text()
