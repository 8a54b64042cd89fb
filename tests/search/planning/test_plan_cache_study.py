"""Plan-only studies sharing the persistent plan cache (search/planning/plan_cache.py), with
real compiles for tpu:v5e-16: a second study in another run folder whose point differs only in
steps, learning rate and seed compiles nothing; a corrupted entry is compiled again with one
warning; `--plan-cache off` compiles again. Needs libtpu (the `tpu` extra, which CI installs)."""
import json
import os

import pytest

from ...search_util import HERE, cli, load, needs_libtpu

PLAN_SPACE = os.path.join(HERE, "spaces", "tpu_tiny_plan.py")
SMALL_1 = ["--set", "model_size=small", "--set", "per_device_batch=1"]  # fits; ~25 s to compile on 2 cores
SAME_FIGURES = ("peak_bytes", "argument_bytes", "temp_bytes", "xla_flops_per_step", "model_flops_per_step",
                "param_count", "global_batch", "ici_mesh")


def _run(run_dir, *args, env=None):
    out = cli("run", PLAN_SPACE, "--run-dir", run_dir, "--no-progress", "--workers", 1, *SMALL_1, *args, env=env)
    return out, load(run_dir, "tpu_tiny_plan").get_trials()


def _compiled_here(trial) -> bool:
    """The trial's plan was compiled in a worker of its study (not settled by the driver)."""
    return "compile_s" in trial.user_attrs["timings"] and os.path.exists(
        os.path.join(trial.user_attrs["trial_dir"], "log.txt"))


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """One study of the two learning rates of one point: one compile, stored in its own cache."""
    base = tmp_path_factory.mktemp("plan_cache")
    cache = base / "plans"
    _, trials = _run(base / "first", "--plan-cache", cache)
    return base, cache, trials


@pytest.mark.slow  # one compile for v5e-16 in the fixture, then a study that compiles nothing
@needs_libtpu
def test_a_second_study_differing_in_steps_lr_and_seed_compiles_nothing(first):
    base, cache, trials = first
    methods = sorted(t.user_attrs["plan"]["plan_method"] for t in trials)
    assert methods == ["hlo_passes", "study"]  # the second learning rate reused the first's plan in-study
    compiled = next(t for t in trials if t.user_attrs["plan"]["plan_method"] == "hlo_passes")
    assert _compiled_here(compiled)
    assert [p.suffix for p in cache.iterdir()] == [".json"]  # one compiled step, one entry

    # another run folder, another learning rate, steps and seed; the cache found through the
    # environment (the setting's default "on" keeps PAXSEARCH_PLAN_CACHE)
    other_lr = "0.001" if compiled.params["peak_lr"] != 0.001 else "0.003"
    out, again = _run(base / "second", "--set", f"peak_lr={other_lr}", "--set", "steps=7", "--set", "seed=5",
                      env={"PAXSEARCH_PLAN_CACHE": str(cache)})
    assert len(again) == 1
    t = again[0]
    assert t.user_attrs["config_dict"]["steps"] == 7 and t.user_attrs["config_dict"]["seed"] == 5
    plan = t.user_attrs["plan"]
    assert plan["plan_method"] == "cache" and plan["screen"] == "plan cache" and not _compiled_here(t)
    assert "warning" not in out.stderr
    # the same figures as the compile, predictions included, and the target's environment
    first_plan = compiled.user_attrs["plan"]
    assert {k: plan[k] for k in SAME_FIGURES} == {k: first_plan[k] for k in SAME_FIGURES}
    assert plan["predicted_step_time"] == first_plan["predicted_step_time"] > 0
    assert plan["roofline"] == first_plan["roofline"]
    assert t.values == compiled.values and t.user_attrs["memory_bytes"] == compiled.user_attrs["memory_bytes"]
    assert t.user_attrs["env"]["device_kind"] == "TPU v5 lite"
    assert t.user_attrs["env"]["jax"] == compiled.user_attrs["env"]["jax"]
    assert "PREDICTED (plan cache)" in out.stdout


@pytest.mark.slow  # compiles once
@needs_libtpu
def test_a_corrupted_entry_is_compiled_again_with_one_warning(first):
    base, cache, trials = first
    broken = base / "broken"
    broken.mkdir()
    entry = next(cache.iterdir())
    (broken / entry.name).write_text(entry.read_text()[:40])  # cut short: not JSON
    out, again = _run(base / "third", "--set", "peak_lr=0.001", "--plan-cache", broken)
    warnings = [ln for ln in out.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and entry.name in warnings[0] and "compiling the plan again" in warnings[0]
    assert again[0].user_attrs["plan"]["plan_method"] == "hlo_passes" and _compiled_here(again[0])
    rewritten = json.loads((broken / entry.name).read_text())  # stored over the broken one
    assert rewritten["plan"]["peak_bytes"] == json.loads(entry.read_text())["plan"]["peak_bytes"]


@pytest.mark.slow  # compiles once
@needs_libtpu
def test_plan_cache_off_compiles_and_stores_nothing(first):
    base, cache, trials = first
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    out, again = _run(base / "fourth", "--set", "peak_lr=0.001", "--plan-cache", "off",
                      env={"PAXSEARCH_PLAN_CACHE": str(cache)})
    assert again[0].user_attrs["plan"]["plan_method"] == "hlo_passes" and _compiled_here(again[0])
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before
    study = load(base / "fourth", "tpu_tiny_plan")
    assert study.user_attrs["settings"]["plan_cache"] == "off"


@pytest.mark.slow  # compiles once, to the end
@needs_libtpu
def test_plan_compile_full_compiles_to_the_end_under_its_own_entry(first):
    """`--plan-compile full`: the step compiled to the end (plan_method compiled), not served the
    HLO-passes plan of the same step from the cache; the same memory but the measured code."""
    base, cache, trials = first
    before = {p.name for p in cache.iterdir()}
    out, again = _run(base / "fifth", "--set", "peak_lr=0.001", "--plan-cache", cache, "--plan-compile", "full")
    plan = again[0].user_attrs["plan"]
    assert plan["plan_method"] == "compiled" and _compiled_here(again[0]) and "(compiled)" in out.stdout
    assert len({p.name for p in cache.iterdir()} - before) == 1  # its own entry beside the passes' one
    passes = next(t for t in trials if t.user_attrs["plan"]["plan_method"] == "hlo_passes").user_attrs["plan"]
    assert plan["argument_bytes"] == passes["argument_bytes"] and plan["alias_bytes"] == passes["alias_bytes"]
    assert 0 < plan["generated_code_bytes"] < passes["generated_code_bytes"]  # measured, under the bound
    assert plan["peak_bytes"] <= passes["peak_bytes"]
