"""Plans from the TPU compiler's HLO passes (search/planning/hlo_passes.py): the compile stopped once the
buffer assignment is written gives the full compile's memory, FLOPs and predicted step; a step
the compiler refuses for memory is the same PredictedOOM; the child never outlives its parent
and never compiles with another process's flags."""
import os
import subprocess
import sys
import time

import pytest

from paxsearch.search.planning import hlo_passes, topology
from paxsearch.search.planning.predict import hardware_for, hlo_cost, predict
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig

from ...search_util import needs_libtpu

SMALL = ModelConfig(vocab_size=2048, d_model=128, n_layers=4, n_heads=4, head_dim=32, d_ff=512, seq_len=128,
                    dtype="bfloat16")
# ~7.5B parameters: without remat its activations cannot fit a v5e chip
MODEL_8B = ModelConfig(vocab_size=131072, d_model=4096, n_layers=32, n_heads=32, head_dim=128, d_ff=16384,
                       seq_len=2048, dtype="bfloat16", param_dtype="float32")


@pytest.fixture(scope="module")
def v5e_8():
    return topology.topology_devices("v5e-8")


@pytest.fixture(scope="module")
def small_both_ways(v5e_8):
    cfg = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(2, 2, 2)), per_device_batch=2, remat="full")
    passes = hlo_passes.build_plan_program(cfg, v5e_8, "v5e-8")
    # the full compile's FLOPs counted from its optimized HLO, as a plan counts them (the planner's reader)
    full = plan_lib.build_program(cfg, v5e_8, count_flops=True, keep_hlo=True, hlo_flops=hlo_cost)
    return passes, full


@pytest.mark.slow  # quick-loop budget: two compiles (the 1B both ways is in test_tpu_targets too)
@needs_libtpu
def test_memory_flops_and_step_are_the_full_compiles(small_both_ways, v5e_8):
    passes, full = small_both_ways
    p, f = passes.plan.memory, full.plan.memory
    assert passes.compiled_step is None and passes.plan.hlo_source == "xla_dump"
    assert (p.argument_bytes, p.output_bytes, p.alias_bytes) == (f.argument_bytes, f.output_bytes, f.alias_bytes)
    # code generation adds a few scratch bytes to the temporaries (15,872 here and on llama3-8b)
    assert 0 < p.temp_bytes <= f.temp_bytes < p.temp_bytes + (64 << 10)
    # the generated code is bounded, not measured: the peak is at or above the full compile's
    assert 0 < f.generated_code_bytes < hlo_passes.CODE_BYTES_BOUND == p.generated_code_bytes
    assert f.peak_bytes <= passes.plan.peak_bytes < f.peak_bytes + hlo_passes.CODE_BYTES_BOUND
    # the FLOPs with the 4-layer loop counted 4 times, as the full compile's own HLO counts them
    assert passes.plan.xla_flops_per_step == pytest.approx(full.plan.xla_flops_per_step, rel=1e-6)
    hw = hardware_for(v5e_8)
    assert predict(passes, hw).step_time_s == pytest.approx(predict(full, hw).step_time_s, rel=0.02)
    # only code generation writes the compiler's cycle estimates: the full compile's plan reports them
    assert predict(passes, hw).roofline["compiler_cycles_ops"] == 0 == predict(passes, hw).roofline["compiler_excess_s"]
    assert predict(full, hw).roofline["compiler_cycles_ops"] > 0 and predict(full, hw).roofline["compiler_excess_s"] > 0
    assert set(passes.plan.phases) >= {"lower_s", "compile_s", "hlo_text_s"}
    # the child lowers the step (the parent only traces its shapes) and says how long it took
    assert passes.plan.phases["lower_s"] > 0 and passes.plan.phases["compile_s"] > 0


@pytest.mark.slow  # quick-loop budget: a refused 8B compile
@needs_libtpu
def test_a_step_the_compiler_refuses_is_predicted_oom_with_its_numbers(v5e_8):
    cfg = TrainConfig(model=MODEL_8B, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=1, remat="none")
    t0 = time.perf_counter()
    with pytest.raises(topology.PredictedOOM) as e:
        hlo_passes.build_plan_program(cfg, v5e_8, "v5e-8")
    assert e.value.required_bytes > e.value.available_bytes > 0
    assert "predicted OOM" in str(e.value) and time.perf_counter() - t0 < 120


@needs_libtpu
def test_a_standby_child_is_not_used_under_other_compiler_flags():
    hlo_passes._start_standby()
    standby = hlo_passes._standby
    assert standby is not None and standby.proc.poll() is None
    before = os.environ.get("LIBTPU_INIT_ARGS")
    os.environ["LIBTPU_INIT_ARGS"] = (before or "") + " --xla_tpu_enable_latency_hiding_scheduler=true"
    try:
        assert not standby.send("/nonexistent/spec.json")  # started with the other flags: refused
    finally:
        if before is None:
            os.environ.pop("LIBTPU_INIT_ARGS")
        else:
            os.environ["LIBTPU_INIT_ARGS"] = before
    hlo_passes._stop_standby()
    assert standby.proc.poll() is not None and not os.path.exists(standby.log)


def test_the_child_does_not_outlive_its_parent():
    # the parent leaves without its atexit (os._exit, as a killed worker would): the standby must go too
    code = ("import os; from paxsearch.search.planning import hlo_passes; hlo_passes._start_standby(); "
            "print(hlo_passes._standby.proc.pid, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    pid = int(out.stdout.split()[0])
    deadline = time.time() + 60
    while time.time() < deadline and _alive(pid):
        time.sleep(0.2)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_memory_from_a_buffer_assignment_dump():
    text = "\n".join([
        "allocation 0: size 1024, page 0, thread-local:",
        "allocation 1: size 4096, page 0, parameter 0, shape |f32[1024]| at ShapeIndex {}, maybe-live-out:",
        "allocation 2: size 512, page 0, parameter 1, shape |s32[128]| at ShapeIndex {}:",
        "allocation 3: size 8192, page 0, preallocated-temp:",
        "allocation 4: size 2048, color 5, page 0, preallocated-temp:",
        "allocation 5: size 256, color 1, page 0, preallocated-temp:",
        "allocation 6: size 64, page 0, maybe-live-out:",
        "allocation 7: size 32, page 0, constant:",
    ])
    m = hlo_passes.memory_from_buffers(text)
    assert (m.argument_bytes, m.output_bytes, m.alias_bytes) == (4608, 4160, 4096)
    assert (m.temp_bytes, m.host_temp_bytes) == (8192, 2048)  # VMEM (color 1) is not HBM
    with pytest.raises(hlo_passes.PassesError, match="no parameter and no output"):
        hlo_passes.memory_from_buffers("allocation 0: size 8, page 0, preallocated-temp:")
