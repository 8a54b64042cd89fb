"""Compiler flag sets (issue 9, section 4): a named XLA / LIBTPU flag set reaches the compiler,
is a searchable decision with one worker pool per set, is recorded with each trial, is carried
by exported configs and honoured by `paxsearch train`; unknown sets and flags are one line."""
import json
import os
import re
import subprocess
import sys

import optuna
import pytest

from paxsearch.search.study import configio
from paxsearch.trainer import flagsets
from paxsearch.trainer.errors import ConfigError

from ..search_util import HERE, REPO, TINY, cli, needs_libtpu, refused

PLAN_SPACE = os.path.join(HERE, "spaces", "tpu_tiny_plan.py")

EIGEN = "cpu_eigen_dots"  # the set with an effect on CPU compiles
EIGEN_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
DEVICES8 = "--xla_force_host_platform_device_count=8"

# the trainer's real train step, compiled in a fresh process (flags are read when the backend starts)
COMPILE_STEP = """
import json, re, jax
from paxsearch.search.study import configio
from paxsearch.tests.space_factory import tiny_config
from paxsearch.trainer.plan import build_program
cfg = configio.build(tiny_config(mesh="1x1x1", per_device_batch=2))
hlo = build_program(cfg, jax.devices()[:1], count_flops=False, keep_hlo=True).plan.hlo_text
print(json.dumps({"library_fusions": len(re.findall(r'"kind":"__[a-z]+_fusion"', hlo)),
                  "dots": len(re.findall(r"= \\S+ dot\\(", hlo))}))
"""


# ----------------------------------------------------------------------------- the table

def test_every_set_is_described_and_sourced():
    assert flagsets.names()[0] == "default" and {"latency_hiding", EIGEN} <= set(flagsets.names())
    for name in flagsets.names():
        s = flagsets.FLAG_SETS[name]
        assert s.description and s.source and name in flagsets.describe(name)
        assert set(s.as_dict()) == {"XLA_FLAGS", "LIBTPU_INIT_ARGS"}
        assert all(f.startswith("--xla_") for f in s.xla_flags + s.libtpu_init_args)
    lhs = flagsets.FLAG_SETS["latency_hiding"].libtpu_init_args
    assert "--xla_tpu_enable_latency_hiding_scheduler=true" in lhs and "--xla_enable_async_all_gather=true" in lhs


def test_every_set_states_the_tpu_generations_it_applies_to():
    """The generation table (probed with this libtpu: benchmarks/RESULTS.md): each set names the
    generations it applies to, and the compiler's line for each one it is refused on."""
    from paxsearch.search.planning.topology import CHIPS

    assert set(flagsets.TPU_GENERATIONS) == set(CHIPS)
    for name, s in flagsets.FLAG_SETS.items():
        refused = [g for g, line in s.refusals if line]
        assert s.generations and not set(s.generations) & set(refused), name
        assert sorted(s.generations + tuple(refused)) == sorted(flagsets.TPU_GENERATIONS), name
        assert all(flagsets.applies(name, p) for p in ("cpu", "gpu", None))  # CPU / GPU: every set
        assert flagsets.applies(name, "tpu")  # a TPU of unknown generation: not refused
    fusion = flagsets.FLAG_SETS["collective_fusion"]
    assert fusion.generations == ("v5e",) and "ghostlite" in dict(fusion.refusals)["v6e"]
    v6e = flagsets.for_generation("v6e")
    assert "collective_fusion" not in v6e and [n for n in v6e if n.startswith("v6e_")]
    assert "collective_fusion" in flagsets.for_generation("v5e")
    with pytest.raises(TypeError):  # a set that does not state its generations is not a FlagSet
        flagsets.FlagSet((), (), "d", "s")  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        flagsets.FlagSet((), (), "d", "s", generations=("v7x",))


def test_a_set_on_a_generation_it_does_not_apply_to_is_refused_statically_in_one_line():
    """trainer/validate.py, the one static check (driver, dry run, build_program): no compile."""
    from paxsearch.trainer import validate

    from ..space_factory import tiny_config

    cfg = configio.build(tiny_config(mesh="1x8x1", flags="collective_fusion"))
    validate.check(cfg, 8, "tpu", chip="v5e")
    validate.check(cfg, 8, "cpu")
    with pytest.raises(ConfigError) as e:
        validate.check(cfg, 8, "tpu", chip="v6e")
    text = str(e.value)
    assert "\n" not in text and "'collective_fusion' does not apply to TPU v6e" in text and "ghostlite" in text
    assert f"sets for v6e: {', '.join(flagsets.for_generation('v6e'))} " in text
    assert "it applies to v5e;" in text


def test_env_for_merges_and_keeps_the_device_count():
    base = {"XLA_FLAGS": f"{DEVICES8} {EIGEN_FLAG}x --xla_dump_to=/tmp/d", "LIBTPU_INIT_ARGS": "--xla_keep=1"}
    env = flagsets.env_for(EIGEN, "cpu", base)
    assert env["XLA_FLAGS"].split() == [DEVICES8, "--xla_dump_to=/tmp/d", EIGEN_FLAG]  # the set's value wins
    assert env[flagsets.SET_ENV] == EIGEN and "LIBTPU_INIT_ARGS" not in env  # libtpu is not read on CPU
    assert flagsets.applied(EIGEN, env) and not flagsets.applied(EIGEN, base)
    tpu = flagsets.env_for("latency_hiding", "tpu", base)
    assert tpu["LIBTPU_INIT_ARGS"].split() == ["--xla_keep=1", *flagsets.FLAG_SETS["latency_hiding"].libtpu_init_args]
    assert DEVICES8 in tpu["XLA_FLAGS"].split()
    assert flagsets.applied("latency_hiding", tpu, "tpu") and not flagsets.applied("latency_hiding", base, "tpu")
    assert flagsets.env_for("default", "cpu", base)["XLA_FLAGS"] == base["XLA_FLAGS"]
    assert flagsets.applied("default", {})


def test_sets_compose_with_a_plus():
    """`a+b`: a's flags then b's (a flag both name takes b's value), the generations both take; the
    static check, the env and a worker's set read a composed name as they read a table name."""
    from paxsearch.search.driver.prepare import worker_flags
    from paxsearch.trainer import validate

    from ..space_factory import tiny_config

    name = "v6e_llama3+no_collective_pipeliner"
    s, a, b = flagsets.check(name), flagsets.FLAG_SETS["v6e_llama3"], flagsets.FLAG_SETS["no_collective_pipeliner"]
    assert s.libtpu_init_args == a.libtpu_init_args + b.libtpu_init_args and s.generations == a.generations
    assert flagsets.known(name) and name in flagsets.describe(name)
    env = flagsets.env_for(name, "tpu", {})
    assert env["LIBTPU_INIT_ARGS"].split()[-1] == "--xla_tpu_enable_collective_pipeliner=false"
    assert flagsets.applied(name, env, "tpu") and not flagsets.applied(name, flagsets.env_for("v6e_llama3", "tpu", {}),
                                                                      "tpu")
    # a clash: the later set's value
    clash = flagsets.check("no_collective_matmul+paxml_multislice").libtpu_init_args
    assert "--xla_jf_spmd_threshold_for_windowed_einsum_mib=0" in clash
    assert not any(f.endswith("=1000000") for f in clash)
    # generations: those every part takes; a part refused on a chip keeps its refusal line
    fused = "collective_fusion+latency_hiding"
    assert flagsets.check(fused).generations == ("v5e",)
    cfg = configio.build(tiny_config(mesh="1x8x1", flags=fused))
    assert worker_flags(cfg) == fused
    validate.check(cfg, 8, "tpu", chip="v5e")
    with pytest.raises(ConfigError, match="ghostlite"):
        validate.check(cfg, 8, "tpu", chip="v6e")
    for bad, said in (("v6e_llama3+fast", "'fast' (in 'v6e_llama3+fast')"), ("default+latency_hiding", "'default'"),
                      ("latency_hiding+latency_hiding", "twice")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            flagsets.check(bad)
        assert not flagsets.known(bad)
    assert worker_flags(configio.build(tiny_config(mesh="1x8x1", flags="v6e_llama3+fast"))) == "default"


def test_unknown_set_is_one_line_naming_the_sets():
    with pytest.raises(ConfigError) as e:
        flagsets.check("fast")
    text = str(e.value)
    assert "\n" not in text and "'fast'" in text and all(n in text for n in flagsets.names())


def test_a_flag_xla_does_not_know_is_one_line(monkeypatch):
    monkeypatch.setitem(flagsets.FLAG_SETS, "typo", flagsets.FlagSet(("--xla_cpu_no_such_flag=1",), (), "t", "t",
                                                                     generations=flagsets.TPU_GENERATIONS))
    with pytest.raises(ConfigError) as e:
        flagsets.validate("typo", "cpu")
    text = str(e.value)
    assert "\n" not in text and "--xla_cpu_no_such_flag" in text and "Unknown flag" in text
    flagsets.validate(EIGEN, "cpu")  # the installed XLA knows the real set's flag


# ----------------------------------------------------------------------------- the compiler

def _compile_step(env_update: dict) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **env_update}
    proc = subprocess.run([sys.executable, "-c", COMPILE_STEP], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_a_flag_set_reaches_the_compiler():
    """The same train step compiles to library (YNNPACK) fusions by default and to XLA's own
    dots under cpu_eigen_dots: the set's XLA_FLAGS changed what XLA emitted. Both compile under
    the session's XLA_FLAGS (8 devices, conftest's -O0 and loop emitters: half the compile, the
    same library fusions)."""
    base = {"XLA_FLAGS": os.environ["XLA_FLAGS"]}
    assert DEVICES8 in base["XLA_FLAGS"].split()
    default = _compile_step(flagsets.env_for("default", "cpu", base))
    eigen = _compile_step(flagsets.env_for(EIGEN, "cpu", base))
    assert default["library_fusions"] > 0, default
    assert eigen["library_fusions"] == 0 and eigen["dots"] > 0, (default, eigen)


# ----------------------------------------------------------------------------- CLI

# The CLI's refusals run in this process (the command, not its process, is under test); the flag
# probes they make are processes of their own, with the environment the command sees.

def test_unknown_set_via_the_cli_is_one_line(tmp_path, capsys):
    refused(capsys, "run", TINY, "--run-dir", tmp_path / "r", "--set", "flags=fast", "--no-progress",
            words=["unknown compiler flag set 'fast'", EIGEN])
    assert not (tmp_path / "r" / "logs").exists()  # refused before any worker started


def test_a_flag_the_installed_xla_lacks_fails_the_run_before_any_worker(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"{DEVICES8} --xla_cpu_no_such_flag=1")
    refused(capsys, "run", TINY, "--run-dir", tmp_path / "r", "--set", f"flags={EIGEN}", "--no-progress",
            words=["--xla_cpu_no_such_flag", EIGEN])


@pytest.mark.slow
def test_study_over_flag_sets_records_them_and_train_honours_them(tmp_path, make_space):
    space = make_space("flag_space", study=dict(trials=2, timeout=300), decisions=dict(flags=["default", EIGEN]),
                       mesh="8x1x1", per_device_batch=1, steps=2, log_every=1)
    run = tmp_path / "run"
    cli("run", space, "--run-dir", run, "--no-progress", timeout=900)
    study = optuna.load_study(study_name="flag_space", storage=f"sqlite:///{run}/study.db")
    trials = {t.params["flags"]: t for t in study.get_trials()}
    assert set(trials) == {"default", EIGEN}
    for name, t in trials.items():
        assert t.state == optuna.trial.TrialState.COMPLETE, t.user_attrs.get("failure_message")
        env = t.user_attrs["env"]
        assert env["flag_set"] == name
        assert DEVICES8 in env["xla_flags"].split()
        assert (EIGEN_FLAG in env["xla_flags"].split()) == (name == EIGEN)
        assert configio.build(configio.loads(t.user_attrs["config"])).flags == name  # exported with it
    # one worker per flag set, each started with its set
    assert sorted(os.listdir(run / "logs")) == [f"worker-0-{EIGEN}-p0.log", "worker-0-p0.log"]

    number = trials[EIGEN].number
    exported = tmp_path / "eigen.json"
    exported.write_text(trials[EIGEN].user_attrs["config"])
    # straight from the run folder (the trial's stored config, the text exported above), and from a
    # Python config that imports JAX first (started again); the shell's XLA_FLAGS are the session's
    direct = cli("train", run, "--trial", number, "--steps", "2", "--run-dir", tmp_path / "direct")
    assert "steps 0->2" in direct.stdout
    env = json.loads((tmp_path / "direct" / "env.json").read_text())
    assert env["flag_set"] == EIGEN and EIGEN_FLAG in env["xla_flags"].split(), direct.stdout
    assert DEVICES8 in env["xla_flags"].split() and env["num_devices"] == 8
    pyconf = tmp_path / "conf.py"
    pyconf.write_text("import jax  # JAX imported before the flag set is known\n"
                      "from paxsearch.search import configio\n"
                      f"def config():\n    return configio.loads(open({str(exported)!r}).read())\n")
    again = cli("train", pyconf, "--steps", "1", "--run-dir", tmp_path / "py")
    assert "steps 0->1" in again.stdout
    env = json.loads((tmp_path / "py" / "env.json").read_text())
    assert env["flag_set"] == EIGEN and EIGEN_FLAG in env["xla_flags"].split()


def test_unknown_set_in_a_config_for_train_is_one_line(tmp_path):
    cfg = tmp_path / "c.json"
    from paxsearch.trainer.config import TrainConfig
    cfg.write_text(configio.dumps(configio.to_fiddle(TrainConfig())))
    out = cli("train", cfg, "--set", "flags=fast", "--steps", "1", "--run-dir", tmp_path / "t", check=False)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(r"unknown compiler flag set 'fast'; choose one of default", lines[0])


# ----------------------------------------------------------------------------- plan mode (TPU topologies)

def test_a_flag_set_is_its_own_plan():
    """Plan-only trials reuse the plan of a finished trial with the same plan key: a different
    flag set compiles a different step, so it must not count as a duplicate."""
    import dataclasses

    from paxsearch.search.planning.keys import plan_keys
    from paxsearch.search.planning.targets import parse_target
    from paxsearch.trainer.config import MeshConfig, TrainConfig

    target = parse_target("tpu:v5e-16")
    cfg = TrainConfig(mesh=MeshConfig(ici=(1, 16, 1)), per_device_batch=1)
    keys = plan_keys(cfg, target)
    assert plan_keys(dataclasses.replace(cfg, flags="latency_hiding"), target)[:2] != keys[:2]
    assert plan_keys(dataclasses.replace(cfg, steps=7), target) == keys


@pytest.mark.slow  # a plan-only study compiled for TPU
@needs_libtpu
def test_plan_mode_compiles_with_the_sets_libtpu_args(tmp_path):
    run = tmp_path / "plan"
    cli("run", PLAN_SPACE, "--run-dir", run, "--no-progress", "--trials", 1, "--set", "flags=latency_hiding",
        "--set", "model_size=small", "--set", "per_device_batch=1", "--set", "peak_lr=0.001")
    (t,) = optuna.load_study(study_name="tpu_tiny_plan", storage=f"sqlite:///{run}/study.db").get_trials()
    assert t.state == optuna.trial.TrialState.COMPLETE and "compile_seconds" in t.user_attrs["plan"]
    env = t.user_attrs["env"]
    assert env["flag_set"] == "latency_hiding"
    assert set(flagsets.FLAG_SETS["latency_hiding"].libtpu_init_args) <= set(env["libtpu_init_args"].split())


@pytest.mark.slow  # a plan-only study compiled for v5p-32
@needs_libtpu
def test_the_v5p_set_compiles_for_a_v5p_slice(tmp_path):
    """MaxText's v5p flags (async collective-permutes among them) are known to this libtpu and
    accepted by the v5p compiler, where "collective_fusion" is refused (benchmarks/published.py)."""
    run = tmp_path / "v5p"
    cli("run", PLAN_SPACE, "--run-dir", run, "--no-progress", "--trials", 1, "--target", "tpu:v5p-32",
        "--set", "flags=v5p_collectives", "--set", "model_size=small", "--set", "per_device_batch=1",
        "--set", "peak_lr=0.001")
    (t,) = optuna.load_study(study_name="tpu_tiny_plan", storage=f"sqlite:///{run}/study.db").get_trials()
    assert t.state == optuna.trial.TrialState.COMPLETE and not t.user_attrs.get("failure_kind"), t.user_attrs
    assert "--xla_enable_async_collective_permute=true" in t.user_attrs["env"]["libtpu_init_args"].split()


@pytest.mark.slow  # a plan-only study compiled for v6e-8
@needs_libtpu
def test_a_v6e_set_compiles_for_v6e_where_collective_fusion_is_refused_statically(tmp_path, make_space):
    """Issue 20 §2: a set declared for v6e compiles the tiny model for a v6e topology; the same
    study's collective_fusion point (which v6e's compiler refuses: "platform ghostlite") fails in
    the driver's static check, in one line, and is never compiled."""
    space = make_space("v6e_flags", study=dict(target="tpu:v6e-8", objectives=["mfu", "memory"], trials=2),
                       decisions=dict(flags=["v6e_sparsecore", "collective_fusion"]), mesh="1x8x1")
    dry = cli("run", space, "--dry-run")
    assert "2 point(s): 1 pass the static checks, 1 invalid" in dry.stdout, dry.stdout
    run = tmp_path / "v6e"
    cli("run", space, "--run-dir", run, "--no-progress", "--workers", 1, timeout=900)
    trials = {t.params["flags"]: t for t in optuna.load_study(study_name="v6e_flags",
                                                              storage=f"sqlite:///{run}/study.db").get_trials()}
    ok, refused = trials["v6e_sparsecore"], trials["collective_fusion"]
    assert ok.state == optuna.trial.TrialState.COMPLETE and not ok.user_attrs.get("failure_kind"), ok.user_attrs
    assert "compile_seconds" in ok.user_attrs["plan"] and ok.user_attrs["env"]["device_kind"] == "TPU v6 lite"
    assert set(flagsets.FLAG_SETS["v6e_sparsecore"].libtpu_init_args) <= set(
        ok.user_attrs["env"]["libtpu_init_args"].split())
    message = refused.user_attrs["failure_message"]
    assert refused.state == optuna.trial.TrialState.FAIL and "\n" not in message, refused.user_attrs
    assert "'collective_fusion' does not apply to TPU v6e" in message and "v6e_sparsecore" in message
    assert refused.user_attrs["failure_kind"] == "invalid"
    assert "plan" not in refused.user_attrs and "plan_key" not in refused.user_attrs  # refused before any compile


@needs_libtpu
def test_a_libtpu_arg_libtpu_lacks_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_no_such_flag=1")
    refused(capsys, "run", PLAN_SPACE, "--run-dir", tmp_path / "r", "--no-progress", "--set", "flags=latency_hiding",
            words=["xla_tpu_no_such_flag", "LIBTPU_INIT_ARGS"])


@needs_libtpu
def test_a_shell_flag_libtpu_does_not_know_stops_a_plan_study_in_one_line(tmp_path, capsys, monkeypatch):
    """libtpu compiles the plans with its own XLA, which exits on a flag of XLA_FLAGS it does not
    know, in each trial's worker, one crash after another: the driver probes the shell's flags
    with a compile for the slice first."""
    flag = "--xla_tpu_paxsearch_no_such_flag=1"
    monkeypatch.setenv("XLA_FLAGS", f"{DEVICES8} {flag}")
    refused(capsys, "run", PLAN_SPACE, "--run-dir", tmp_path / "r", "--no-progress",
            words=[f"Unknown flag in XLA_FLAGS: {flag}", "the XLA_FLAGS of your shell"])
    assert not (tmp_path / "r").exists()  # nothing written


@needs_libtpu
def test_xla_cpu_flags_reach_the_cpu_backend_and_never_libtpu(tmp_path):
    """jaxlib 0.10.2's XLA knows --xla_cpu_use_fusion_emitters, libtpu 0.0.52's does not: the CPU
    backend reads it, libtpu reads XLA_FLAGS without XLA:CPU's flags (topology.py), so a plan
    study runs, and the process's XLA_FLAGS is as it was."""
    flag = "--xla_cpu_use_fusion_emitters=false"
    code = ("import os, jax; from paxsearch.search.planning import topology; topology.topology_devices('v5e-16'); "
            "print(os.environ['XLA_FLAGS'], len(jax.devices('cpu')))")
    env = {**os.environ, "XLA_FLAGS": f"{DEVICES8} {flag}", "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla_cache")}
    for _ in range(2):  # the one-op compile that primes libtpu is not kept (it cannot be read back)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == [DEVICES8, flag, "8"]  # put back; the CPU backend read the device count
        assert "persistent compilation cache" not in out.stderr, out.stderr[-2000:]
    # and the plans, compiled after it in each worker, are libtpu's with the CPU flag still set
    run = cli("run", PLAN_SPACE, "--run-dir", tmp_path / "r", "--no-progress", "--trials", "2",
              env={"XLA_FLAGS": f"{DEVICES8} {flag}"})
    assert "crash" not in run.stdout and "complete" in run.stdout, run.stdout
