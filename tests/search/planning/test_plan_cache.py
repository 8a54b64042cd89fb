"""The persistent plan cache without compiling (search/planning/plan_cache.py): what its key
covers, records written atomically and read back as data, and what it does with an entry it
cannot use. Studies that fill and read it: test_plan_cache_study.py."""
import dataclasses
import json
import os

import pytest

from paxsearch.search.planning import plan_cache as C
from paxsearch.search.planning import screen
from paxsearch.search.planning import targets as T
from paxsearch.search.planning.keys import plan_key
from paxsearch.search.study.settings import SettingsError, StudySettings
from paxsearch.store import Kind, compiler
from paxsearch.store.plan import Plan
from paxsearch.trainer import flagsets, remat
from paxsearch.trainer.config import MeshConfig, ModelConfig, OptimizerConfig, TrainConfig

from ...search_util import needs_libtpu

TARGET = T.parse_target("tpu:v5e-16")
SMALL = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=16, head_dim=16, d_ff=1024, seq_len=256,
                    dtype="bfloat16", param_dtype="float32")
BASE = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 16, 1)), per_device_batch=1, remat="none")


def _key(cfg=BASE, environ=None):
    return C.cache_key(cfg, TARGET, {} if environ is None else environ)


# ----------------------------------------------------------------------------- the key

def test_steps_learning_rate_and_seed_share_a_key():
    other = dataclasses.replace(BASE, steps=7, seed=5, optimizer=OptimizerConfig(peak_lr=0.02, warmup_steps=3))
    assert _key(other) == _key(BASE)
    assert C.key_fields(BASE, TARGET, {})["plan_key"] == plan_key(BASE, TARGET)


def test_what_changes_the_compiled_step_changes_the_key():
    variants = [dataclasses.replace(BASE, mesh=MeshConfig(ici=(1, 16, 1), rules="sequence_parallel")),
                dataclasses.replace(BASE, model=dataclasses.replace(SMALL, attention="dot_product")),
                dataclasses.replace(BASE, model=dataclasses.replace(SMALL, dtype="float32")),
                dataclasses.replace(BASE, model=dataclasses.replace(SMALL, vocab_tiles=2)),
                dataclasses.replace(BASE, remat=remat.custom(decoder_input="offload")),
                dataclasses.replace(BASE, mesh=MeshConfig(ici=(1, 1, 4, 4, 1))),  # context 4
                dataclasses.replace(BASE, flags="latency_hiding"),
                dataclasses.replace(BASE, per_device_batch=2)]
    keys = {_key(c) for c in [BASE, *variants]}
    assert len(keys) == len(variants) + 1
    # the sharding rules were missing from the plan key: two rules tables compiled as one step
    assert plan_key(variants[0], TARGET) != plan_key(BASE, TARGET)


def test_the_compiler_flags_and_versions_are_in_the_key_the_cpu_device_count_is_not(monkeypatch):
    assert _key(environ={"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}) == _key()
    assert _key(environ={"LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=false"}) != _key()
    assert _key(environ={"XLA_FLAGS": "--xla_backend_optimization_level=0"}) != _key()
    # a flag set's contents, not only its name: the same name with other flags is another key
    cfg = dataclasses.replace(BASE, flags="latency_hiding")
    before = _key(cfg)
    s = flagsets.FLAG_SETS["latency_hiding"]
    monkeypatch.setitem(flagsets.FLAG_SETS, "latency_hiding",
                        dataclasses.replace(s, libtpu_init_args=(*s.libtpu_init_args, "--xla_tpu_x=1")))
    assert _key(cfg) != before
    import jax

    assert C.key_fields(BASE, TARGET, {})["versions"]["jax"] == jax.__version__
    installed = _key()
    monkeypatch.setattr(C, "_version", lambda package: "0.0.0-other")  # another jax / jaxlib / libtpu
    assert _key() != installed


def test_the_worker_environment_keys_as_the_driver_does():
    """The driver keys with its own environment; the worker with the one pool.py starts it
    in (device count dropped, the flag set merged in): the same key."""
    driver = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0",
              "LIBTPU_INIT_ARGS": "--xla_tpu_foo=1"}
    cfg = dataclasses.replace(BASE, flags="latency_hiding")
    worker = {"XLA_FLAGS": flagsets.with_device_count(driver["XLA_FLAGS"], None),
              "LIBTPU_INIT_ARGS": driver["LIBTPU_INIT_ARGS"]}
    worker.update(flagsets.env_for("latency_hiding", "tpu", worker))
    assert C.cache_key(cfg, TARGET, worker) == C.cache_key(cfg, TARGET, driver)
    # a driver that runs simulated CPU devices (their count and collective timeout in its flags)
    simulated = {**driver, "XLA_FLAGS": flagsets.with_device_count(driver["XLA_FLAGS"], 8)}
    assert C.cache_key(cfg, TARGET, simulated) == C.cache_key(cfg, TARGET, worker)


# ----------------------------------------------------------------------------- records

def _record(key, peak=16_858_112, kind="plan"):
    plan = {"peak_bytes": peak, "hbm_bytes": TARGET.hbm_bytes_per_device, "fits": True, "predicted": True,
            "predicted_mfu": 0.05, "target": TARGET.name, "plan_method": "compiled"}
    env = {"jax": "9.9", "device_kind": "cpu", "platform": "cpu"}
    return C.make_record(key, kind, Plan.from_stored(plan), "", env)


def test_a_record_round_trips_as_plain_json_written_atomically(tmp_path):
    key = _key()
    C.store(tmp_path, key, _record(key))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.json"]  # no temporary file left
    on_disk = json.loads((tmp_path / f"{key}.json").read_text())
    assert on_disk == C.load(tmp_path, key)
    assert on_disk["format"] == C.FORMAT and "plan_method" not in on_disk["plan"]
    assert C.load(tmp_path, _key(dataclasses.replace(BASE, per_device_batch=2))) is None  # not there: silent


@pytest.mark.parametrize("text, why", [
    ("{not json", "not valid JSON"),
    ('["a list"]', "not a JSON object"),
    ("FOREIGN_FORMAT", "format 999"),
    ("OTHER_KEY", "another key"),
    ("BAD_PEAK", "not a byte count"),
    ("BAD_KIND", "unknown kind"),
])
def test_an_entry_that_cannot_be_used_is_ignored_with_one_warning(tmp_path, capsys, text, why):
    key = _key()
    good = _record(key)
    text = {"FOREIGN_FORMAT": json.dumps({**good, "format": 999}),
            "OTHER_KEY": json.dumps({**good, "key": "0" * 32}),
            "BAD_PEAK": json.dumps({**good, "plan": {**good["plan"], "peak_bytes": "/etc/passwd"}}),
            "BAD_KIND": json.dumps({**good, "kind": "callable"})}.get(text, text)
    (tmp_path / f"{key}.json").write_text(text)
    assert C.load(tmp_path, key) is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and f"{key}.json" in lines[0] and "compiling the plan again" in lines[0]


def test_an_unwritable_cache_is_a_warning_not_a_failure(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    C.store(blocker / "plans", _key(), _record(_key()))  # a folder under a file
    err = capsys.readouterr().err
    assert "not written" in err and len(err.strip().splitlines()) == 1


def test_the_folder_follows_the_environment_and_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("PAXSEARCH_CACHE", str(tmp_path / "root"))
    assert C.folder({}) == tmp_path / "root" / "plans"
    assert C.folder({"PAXSEARCH_PLAN_CACHE": "on"}) == tmp_path / "root" / "plans"
    assert C.folder({"PAXSEARCH_PLAN_CACHE": "off"}) is None
    assert C.folder({"PAXSEARCH_PLAN_CACHE": str(tmp_path / "elsewhere")}) == tmp_path / "elsewhere"
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", "off")
    C.use("on")  # the default keeps what the environment says
    assert os.environ["PAXSEARCH_PLAN_CACHE"] == "off"
    C.use(str(tmp_path / "d"))
    assert C.folder() == tmp_path / "d"


def test_the_setting_is_on_off_or_a_folder(tmp_path):
    assert StudySettings().plan_cache == "on"
    assert StudySettings().replace(plan_cache="OFF").plan_cache == "off"
    assert StudySettings().replace(plan_cache="rel/plans").plan_cache == os.path.abspath("rel/plans")
    for bad in ("", 3, True):
        with pytest.raises(SettingsError, match="plan_cache"):
            StudySettings().replace(plan_cache=bad)


# ----------------------------------------------------------------------------- the driver reads it

def test_a_cached_plan_is_held_against_this_studys_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", str(tmp_path))
    key = C.cache_key(BASE, TARGET)
    C.store(tmp_path, key, _record(key, peak=300 * 2**20))
    fits = screen.from_cache(BASE, TARGET, None)
    assert fits.kind is Kind.OK and fits.predicted
    assert fits.plan.plan_method == "cache" and fits.plan.screen == "plan cache"
    assert fits.plan.peak_bytes == 300 * 2**20 and fits.plan.predicted_mfu == 0.05
    # the environment it was compiled in, with the target's devices (as a worker's would be)
    assert fits.env["jax"] == "9.9" and fits.env["device_kind"] == "TPU v5 lite" and fits.env["num_devices"] == 16
    over = screen.from_cache(BASE, TARGET, 256 * 2**20)
    assert over.kind is Kind.PREDICTED_OOM and "compiled peak" in over.message and "memory budget" in over.message
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", "off")
    assert screen.from_cache(BASE, TARGET, None) is None


def test_the_screen_takes_the_study_before_the_cache(tmp_path, monkeypatch):
    """A finished trial of the study with the same plan key answers first (plan_method
    "study"); the cache answers when none does."""
    import optuna

    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", str(tmp_path))
    key = C.cache_key(BASE, TARGET)
    C.store(tmp_path, key, _record(key))
    keys = screen.keys_attrs(BASE, TARGET)
    assert screen.screen(BASE, TARGET, keys, [], None).plan.plan_method == "cache"
    study = optuna.create_study()
    trial = study.ask()
    for name, value in {**keys, "plan": {"peak_bytes": 1, "plan_method": "compiled"}}.items():
        trial.set_user_attr(name, value)
    study.tell(trial, 0.0)
    settled = screen.screen(BASE, TARGET, keys, study.get_trials(), None)
    assert settled.plan.plan_method == "study" and settled.plan.screen == "duplicate of trial 0"


@needs_libtpu
def test_a_step_the_compiler_refuses_is_cached_with_its_message(tmp_path, monkeypatch):
    """The TPU compiler's own refusal (RESOURCE_EXHAUSTED, a few seconds) is a record too:
    read back, it is the same predicted_oom, with the bytes the compiler named."""
    from paxsearch.search.trial.execute import plan_outcome

    model_8b = ModelConfig(vocab_size=131072, d_model=4096, n_layers=32, n_heads=32, head_dim=128, d_ff=16384,
                           seq_len=2048, dtype="bfloat16", param_dtype="float32")
    c = dataclasses.replace(BASE, model=model_8b)
    compiled = plan_outcome(c, TARGET, cache=tmp_path)
    assert compiled.kind is Kind.PREDICTED_OOM and compiled.plan.plan_method == "hlo_passes"
    assert compiled.plan.compiler == compiler.made_here()  # the compiler that refused it
    record = C.load(tmp_path, C.cache_key(c, TARGET))
    assert record["kind"] == "refused" and record["message"] == compiled.message
    assert record["env"]["jax"] and record["env"]["libtpu"]
    monkeypatch.setenv("PAXSEARCH_PLAN_CACHE", str(tmp_path))
    cached = screen.from_cache(c, TARGET, None)
    assert cached.kind is Kind.PREDICTED_OOM and cached.message == compiled.message
    assert cached.plan.peak_bytes == compiled.plan.peak_bytes > TARGET.hbm_bytes_per_device
    assert cached.plan.plan_method == "cache"
    assert cached.plan.compiler == compiled.plan.compiler
