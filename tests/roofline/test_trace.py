"""search/planning/roofline/trace.py: a real jax.profiler trace of a jitted step, read without xprof, its ops
matched to the compiled HLO and bucketed as the roofline buckets them; the pure parts (self time,
the device lines' program filter) on rows as a TPU trace lays them out."""
import glob
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from paxsearch.search.planning.predict import hardware_for
from paxsearch.search.planning.roofline import call_graph, parse_module
from paxsearch.search.planning.roofline import trace as T

from ..search_util import needs_libtpu

TRIPS = 5
CALLS = 3


# The trace is taken in a process of its own: jax.profiler.trace in a test process that has loaded
# libtpu for compile-only TPU devices (other roofline tests do) crashes it (a segfault in the profiler's
# start, seen with jax 0.10.2 / libtpu 0.0.52), which would end the whole pytest worker.
_TRACE = f"""
import sys, jax, jax.numpy as jnp
def body(_, h):
    return jnp.tanh(h @ w) * 0.5 + h
def step(w, x):
    return jnp.sum(jnp.square(jax.lax.fori_loop(0, {TRIPS}, body, x)))
w = jnp.ones((128, 128), jnp.float32) * 0.01
x = jnp.ones((64, 128), jnp.float32)
compiled = jax.jit(step).lower(w, x).compile()
jax.block_until_ready(compiled(w, x))
with jax.profiler.trace(sys.argv[1]):
    for i in range({CALLS}):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            jax.block_until_ready(compiled(w, x))
open(sys.argv[1] + "/step.hlo", "w").write(compiled.as_text())
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """(optimized HLO, rows) of CALLS executions of a jitted loop of matmuls on one CPU device,
    traced by a fresh process (`_TRACE`)."""
    folder = str(tmp_path_factory.mktemp("trace"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _TRACE, folder], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(os.path.join(folder, "step.hlo")) as f:
        text = f.read()
    return text, T.read_xplane(T.newest_xplane(folder)), folder


def test_newest_xplane_is_the_trace_jax_wrote(traced):
    _, rows, folder = traced
    assert T.newest_xplane(folder) in glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    assert rows and all(isinstance(r, T.TraceRow) for r in rows)
    with pytest.raises(FileNotFoundError):
        T.newest_xplane(os.path.join(folder, "nothing-here"))


def test_every_measured_op_is_an_instruction_run_as_often_as_the_call_graph_says(traced):
    text, rows, _ = traced
    module = parse_module(text)
    index = T.instruction_index(module)
    totals = T.op_totals(rows, T.module_name(text))
    assert totals, "no op events of the module in the trace"
    graph = call_graph(module)
    assert graph.trip_counts and set(graph.trip_counts.values()) == {TRIPS}
    for name, t in totals.items():
        assert name in index, f"{name} is not an instruction of the compiled module"
        comp, _ = index[name]
        assert t.count == CALLS * graph.multiplier[comp.name], name
        assert 0 <= t.self_ns <= t.total_ns
    in_loop = [n for n in totals if graph.multiplier[index[n][0].name] == TRIPS]
    assert in_loop, "the loop body's ops were not measured"


def test_measured_and_planned_buckets_of_the_same_step(traced):
    text, rows, _ = traced
    hw = hardware_for(jax.devices()[:1])
    measured = T.measured_buckets(text, T.op_totals(rows, T.module_name(text)))
    assert set(measured) == set(T.BUCKETS)
    assert measured[T.MATMUL] > 0 and measured[T.UNMATCHED] == 0
    out = T.compare(text, hw, rows, CALLS, num_devices=1, wall_step_s=1e-3)
    assert out["measured_step_source"] == "host StepTraceAnnotation" and len(out["host_step_s"]) == CALLS
    assert out["measured_step_s"] > 0 and out["device_runs"] == 0
    assert out["buckets"][T.MATMUL]["predicted_s"] > 0
    assert out["buckets"][T.MATMUL]["measured_s"] == pytest.approx(measured[T.MATMUL] / CALLS)
    assert out["predicted_step_s"] == pytest.approx(
        sum(b["predicted_s"] for b in out["buckets"].values()), rel=1e-9)
    top = out["top_ops"]
    assert top and all(r["bucket"] in T.BUCKETS for r in top)
    assert any(r["bucket"] == T.MATMUL and r["predicted_s"] and r["flops"] for r in top)


def _row(line, name, start, dur, plane="/device:TPU:0", **stats):
    return T.TraceRow(plane, line, name, float(start), float(dur), stats)


def test_self_time_subtracts_what_nests_inside_on_the_same_line():
    rows = [_row("XLA Ops", "while.1", 0, 100), _row("XLA Ops", "fusion.2", 10, 30),
            _row("XLA Ops", "fusion.3", 50, 40), _row("XLA Ops", "copy.4", 55, 10),
            _row("XLA Ops", "fusion.5", 120, 5), _row("Other", "x", 0, 100)]
    got = {r.name: s for r, s in T.self_times(rows)}
    assert got == {"while.1": 30.0, "fusion.2": 30.0, "fusion.3": 30.0, "copy.4": 10.0, "fusion.5": 5.0, "x": 100.0}


def test_device_ops_are_kept_only_inside_the_programs_executions():
    rows = [_row("XLA Modules", "jit_train_step(7)", 0, 100), _row("XLA Modules", "jit_other(8)", 200, 50),
            _row("XLA Ops", "%fusion.1", 10, 20), _row("XLA Ops", "fusion.1", 60, 20),
            _row("XLA Ops", "fusion.1", 210, 20), _row("Steps", "0", 0, 110)]
    totals = T.op_totals(rows, "jit_train_step")
    assert set(totals) == {"fusion.1"} and totals["fusion.1"].count == 2 and totals["fusion.1"].self_ns == 40
    assert T.op_totals(rows)["fusion.1"].count == 3
    assert [r.name for r in T.module_runs(rows, "jit_train_step")] == ["jit_train_step(7)"]
    assert [r.duration_ns for r in T.device_steps(rows)] == [110]
    # a device that names no program so: every op of its XLA Ops line
    assert T.op_totals(rows, "jit_missing")["fusion.1"].count == 3


def test_module_name_reads_the_hlo_header():
    assert T.module_name("HloModule jit_train_step, is_scheduled=true\n\nENTRY ...") == "jit_train_step"
    assert T.base_module_name("jit_train_step(123)") == "jit_train_step"
    with pytest.raises(ValueError):
        T.module_name("no header")


COLLECTIVE_HLO = """HloModule m, is_scheduled=true

%sum (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: f32[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  %all-reduce.1 = f32[64,64]{1,0} all-reduce(%a), replica_groups={{0,1}}, to_apply=%sum
  ROOT %add.2 = f32[64,64]{1,0} add(%all-reduce.1, %all-reduce.1)
}
"""


def test_collectives_and_elementwise_ops_get_their_buckets():
    m = parse_module(COLLECTIVE_HLO)
    idx = T.instruction_index(m)
    assert T.bucket_of(m, *idx["all-reduce.1"]) == T.COLLECTIVES
    assert T.bucket_of(m, *idx["add.2"]) == T.OTHER
    assert T.bucket_of(m, *idx["a"]) == T.CONTROL


@needs_libtpu
def test_splash_kernels_matmuls_and_host_copies_of_a_tpu_step_get_their_buckets():
    """A splash forward and backward with a matmul, its weight gradient put in pinned host memory,
    compiled for one v5e chip (compile-only): each kind lands in its bucket."""
    from paxsearch.search.planning import topology
    from paxsearch.trainer import attention as A

    dev = topology.topology_devices("v5e-1")[0]
    one = jax.sharding.SingleDeviceSharding(dev)
    host = jax.sharding.SingleDeviceSharding(dev, memory_kind="pinned_host")
    s, h, d = 512, 2, 128
    q = jax.ShapeDtypeStruct((1, s, h, d), jnp.bfloat16, sharding=one)
    w = jax.ShapeDtypeStruct((d, d), jnp.bfloat16, sharding=one)
    seg = jax.ShapeDtypeStruct((1, s), jnp.int32, sharding=one)

    def loss(q, k, v, w, seg):
        return jnp.sum((A.splash(q, k, v, seg) @ w).astype(jnp.float32))

    def step(q, k, v, w, seg):
        gq, gw = jax.grad(loss, argnums=(0, 3))(q, k, v, w, seg)
        return gq, jax.device_put(gw, host)

    text = jax.jit(step, out_shardings=(one, host)).lower(q, q, q, w, seg).compile().as_text()
    m = parse_module(text)
    buckets: dict[str, set] = {}
    for comp in m.computations.values():
        for ins in comp.instrs:
            buckets.setdefault(T.bucket_of(m, comp, ins), set()).add(ins.opcode)
    assert buckets[T.ATTENTION] == {"custom-call"}
    assert buckets[T.MATMUL] and buckets[T.OTHER]
    assert buckets[T.HOST] >= {"copy-start", "copy-done"}
