"""Where a plan's seconds go (issue 20 section 1): build_program times each phase (PlanResult.phases,
stored in every trial's timings), and a plan compiles its step once. On compile-only TPU devices the
optimized HLO comes from the dump of that one compile when compiled.as_text() fails, never from a
second compile (trainer/plan.py optimized_hlo)."""
import contextlib
import dataclasses

import jax
import pytest

from paxsearch.search.planning import plans, topology
from paxsearch.search.planning.predict import hlo_cost
from paxsearch.search.trial.record import PLAN_PHASES, driver_timings
from paxsearch.store.outcome import TrialOutcome
from paxsearch.trainer import plan as plan_lib
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig
from paxsearch.trainer.results import FLOPS_FROM_HLO, FLOPS_FROM_PROBES, FLOPS_LOOP_BODY_ONCE

from ..search_util import needs_libtpu

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # jax's event around every XLA compile
SMALL = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=128, seq_len=32)
BUILD_PHASES = ("lower_s", "compile_s", "flop_probes_s", "hlo_text_s")


@contextlib.contextmanager
def compiles():
    """The list of XLA compiles (their seconds) that happen inside the block."""
    seen: list[float] = []

    def listen(event: str, seconds: float, **_) -> None:
        if event == BACKEND_COMPILE:
            seen.append(seconds)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_a_cpu_plan_times_each_phase_and_counts_the_loops_flops_without_compiling_again():
    cfg = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=1)
    with compiles() as one:
        plain = plan_lib.build_program(cfg, keep_hlo=True, count_flops=False).plan
    with compiles() as counted_compiles:
        counted = plan_lib.build_program(cfg, keep_hlo=True, count_flops=True, hlo_flops=hlo_cost).plan
    assert len(one) == 1 and len(counted_compiles) == 1  # the step alone: its loops are counted in its HLO
    for plan in (plain, counted):
        assert set(plan.phases) == set(BUILD_PHASES) and all(v >= 0 for v in plan.phases.values())
        assert plan.phases["lower_s"] + plan.phases["compile_s"] == pytest.approx(plan.compile_seconds, abs=0.05)
    assert plain.phases["flop_probes_s"] == 0.0 and plain.hlo_source == "as_text" and plain.hlo_text
    assert plain.flops_source == FLOPS_LOOP_BODY_ONCE and counted.flops_source == FLOPS_FROM_HLO
    assert plans.trained(counted, None).to_stored()["flops_source"] == FLOPS_FROM_HLO  # stored with every trial's plan
    # the 2-layer scan's body runs twice: XLA's cost_analysis counts it once
    assert counted.xla_flops_per_step > 1.3 * plain.xla_flops_per_step


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_where_a_loop_cannot_be_read_two_unrolled_probes_count_the_same_flops():
    """The layers' scan, 2 microbatches and 2 vocab tiles in one step: the HLO count (one compile)
    and the unrolled 1- and 2-layer probes (two more) agree within 1% (measured: 0.4-0.9% on
    tiny meshes, pipelines included; the HLO counts fusions' elementwise work as XLA's
    cost_analysis of the unrolled program does, not exactly alike)."""
    cfg = TrainConfig(model=dataclasses.replace(SMALL, vocab_tiles=2), mesh=MeshConfig(ici=(2, 4, 1)),
                      per_device_batch=2, grad_accum_steps=2)
    # keep_hlo=False: the text is read, then dropped
    counted = plan_lib.build_program(cfg, count_flops=True, hlo_flops=hlo_cost).plan
    assert counted.flops_source == FLOPS_FROM_HLO and counted.hlo_text is None
    unreadable = lambda text: None  # as the planner's reader answers for a loop without a readable trip count
    for reader in (unreadable, None):  # ... and as the trainer counts alone, with no reader
        with compiles() as three:
            probed = plan_lib.build_program(cfg, count_flops=True, hlo_flops=reader).plan
        assert len(three) == 3 and probed.flops_source == FLOPS_FROM_PROBES and probed.phases["flop_probes_s"] > 0
        assert probed.xla_flops_per_step == pytest.approx(counted.xla_flops_per_step, rel=0.01)


def test_the_stored_timings_keep_the_plan_phases():
    timings = {"plan_s": 3.0, "train_s": 2.0, "worker_s": 5.5, "lower_s": 0.5, "compile_s": 2.0,
               "flop_probes_s": 0.0, "hlo_text_s": 0.25, "predict_s": 0.25}
    stored = driver_timings(TrialOutcome(timings=timings), total_s=6.0)
    assert stored == {"plan_s": 3.0, "train_s": 2.0, "total_s": 6.0, "overhead_s": 1.0,
                      **{k: timings[k] for k in PLAN_PHASES}}
    assert driver_timings(TrialOutcome(timings={"plan_s": 1.0}), total_s=1.0) == {  # an older worker
        "plan_s": 1.0, "train_s": 0.0, "total_s": 1.0, "overhead_s": 0.0}
    # the seconds a trial spent starting its worker (opening the chip) are kept apart from the overhead
    started = driver_timings(TrialOutcome(timings={"plan_s": 3.0, "train_s": 2.0, "worker_start_s": 0.75}), 6.0)
    assert started["worker_start_s"] == 0.75 and started["overhead_s"] == 0.25


class _NoText:
    """A compiled step whose text views fail, as jax 0.10.2 / libtpu 0.0.52's do for a v5p step
    with a SparseCore gather offload (tests/roofline/test_hlo_source_fallback.py compiles that
    real case; it is too big for the quick loop)."""

    def __init__(self, compiled):
        self.compiled = compiled

    def as_text(self):
        raise jax.errors.JaxRuntimeError("INTERNAL: RET_CHECK failure: async-update instruction")

    def runtime_executable(self):
        raise jax.errors.JaxRuntimeError("INTERNAL: RET_CHECK failure: async-update instruction")


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
@needs_libtpu
def test_a_tpu_plan_compiles_once_and_its_dump_stands_in_for_the_text(monkeypatch):
    devices = topology.topology_devices("v5e-4")
    cfg = TrainConfig(model=SMALL, mesh=MeshConfig(ici=(1, 4, 1)), per_device_batch=1)
    with compiles() as seen:
        program = plan_lib.build_program(cfg, devices, count_flops=False, keep_hlo=True)
    assert len(seen) == 1 and program.plan.hlo_source == "as_text"
    assert set(program.plan.phases) == set(BUILD_PHASES)
    # where the text views fail, the module comes from the dump of that same compile
    real = plan_lib.optimized_hlo
    monkeypatch.setattr(plan_lib, "optimized_hlo", lambda compiled, lowered, folder=None: real(
        _NoText(compiled), lowered, folder))
    with compiles() as again:
        fallback = plan_lib.build_program(cfg, devices, count_flops=False, keep_hlo=True).plan
    assert len(again) == 1 and fallback.hlo_source == "xla_dump" and fallback.hlo_error is None
    assert fallback.hlo_text.startswith("HloModule jit_train_step, is_scheduled=true")
    assert fallback.peak_bytes == program.plan.peak_bytes
    # on a CPU, whose compiled steps run, nothing is dumped: the text view is the only source tried
    # before a second compile, which the persistent compilation cache can then serve
    with compiles() as cpu:
        on_cpu = plan_lib.build_program(dataclasses.replace(cfg, mesh=MeshConfig(ici=(1, 8, 1))), count_flops=False,
                                        keep_hlo=True).plan
    assert len(cpu) == 2 and on_cpu.hlo_source == "xla_dump"
