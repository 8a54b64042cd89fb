"""HBM bytes are priced at the share of the bandwidth that XLA's ops were measured to sustain on a
real chip (Hardware.hbm_efficiency, trainer/hardware.py), as FLOPs are at the measured matmul
rate. The figure is one measurement (XLA's bf16 x * 2 on one TPU v5e, 80.3% of 819 GB/s); two
other ops measured on the same chip check it: the roofline of their compiled programs must land
near their measured times. The same measurements are why the TPU compiler's own per-op estimates
stay off by default (Hardware.on_chip "roofline"): they put these memory-bound ops at 2-2.5x the
measured time."""
import re

import jax
import jax.numpy as jnp
import pytest

from paxsearch.search.planning import roofline as R
from paxsearch.search.planning import topology
from paxsearch.search.planning.predict import hardware_for
from paxsearch.search.planning.roofline.cost import roofline_seconds
from paxsearch.trainer import hardware

from ..search_util import needs_libtpu

BW = hardware.spec("v5e").hbm_bandwidth.value  # 819 GB/s, the bandwidth the shares below are of
# github.com/AMLeng/tpu-kernels @078449150061f876e1dd285f9fe48969d725204a, src/tpu_kernels/ops/*/PERF.md
# (one v5e chip, device timing, 2026-05-04): share of 819 GB/s over the bytes each op must move
MEASURED = {"scale": 0.803, "rmsnorm": 0.560, "softmax": 0.559}


def _rmsnorm(x, scale, eps=1e-6):  # the measured XLA reference: f32 mean square, cast back, then scale
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)).astype(x.dtype) * scale


def _softmax(x):  # the measured XLA reference: max and denominator in one reduction, then one divide
    def combine(a, b):
        m = jnp.maximum(a[0], b[0])
        return m, a[1] * jnp.exp(a[0] - m) + b[1] * jnp.exp(b[0] - m)
    xf = x.astype(jnp.float32)
    m, d = jax.lax.reduce((xf, jnp.ones_like(xf)), (-jnp.inf, 0.0), combine, (1,))
    return (jnp.exp(xf - m[:, None]) / d[:, None]).astype(x.dtype)


@pytest.fixture(scope="module")
def measured_ops():
    """(roofline seconds, the compiler's estimate in seconds, measured seconds) of each measured op,
    compiled for one v5e chip at the measured shapes."""
    device = topology.topology_devices("v5e-4")[0]
    hw = hardware_for([device])

    def arr(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=jax.sharding.SingleDeviceSharding(device))

    cases = {"scale": (lambda x: x * 2, [arr(16384, 16384)], 2 * 16384 ** 2 * 2),
             "rmsnorm": (_rmsnorm, [arr(32768, 8192), arr(8192)], 2 * 32768 * 8192 * 2 + 8192 * 2),
             "softmax": (_softmax, [arr(32768, 8192)], 2 * 32768 * 8192 * 2)}
    out = {}
    for name, (fn, args, nbytes) in cases.items():
        text = jax.jit(fn).lower(*args).compile().as_text()
        estimate = sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', text)) / hw.clock_hz
        out[name] = (R.analyze(text, hw, num_devices=1).step_time_s, estimate, nbytes / (MEASURED[name] * BW))
    return out


def test_hbm_efficiency_is_a_measured_share_with_its_measurement():
    v5e = hardware.TABLE["v5e"].hbm_efficiency
    assert v5e.value == MEASURED["scale"] and v5e.source.startswith("measured:") and "scale/PERF.md" in v5e.source
    for name in ("v4", "v5p"):  # no measurement of their own: said so, and v5e's figure
        figure = hardware.TABLE[name].hbm_efficiency
        assert figure.source.startswith("assumption:") and figure.value == v5e.value
    # v6e: Google's microbenchmark, XLA's copy of 2^24 bf16 elements (read + write) on one v6e
    v6e = hardware.TABLE["v6e"]
    assert v6e.hbm_efficiency.source.startswith("measured:") and "tpu-recipes" in v6e.hbm_efficiency.source
    copied = 2 * 16_777_216 * 2  # bytes read and written
    assert copied / 0.049359414e-3 / 1e9 == pytest.approx(1359.596, abs=0.01)  # the benchmark's GBps
    assert round(copied / 0.049359414e-3 / v6e.hbm_bandwidth.value, 3) == v6e.hbm_efficiency.value == 0.829
    for name in ("a100", "h100", "h200"):  # nothing traced: the product page's bandwidth, as before
        assert hardware.TABLE[name].hbm_efficiency.value == 1.0
    assert hardware_for([], "v5e").sustained_hbm_bandwidth == pytest.approx(0.803 * 819e9)


def test_bytes_cost_their_time_at_the_sustained_bandwidth():
    hw = hardware_for([], "v5e")
    assert roofline_seconds(0.0, 819e9, hw) == pytest.approx(1 / 0.803)
    assert roofline_seconds(0.0, 819e9, R.Hardware("x", 1e12, 819e9, 1e9, 1e9)) == pytest.approx(1.0)


@needs_libtpu
def test_measured_ops_land_near_their_measured_time(measured_ops):
    scale, _, measured = measured_ops["scale"]
    assert scale == pytest.approx(measured, rel=0.01)  # the op the figure comes from
    for name in ("rmsnorm", "softmax"):  # two ops the figure was not taken from
        roofline, _, measured = measured_ops[name]
        assert 0.95 < roofline / measured < 1.10, (name, roofline / measured)


@needs_libtpu
def test_the_compilers_estimates_are_far_from_the_measured_times(measured_ops):
    for name, (_, estimate, measured) in measured_ops.items():
        assert estimate / measured > 1.8, (name, estimate / measured)


# the bytes each of the chip's own HBM ops reads and writes, per byte of its record's total
_READ_SHARE = {"scale": 1 / 2, "add": 2 / 3, "copy": 1 / 2, "transpose": 1 / 2, "convert_bf16_to_f32": 1 / 3,
               "convert_f32_to_bf16": 2 / 3}


def test_v5e_reads_and_writes_are_priced_apart_from_the_chips_own_record():
    """The project's v5e chip (benchmarks/chip_figures.py --sections hbm): a reduction's reads give the read
    share, a scale's reads and writes the write share; every other plain op of the record then lands within 4%,
    where one share for all bytes puts the reductions 11-13% slow."""
    import json
    import os
    import statistics

    from ..search_util import REPO

    with open(os.path.join(REPO, "benchmarks", "data", "chip_figures_v5e_2026-12-07.json")) as f:
        cases = json.load(f)["sections"]["hbm"]["cases"]
    eff = {(c["kind"], c["mib"]): c["efficiency"] for c in cases}
    read = statistics.mean(eff[("reduce_sum_to_f32", m)] for m in (32, 256))
    write = 1 / (2 / statistics.mean(eff[("scale", m)] for m in (32, 256)) - 1 / read)
    assert (round(read, 3), round(write, 3)) == (hardware.V5E_HBM_READ, hardware.V5E_HBM_WRITE)
    hw = hardware_for([], "v5e")
    assert (hw.hbm_read_efficiency, hw.hbm_write_efficiency) == (hardware.V5E_HBM_READ, hardware.V5E_HBM_WRITE)
    assert hardware.TABLE["v5e"].hbm_read_efficiency.source.startswith("measured:")
    for c in cases:
        if c["kind"] not in _READ_SHARE:
            continue
        r = c["bytes"] * _READ_SHARE[c["kind"]]
        predicted = c["bytes"] / hw.hbm_seconds(r, c["bytes"] - r) / hw.hbm_bandwidth
        assert predicted == pytest.approx(c["efficiency"], rel=0.04), c["id"]
    for m in (32, 256):  # the one share for every byte, against the reductions
        assert eff[("reduce_sum_to_f32", m)] / hw.hbm_efficiency > 1.10
    # chips without the split keep one share for every byte
    v6e = hardware_for([], "v6e")
    assert v6e.hbm_read_efficiency is None and v6e.hbm_seconds(1e9, 1e9) == pytest.approx(2e9 / v6e.sustained_hbm_bandwidth)


def test_an_ops_bytes_split_into_reads_and_writes():
    from paxsearch.search.planning.roofline import cost, hlo

    text = """HloModule m, entry_computation_layout={()->()}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%upd (buf: bf16[64,1024], u: bf16[1,1024], i: s32[]) -> bf16[64,1024] {
  %buf = bf16[64,1024]{1,0} parameter(0)
  %u = bf16[1,1024]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = bf16[64,1024]{1,0} dynamic-update-slice(%buf, %u, %i, %z)
}

ENTRY %main (x: f32[4096,1024], buf: bf16[64,1024], u: bf16[1,1024], i: s32[]) -> (f32[4096], bf16[64,1024]) {
  %x = f32[4096,1024]{1,0} parameter(0)
  %buf = bf16[64,1024]{1,0} parameter(1)
  %u = bf16[1,1024]{1,0} parameter(2)
  %i = s32[] parameter(3)
  %zero = f32[] constant(0)
  %r = f32[4096]{0} reduce(%x, %zero), dimensions={1}, to_apply=%sum
  %f = bf16[64,1024]{1,0} fusion(%buf, %u, %i), kind=kLoop, calls=%upd
  ROOT %t = (f32[4096]{0}, bf16[64,1024]{1,0}) tuple(%r, %f)
}
"""
    module = hlo.parse_module(text)
    comp = module.computations[module.entry]
    assert cost.instr_read_write(module, comp, comp.by_name["r"]) == (4096 * 1024 * 4 + 4, 4096 * 4)
    # in place: the update (and its index) read, the update written; nothing of the buffer
    assert cost.instr_read_write(module, comp, comp.by_name["f"]) == (1024 * 2 + 4, 1024 * 2)
    for name in ("r", "f"):
        assert cost.instr_bytes(module, comp, comp.by_name[name]) == sum(
            cost.instr_read_write(module, comp, comp.by_name[name]))
    hw = hardware_for([], "v5e")
    assert cost.op_costs(module, comp, comp.by_name["r"], hw)[2] == pytest.approx(
        hw.hbm_seconds(4096 * 1024 * 4 + 4, 4096 * 4))
