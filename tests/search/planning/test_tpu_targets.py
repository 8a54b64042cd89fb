"""Planning for TPU slices on a CPU machine: targets, compile-only topologies, exact memory,
predicted OOM, multi-slice DCN, predicted step time and MFU (search/planning/targets.py,
search/planning/topology.py). Tests marked `tpu` need libtpu (the `tpu` extra; CI installs it).

Compile times on 2 cores: a ~1B step for v5e:4x4 ~25-30 s, small steps 5-25 s, an
over-capacity step is refused by the TPU compiler in ~3 s.
"""
import os

from paxsearch.trainer.flagsets import DEVICE_COUNT_FLAG, with_device_count  # noqa: E402  (imports no JAX)

os.environ["JAX_PLATFORMS"] = "cpu"
if DEVICE_COUNT_FLAG not in os.environ.get("XLA_FLAGS", ""):  # conftest sets 8
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS"), 8)

import math
import subprocess
import sys

import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning import targets as T
from paxsearch.search.planning import topology as topo
from paxsearch.search.planning.analytic import prescreen
from paxsearch.search.planning.compilation import plan_point
from paxsearch.search.planning.hlo_passes import CODE_BYTES_BOUND
from paxsearch.search.planning.keys import plan_key
from paxsearch.search.planning.method import PLAN_COMPILE_ENV, libtpu_unproven_line, plan_method, plan_method_notice
from paxsearch.search.trial.execute import plan_outcome
from paxsearch.store import Kind, compiler
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig

from ...search_util import HAS_LIBTPU, needs_libtpu

# ~0.94B parameters (d=2048, 16 layers, d_ff=8192, vocab 32768)
MODEL_1B = ModelConfig(vocab_size=32768, d_model=2048, n_layers=16, n_heads=16, head_dim=128, d_ff=8192,
                       seq_len=1024, dtype="bfloat16", param_dtype="float32")
# ~7.5B parameters (d=4096, 32 layers, d_ff=16384, vocab 131072)
MODEL_8B = ModelConfig(vocab_size=131072, d_model=4096, n_layers=32, n_heads=32, head_dim=128, d_ff=16384,
                       seq_len=2048, dtype="bfloat16", param_dtype="float32")
SMALL = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=16, head_dim=16, d_ff=1024, seq_len=256,
                    dtype="bfloat16", param_dtype="float32")


def cfg(model, ici, dcn=(1, 1, 1), remat="full", per_device_batch=None, global_batch=None):
    return TrainConfig(model=model, mesh=MeshConfig(ici=ici, dcn=dcn), per_device_batch=per_device_batch,
                       global_batch=global_batch, remat=remat)


# ----------------------------------------------------------------------------- no libtpu needed

@pytest.mark.parametrize("text, platform, devices, slices, chip, topology", [
    ("cpu:8", "cpu", 8, 1, None, None),
    ("tpu:v5e-16", "tpu", 16, 1, "v5e", "v5e:4x4"),
    ("tpu:v5p-128", "tpu", 64, 1, "v5p", "v5p:4x4x4"),
    ("tpu:v4-32", "tpu", 16, 1, "v4", "v4:2x2x4"),
    ("tpu:v6e-256", "tpu", 256, 1, "v6e", "v6e:16x16"),
    ("tpu:v5e-16,slices=2", "tpu", 32, 2, "v5e", "v5e:4x4"),
])
def test_parse_target(text, platform, devices, slices, chip, topology):
    t = T.parse_target(text)
    assert (t.platform, t.num_devices, t.num_slices, t.chip) == (platform, devices, slices, chip)
    assert t.name == text
    if platform == "tpu":
        assert t.plan_only == (not topo.has_tpu_hardware())
        assert t.hbm_bytes_per_device == topo.CHIPS[chip].hbm_bytes
        assert topo.slice_topology(t.slice_name) == topology


@pytest.mark.parametrize("text", ["cpu", "cpu:0", "tpu:v5e-3", "tpu:v9-8", "tpu:v5p-7", "tpu:v5e-16,slices=0",
                                  "tpu:v5e-16,foo=2", "cpu:8,slices=2", "tpu"])
def test_bad_targets_fail_with_one_line(text):
    with pytest.raises(ValueError) as e:
        T.parse_target(text)
    assert "\n" not in str(e.value) and text.split(",")[0].split(":")[0] in str(e.value)


def test_without_libtpu_a_tpu_target_says_how_to_install(monkeypatch):
    monkeypatch.setattr(topo, "libtpu_available", lambda: False)
    target = T.parse_target("tpu:v5e-16")  # parsing needs no libtpu
    with pytest.raises(topo.LibtpuMissing) as e:
        T.target_devices(target)
    assert str(e.value) == "TPU targets need libtpu: pip install 'paxsearch[tpu]'"


def test_compiler_out_of_memory_becomes_predicted_oom_with_the_numbers():
    import jax

    msg = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required "
           "for HLO temporaries (238.06G) exceeds available HBM (15.75G). HLO module: jit_train_step.")
    oom = topo.predicted_oom_from(jax.errors.JaxRuntimeError(msg))
    assert oom.source == "compiler"
    assert oom.required_bytes == int(238.06 * 2**30) and oom.available_bytes == int(15.75 * 2**30)
    assert topo.predicted_oom_from(jax.errors.JaxRuntimeError("INTERNAL: something else")) is None
    assert topo.predicted_oom_from(ValueError("RESOURCE_EXHAUSTED: not an XLA error")) is None
    with pytest.raises(topo.PredictedOOM, match="compiled peak 2.00 GiB"):
        topo.check_fits(2 * 2**30, 2**30)


def test_analytic_prescreen_rejects_hopeless_points_without_compiling():
    target = T.parse_target("tpu:v5e-16")
    oom = prescreen(cfg(MODEL_8B, (16, 1, 1), per_device_batch=1), target)  # 8B replicated 16 ways
    assert oom is not None and oom.source == "analytic"
    assert oom.required_bytes > oom.available_bytes == topo.CHIPS["v5e"].hbm_bytes
    assert prescreen(cfg(MODEL_8B, (1, 16, 1), per_device_batch=1), target) is None  # may fit: compile it


def test_equal_compiles_share_one_key():
    target = T.parse_target("tpu:v5e-16")
    a = cfg(MODEL_1B, (1, 16, 1), per_device_batch=2)
    b = cfg(MODEL_1B, (1, -1, 1), global_batch=32)  # the same mesh and global batch, spelled differently
    c = cfg(MODEL_1B, (2, 8, 1), per_device_batch=2)
    assert plan_key(a, target) == plan_key(b, target) != plan_key(c, target)


PLAN_KEYS = {"peak_bytes", "argument_bytes", "output_bytes", "temp_bytes", "xla_flops_per_step",
             "model_flops_per_step", "param_count", "compile_seconds", "global_batch", "predicted_step_time",
             "predicted_mfu", "roofline", "hbm_bytes", "fits"}
TINY = ModelConfig(vocab_size=384, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=128, seq_len=64)


def test_cpu_plans_carry_memory_and_the_roofline_and_invalid_points_are_typed():
    target = T.parse_target("cpu:8")
    devices = T.target_devices(target)
    plans = [plan_outcome(c, target, devices) for c in
             (cfg(TINY, (8, 1, 1), per_device_batch=2), cfg(TINY, (2, 2, 2), per_device_batch=2))]
    for r in plans:
        plan = r.plan.to_stored()
        assert r.kind is Kind.OK and PLAN_KEYS <= set(plan) and plan["predicted"] and plan["fits"] and r.predicted
        assert 0 < plan["predicted_mfu"] <= 1
        assert {"compute_s", "memory_s", "comm_s", "collectives", "predicted"} <= set(plan["roofline"])
        assert plan["compiler"] == compiler.made_here()  # the jax / jaxlib / libtpu that compiled it
    # 2x2x2 moves data over all three axes
    axes = {a for c in plans[1].plan.roofline["collectives"] for a in c["axes"]}
    assert axes == {"data", "fsdp", "tensor"}
    bad = plan_outcome(cfg(TINY, (3, 1, 1), per_device_batch=2), target, devices)  # 3 does not divide 8
    assert bad.kind is Kind.INVALID and "3" in bad.message and bad.plan is None


# ----------------------------------------------------------------------------- libtpu

@pytest.mark.parametrize("code", [
    "import jax; jax.devices()",
    "from paxsearch.search.planning.topology import topology_devices; assert len(topology_devices('v5e-16', 2)) == 32",
])
@needs_libtpu
def test_cpu_runs_and_topologies_stay_quiet_with_libtpu_installed(code):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


@pytest.mark.parametrize("name, devices, kind", [("v5e-16", 16, "TPU v5 lite"), ("v4-32", 16, "TPU v4"),
                                                 ("v5p-128", 64, "TPU v5"), ("v6e-256", 256, "TPU v6 lite")])
@needs_libtpu
def test_topology_devices(name, devices, kind):
    devs = topo.topology_devices(name)
    assert len(devs) == devices and devs[0].device_kind == kind and devs[0].platform == "tpu"


def test_plans_compile_in_full_under_a_libtpu_the_passes_were_not_proven_on():
    """The HLO passes equal the full compile under the libtpu they were proven on (0.0.52), not under
    0.0.42 (18-50% fewer temporaries): another version plans with full compiles, and says so once."""
    target = T.parse_target("tpu:v5e-16")  # plan-only: no TPU here
    assert plan_method(target, {}, libtpu="0.0.52") == "hlo_passes"
    assert plan_method(target, {}, libtpu="0.0.42.1") == "compiled"
    line = plan_method_notice(target, {}, libtpu="0.0.42.1")
    assert "\n" not in line and line.startswith("libtpu 0.0.42.1: ") and "proven" in line
    assert "compile in full" in line and "libtpu==0.0.52" in line  # the cause and the fix
    assert plan_method_notice(target, {}, libtpu="0.0.52") is None
    assert plan_method_notice(target, {PLAN_COMPILE_ENV: "full"}, libtpu="0.0.42.1") is None  # full anyway
    cpu = T.parse_target("cpu:8")
    assert plan_method(cpu, {}, libtpu="0.0.42.1") == "compiled" and plan_method_notice(cpu, {}, "0.0.42.1") is None
    if HAS_LIBTPU:  # the tpu extra pins the proven version
        assert libtpu_unproven_line() is None


def _stored(planned):
    """(Program, the plan's stored form) of plan_point."""
    program, plan = planned
    return program, plan.to_stored()


@pytest.fixture(scope="module")
def plans_1b():
    """The 1B step on v5e-16 planned both ways: from the HLO passes (the default) and compiled in full."""
    target = T.parse_target("tpu:v5e-16")
    config = cfg(MODEL_1B, (1, 16, 1), per_device_batch=2)
    passes = _stored(plan_point(config, target))
    before = os.environ.get(PLAN_COMPILE_ENV)
    os.environ[PLAN_COMPILE_ENV] = "full"
    try:
        full = _stored(plan_point(config, target))
    finally:
        os.environ.pop(PLAN_COMPILE_ENV) if before is None else os.environ.update({PLAN_COMPILE_ENV: before})
    return passes, full


@pytest.mark.slow  # two compiles of a 1B model for v5e-16
@needs_libtpu
def test_1b_plan_from_the_hlo_passes_is_the_full_compiles(plans_1b):
    """The compile stopped after buffer assignment gives the full compile's memory (the generated
    code aside, which it bounds from above), the same FLOPs and the same predicted step."""
    (passes_program, passes), (_, full) = plans_1b
    assert passes["plan_method"] == "hlo_passes" and full["plan_method"] == "compiled"
    assert passes_program.compiled_step is None and passes["generated_code_bytes"] == CODE_BYTES_BOUND
    for key in ("argument_bytes", "output_bytes", "alias_bytes", "param_count", "model_flops_per_step"):
        assert passes[key] == full[key], key
    assert passes["temp_bytes"] <= full["temp_bytes"] < passes["temp_bytes"] + (64 << 10)  # code generation's scratch
    assert 0 < full["generated_code_bytes"] < CODE_BYTES_BOUND  # 32.5 MB
    # conservative: at or above the full compile's peak, by no more than the bound
    assert full["peak_bytes"] <= passes["peak_bytes"] < full["peak_bytes"] + CODE_BYTES_BOUND
    assert passes["xla_flops_per_step"] == pytest.approx(full["xla_flops_per_step"], rel=1e-3)
    assert passes["predicted_step_time"] == pytest.approx(full["predicted_step_time"], rel=0.02)
    assert passes["compile_seconds"] < full["compile_seconds"]


@pytest.mark.slow  # two compiles of a 1B model for v5e-16
@needs_libtpu
def test_1b_memory_equals_memory_analysis_of_the_same_compiled_step(plans_1b):
    program, plan = plans_1b[1]
    ma = program.compiled_step.memory_analysis()
    assert plan["argument_bytes"] == ma.argument_size_in_bytes
    assert plan["output_bytes"] == ma.output_size_in_bytes
    assert plan["temp_bytes"] == ma.temp_size_in_bytes
    assert plan["alias_bytes"] == ma.alias_size_in_bytes
    assert plan["peak_bytes"] == (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
                                  + ma.temp_size_in_bytes + ma.generated_code_size_in_bytes)
    assert 0.9e9 < plan["param_count"] < 1.1e9
    assert plan["device_kind"] == "TPU v5 lite" and plan["num_devices"] == 16
    assert plan["hbm_bytes"] == topo.CHIPS["v5e"].hbm_bytes and plan["fits"]
    assert plan["predicted"] and plan["roofline"]["predicted"]
    assert 0 < plan["predicted_mfu"] <= 1 and plan["predicted_step_time"] > 0
    # FLOPs from the HLO with the 16-layer loop counted 16 times: full remat runs the
    # forward twice, so between 1x and ~1.5x the model FLOPs per device
    model_per_device = plan["model_flops_per_step"] / 16
    assert 1.0 * model_per_device < plan["xla_flops_per_step"] < 1.6 * model_per_device
    assert 16 in plan["roofline"]["trip_counts"].values()


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
@needs_libtpu
def test_8b_without_remat_on_v5e_16_is_predicted_oom_with_the_numbers():
    target = T.parse_target("tpu:v5e-16")
    c = cfg(MODEL_8B, (1, 16, 1), remat="none", per_device_batch=1)
    assert prescreen(c, target) is None  # the state alone fits: only the compiler can tell
    with pytest.raises(topo.PredictedOOM) as e:
        plan_point(c, target)[1]
    oom = e.value
    assert oom.source == "compiler"
    assert oom.available_bytes == pytest.approx(topo.CHIPS["v5e"].hbm_bytes, rel=0.01)
    assert oom.required_bytes > oom.available_bytes
    assert "GiB" in str(oom) and "\n" not in str(oom)
    outcome = plan_outcome(c, target)
    assert outcome.kind is Kind.PREDICTED_OOM and outcome.plan.peak_bytes == oom.required_bytes
    assert outcome.plan.peak_bytes_source == "RESOURCE_EXHAUSTED (compiler)"


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
@needs_libtpu
def test_two_slice_target_compiles_with_dcn_data_2():
    target = T.parse_target("tpu:v5e-16,slices=2")
    devices = T.target_devices(target)
    assert len(devices) == 32 and {d.slice_index for d in devices} == {0, 1}
    program, plan = _stored(plan_point(cfg(SMALL, (1, 2, 8), dcn=(2, 1, 1), per_device_batch=2), target,
                                                  devices))
    assert plan["mesh_shape"] == {"data": 2, "stage": 1, "fsdp": 2, "context": 1, "tensor": 8}
    # the mesh puts the two slices on the data axis
    slices = [[d.slice_index for d in program.mesh.devices[i].flat] for i in range(2)]
    assert slices == [[0] * 16, [1] * 16]
    dcn = [c for c in plan["roofline"]["collectives"] if c["link"] == "dcn"]
    assert dcn and all(c["axes"] == ["data"] for c in dcn)
    assert any(c["kind"] == "all-reduce" for c in dcn)  # the gradient reduction across slices
    assert all(c["link"] == "ici" for c in plan["roofline"]["collectives"] if "data" not in c["axes"])


@pytest.fixture(scope="module")
def small_programs():
    """(program, plan) of one small model (d_model=256, 16 heads) on v5e-16 at global batch 64,
    with all 16 devices on the fsdp axis or on the tensor axis: two compiles that the MFU test
    and the schedule test (moved here from tests/roofline/test_overlap.py to share them) read."""
    target = T.parse_target("tpu:v5e-16")
    devices = T.target_devices(target)
    return {axis: _stored(plan_point(cfg(SMALL, ici, global_batch=64), target, devices))
            for axis, ici in (("fsdp", (1, 16, 1)), ("tensor", (1, 1, 16)))}


@pytest.mark.slow  # its fixture compiles for v5e-16 twice
@needs_libtpu
def test_predicted_mfu_is_in_range_and_orders_tensor_16_below_fsdp_16(small_programs):
    small_plans = {axis: plan for axis, (_, plan) in small_programs.items()}
    for axis, p in small_plans.items():
        assert 0 < p["predicted_mfu"] <= 1, axis
        assert p["predicted_step_time"] > 0 and p["roofline"]["predicted"]
    tensor, fsdp = small_plans["tensor"], small_plans["fsdp"]
    assert tensor["predicted_step_time"] > fsdp["predicted_step_time"]
    assert tensor["predicted_mfu"] < fsdp["predicted_mfu"]
    # each moves data over its own axis only
    assert {tuple(c["axes"]) for c in tensor["roofline"]["collectives"]} == {("tensor",)}
    assert {tuple(c["axes"]) for c in fsdp["roofline"]["collectives"]} == {("fsdp",)}


@pytest.mark.slow  # reads the fsdp compile of small_programs
@needs_libtpu
def test_a_step_compiled_for_v5e_16_is_read_from_its_schedule(small_programs):
    """The roofline's overlap model (search/planning/roofline, tests/roofline/test_overlap.py) on a
    train step compiled for v5e-16: the async collectives are read from the step's schedule."""
    program, plan = small_programs["fsdp"]
    module = R.parse_module(program.plan.hlo_text)
    assert module.is_scheduled
    pairs = opened = 0
    for comp in module.computations.values():
        evs = R.events(module, comp).values()
        opened += sum(len(keys) for what, keys in evs if what == "open")
        pairs += sum(len(keys) for what, keys in evs if what == "close")
    assert pairs > 0 and pairs == opened  # every async transfer that starts is done in its computation
    roof = plan["roofline"]
    assert roof["overlap"] == "schedule"
    assert all(math.isfinite(roof[k]) for k in ("step_time_s", "exposed_comm_s", "comm_s", "roofline_s"))
    assert roof["compute_s"] <= roof["roofline_s"] <= roof["step_time_s"]
    # the fsdp all-gathers and the collective matmuls' permutes are async: some is hidden
    assert 0 < roof["exposed_comm_s"] < roof["comm_s"]
    assert roof["step_time_s"] == pytest.approx(roof["roofline_s"] + roof["exposed_comm_s"])
