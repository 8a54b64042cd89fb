"""Every way the driver settles a plan names its compiler (store/compiler.py) without compiling:
the analytic pre-screen (None: nothing compiled), the plan cache (the record's, or this machine's
for a record written before plans named theirs: the key holds the versions), a duplicate and a
dominated point (the earlier trial's, absent when that plan names none). Compiled plans:
test_tpu_targets.py and test_plan_cache.py."""
import dataclasses

import optuna

from paxsearch.search.planning import plan_cache as C
from paxsearch.search.planning import screen
from paxsearch.search.planning import targets as T
from paxsearch.store import Kind, compiler
from paxsearch.store.plan import Plan
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig

optuna.logging.set_verbosity(optuna.logging.WARNING)

TARGET = T.parse_target("tpu:v5e-16")
SMALL = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=16, head_dim=16, d_ff=1024, seq_len=256,
                    dtype="bfloat16", param_dtype="float32")
BASE = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 16, 1)), per_device_batch=1, remat="none")
HUGE = dataclasses.replace(BASE, model=dataclasses.replace(SMALL, d_model=8192, d_ff=32768, n_layers=64),
                           mesh=MeshConfig(ici=(16, 1, 1)))
CHIP = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}


def _study_with(keys: dict, plan: dict, failure: bool = False):
    study = optuna.create_study()
    trial = study.ask()
    for name, value in {**keys, "plan": plan, "memory_bytes": plan["peak_bytes"]}.items():
        trial.set_user_attr(name, value)
    if failure:
        trial.set_user_attr("failure_kind", "predicted_oom")
    study.tell(trial, 0.0)
    return study.get_trials()


def test_the_analytic_prescreen_compiles_nothing_and_says_so(monkeypatch):
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", "off")
    settled = screen.screen(HUGE, TARGET, screen.keys_attrs(HUGE, TARGET), [], None)
    assert settled.kind is Kind.PREDICTED_OOM and settled.plan.plan_method == "analytic"
    assert settled.plan.has(compiler.KEY) and compiler.of_plan(settled.plan) is compiler.NOT_COMPILED


def test_a_cached_plan_names_the_compiler_that_made_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", str(tmp_path))
    key = C.cache_key(BASE, TARGET)
    plan = {"peak_bytes": 2**20, "hbm_bytes": TARGET.hbm_bytes_per_device, "plan_method": "compiled"}
    # written before plans named it
    C.store(tmp_path, key, C.make_record(key, "plan", Plan.from_stored(plan), "", {"jax": "0.10.2"}))
    assert screen.from_cache(BASE, TARGET, None).plan.compiler == compiler.made_here()
    named = Plan.from_stored({**plan, compiler.KEY: CHIP})
    C.store(tmp_path, key, C.make_record(key, "plan", named, "", {"jax": "0.10.2"}))
    assert screen.from_cache(BASE, TARGET, None).plan.compiler == CHIP


def test_a_duplicate_or_dominated_point_names_the_earlier_trials_compiler(monkeypatch):
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", "off")
    keys = screen.keys_attrs(BASE, TARGET)
    named = {"peak_bytes": 1, "plan_method": "compiled", compiler.KEY: CHIP}
    assert screen.screen(BASE, TARGET, keys, _study_with(keys, named), None).plan.compiler == CHIP
    old = {"peak_bytes": 1, "plan_method": "compiled"}  # stored before plans named their compiler
    duplicate = screen.screen(BASE, TARGET, keys, _study_with(keys, old), None).plan
    assert compiler.of_plan(duplicate) == compiler.UNKNOWN
    smaller = {**keys, "plan_key": "another", "global_batch": keys["global_batch"] - 1}
    big = {"peak_bytes": 2**40, "plan_method": "compiled", compiler.KEY: CHIP}
    dominated = screen.screen(BASE, TARGET, keys, _study_with(smaller, big, failure=True), None).plan.to_stored()
    assert dominated["screen"] == "dominated by trial 0" and dominated[compiler.KEY] == CHIP
