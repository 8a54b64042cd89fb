"""trainer/hardware.py: one table of hardware figures keyed by device kind, every figure
with its source, and the modules that use a figure reading it from there (flops' peak,
topology's chips, the planner's roofline hardware). Needs no accelerator and no libtpu."""
import dataclasses
import types

import pytest

from paxsearch.search.planning import targets as T
from paxsearch.search.planning import topology
from paxsearch.search.planning.predict import hardware_for
from paxsearch.trainer import flops, hardware

# what each kind of source says about the number: a document, or how it was obtained
SOURCE_KINDS = ("https://", "measured:", "estimate:", "assumption:", "model:", "one TensorCore", "2 TensorCores",
                "a GPU is one JAX device")
# tables of measured rates: each row its own Figure (checked below)
META_FIELDS = {"name", "platform", "device_kinds", "kind_excludes", "attention_rates", "attention_grid", "index_rates",
               "unsorted_index", "ragged_rates", "megablox_rates", "vpu_cycles",
               "attention_in_step", "attention_step_grid", "dma_overlap"}


@pytest.mark.parametrize("entry", list(hardware.TABLE.values()), ids=list(hardware.TABLE))
def test_every_figure_of_every_entry_has_a_source(entry):
    # optional figures (clock_hz: TPUs only) are a Figure or absent, never a bare number
    numbers = [f.name for f in dataclasses.fields(entry)
               if f.name not in META_FIELDS and getattr(entry, f.name) is not None]
    assert set(entry.figures()) == set(numbers), "a figure stored as a bare number has no source"
    for name, figure in entry.figures().items():
        assert isinstance(figure.value, (int, float)) and figure.value > 0, (entry.name, name)
        assert figure.source.strip() and any(k in figure.source for k in SOURCE_KINDS), (entry.name, name)
    for rate in (entry.attention_rates or ()) + (entry.attention_grid or ()) + (entry.attention_step_grid or ()):
        assert 0 < rate.share.value <= 1 and rate.share.source.startswith("measured"), (entry.name, rate)
    for row in entry.index_rates or ():
        assert 0 < row.seconds.value < 1e-6 and row.seconds.source.startswith("measured"), (entry.name, row)
    for kind, factor in entry.unsorted_index or ():
        assert factor.value >= 1 and factor.source.startswith("measured"), (entry.name, kind)
    for r in (entry.ragged_rates or ()) + (entry.megablox_rates or ()):
        assert all(0 < f.value <= 1 and f.source.startswith("measured") for f in (r.forward, r.backward)), r
    for kind, figure in (entry.vpu_cycles or ()) + (entry.attention_in_step or ()):
        assert figure.value > 0 and figure.source.startswith("measured"), (entry.name, kind)
    assert entry.hbm_usable_bytes.value <= entry.hbm_bytes.value * 1.01
    assert entry.sources() and all(entry.sources())


def test_the_table_holds_every_device_kind_the_old_tables_held():
    assert {"v4", "v5e", "v5p", "v6e", "a100", "h100", "h200"} <= set(hardware.TABLE)
    assert {e.platform for e in hardware.TABLE.values()} == {"tpu", "gpu"}


@pytest.mark.parametrize("kind, name", [
    ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("tpu v6e", "v6e"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
])
def test_device_kinds_jax_reports_resolve_to_their_entry(kind, name):
    assert hardware.spec_for_device_kind(kind) is hardware.TABLE[name]
    assert hardware.find_device_kind(kind) is hardware.TABLE[name]


@pytest.mark.parametrize("kind", ["TPU v9", "TPU v4 lite", "TPU v5 lite pro", "NVIDIA H100 PCIe",
                                  "NVIDIA A100-PCIE-40GB", "NVIDIA H100 NVL", "cpu", ""])
def test_unknown_device_kinds_fail_with_one_clear_line(kind):
    assert hardware.find_device_kind(kind) is None
    with pytest.raises(hardware.UnknownDeviceKind) as e:
        hardware.spec_for_device_kind(kind)
    msg = str(e.value)
    assert "\n" not in msg and repr(kind) in msg and "TPU v5 lite" in msg and "trainer/hardware.py" in msg
    with pytest.raises(hardware.UnknownDeviceKind):
        flops.peak_flops_per_device(kind, "gpu")


def test_unknown_entry_names_fail_with_the_known_names():
    with pytest.raises(hardware.UnknownDeviceKind, match="entries: v4, v5e, v5p, v6e, a100, h100, h200"):
        hardware.spec("v9")


@pytest.mark.parametrize("entry", list(hardware.TABLE.values()), ids=list(hardware.TABLE))
def test_peak_flops_per_device_is_the_table_figure(entry):
    for kind in entry.device_kinds:
        peak, source = flops.peak_flops_per_device(kind, entry.platform)
        assert peak == entry.peak_bf16_flops.value
        assert entry.peak_bf16_flops.source in source
    assert flops.peak_flops_per_device("TPU v5 lite", "tpu")[0] == hardware.TABLE["v5e"].peak_bf16_flops.value == 197e12


def test_a_cpu_has_no_table_entry_and_its_peak_is_measured():
    peak, source = flops.peak_flops_per_device("cpu", "cpu", 8)
    assert peak > 0 and source.startswith("measured CPU")


@pytest.mark.parametrize("name", ["v4", "v5e", "v5p", "v6e"])
def test_topology_chips_are_views_of_the_table(name):
    entry, chip = hardware.TABLE[name], topology.CHIPS[name]
    assert chip.device_kinds == entry.device_kinds
    assert chip.peak_bf16_flops == entry.peak_bf16_flops.value
    assert chip.hbm_bytes == int(entry.hbm_usable_bytes.value) == topology.HBM_USABLE[name]
    assert chip.hbm_bytes_nominal == int(entry.hbm_bytes.value)
    assert (chip.hbm_bandwidth, chip.ici_bandwidth_per_chip, chip.dcn_bandwidth_per_chip) == (
        entry.hbm_bandwidth.value, entry.ici_bandwidth.value, entry.dcn_bandwidth.value)
    assert (chip.ici_ports, chip.torus_dims, chip.cores_per_chip) == (
        entry.ici_ports.value, entry.torus_dims.value, entry.cores_per_chip.value)
    assert chip.ici_link_bandwidth == entry.ici_link_bandwidth
    assert set(chip.sources) == set(entry.sources())
    assert topology.chip_for_device_kind(entry.device_kinds[0]) is chip
    assert T.parse_target(f"tpu:{name}-{8 * chip.cores_per_chip}").hbm_bytes_per_device == chip.hbm_bytes


def _expected(entry) -> dict:
    expected = {"name": entry.name, "peak_flops": entry.peak_bf16_flops.value,
                "hbm_bandwidth": entry.hbm_bandwidth.value, "ici_link_bandwidth": entry.ici_link_bandwidth,
                "dcn_bandwidth": entry.dcn_bandwidth.value, "physical_dims": entry.torus_dims.value}
    expected.update(ici_latency_s=entry.ici_latency_s.value, dcn_latency_s=entry.dcn_latency_s.value,
                    matmul_efficiency=entry.matmul_efficiency.value, hbm_efficiency=entry.hbm_efficiency.value,
                    ici_efficiency=entry.ici_efficiency.value)
    return expected


@pytest.mark.parametrize("name", ["v4", "v5e", "v5p", "v6e"])
def test_planner_hardware_of_a_tpu_target_comes_from_the_table(name):
    target = T.parse_target(f"tpu:{name}-{8 * topology.CHIPS[name].cores_per_chip}")
    hw = hardware_for([], target.chip)
    for field, value in _expected(hardware.TABLE[name]).items():
        assert getattr(hw, field) == value, field


@pytest.mark.parametrize("kind, name", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA A100-SXM4-80GB", "a100")])
def test_planner_hardware_of_a_gpu_comes_from_the_table(kind, name):
    gpu = types.SimpleNamespace(device_kind=kind, platform="gpu", process_index=0)  # what hardware_for reads
    hw = hardware_for([gpu] * 8)
    for field, value in _expected(hardware.TABLE[name]).items():
        assert getattr(hw, field) == value, field
    assert hw.ici_link_bandwidth == hardware.TABLE[name].ici_bandwidth.value / 4  # one ring, one direction


def test_collectives_run_at_a_measured_share_of_the_links():
    """NVIDIA's expected NCCL bus bandwidth on 8 x H100 over NVLink is 360 GB/s; the ring model gives
    2 x NVLink / 4 = 450 GB/s, so an H100 / H200 ring collective is priced at 0.8 of it, A100 at H100's
    share (said so). TPUs: the share of one link XLA's transfers were measured to sustain (v5e an
    AllGather, v5p and v6e a ppermute's slope), v4 v5e's (said so); tests/roofline/test_ici_efficiency.py
    checks each against the planner's price of the measured program."""
    for name in ("h100", "h200"):
        entry = hardware.TABLE[name]
        assert entry.ici_efficiency.value == pytest.approx(360e9 / (2 * entry.ici_bandwidth.value / 4))
        assert "nccl-tests/issues/326" in entry.ici_efficiency.source and "360 GB/s" in entry.ici_efficiency.source
    assert hardware.TABLE["a100"].ici_efficiency.source.startswith("assumption")
    link = {name: hardware.TABLE[name].ici_link_bandwidth for name in ("v5e", "v5p", "v6e")}
    assert hardware.TABLE["v5e"].ici_efficiency.value == pytest.approx(0.95 * 45e9 / link["v5e"], abs=5e-4)
    assert hardware.TABLE["v5p"].ici_efficiency.value == pytest.approx(86.3e9 / link["v5p"], abs=5e-4)
    assert hardware.TABLE["v6e"].ici_efficiency.value == pytest.approx(86.8e9 / link["v6e"], abs=5e-4)
    for name in ("v5e", "v5p", "v6e"):
        assert hardware.TABLE[name].ici_efficiency.source.startswith("measured:")
    v4 = hardware.TABLE["v4"].ici_efficiency
    assert v4.source.startswith("assumption") and v4.value == hardware.TABLE["v5e"].ici_efficiency.value


def test_latencies_are_passed_to_the_planner_hardware():
    entry = hardware.TABLE["v5p"]
    hw = hardware_for([], T.parse_target("tpu:v5p-16").chip)
    assert hw.peak_flops == 459e12 and hw.physical_dims == 3
    assert (hw.ici_latency_s, hw.dcn_latency_s) == (entry.ici_latency_s.value, entry.dcn_latency_s.value) \
        == (1e-6, 20e-6)


def test_matmul_efficiency_is_a_measured_share_of_peak_with_its_measurement():
    # v5e: the chip's own, its steps' matmul fusions as profiled (the published isolated figure named beside it)
    v5e = hardware.TABLE["v5e"].matmul_efficiency
    assert v5e.value == 0.88 and v5e.source.startswith("measured:") and "chip_profile_v5e_2026-12-07.json" in v5e.source
    assert "181.8 TFLOP/s" in v5e.source and "pallas/tpu/matmul" in v5e.source
    for name in ("v4", "v5p"):  # no measurement of their own: said so, and the published v5e figure
        figure = hardware.TABLE[name].matmul_efficiency
        assert figure.source.startswith("assumption:") and "181.8 TFLOP/s" in figure.source
        assert figure.value == round(181.8e12 / hardware.TABLE["v5e"].peak_bf16_flops.value, 3) == 0.923
    # v6e: its own measurement (device-timed 8192^3 matmul: 1510.94 us); the compiler's estimate, 70.4%, is named
    v6e = hardware.TABLE["v6e"].matmul_efficiency
    assert v6e.source.startswith("measured:") and "1510.94 us" in v6e.source and "results_trace_test.csv" in v6e.source
    assert round(2 * 8192 ** 3 / 1510.94e-6 / hardware.TABLE["v6e"].peak_bf16_flops.value, 3) == v6e.value  # 0.793
    for name, tflops in (("a100", 271.2), ("h100", 794.5), ("h200", 794.5)):
        entry = hardware.TABLE[name]
        assert entry.matmul_efficiency.value == round(tflops * 1e12 / entry.peak_bf16_flops.value, 3)
        assert str(tflops) in entry.matmul_efficiency.source and "ml-engineering" in entry.matmul_efficiency.source
    cpu = types.SimpleNamespace(device_kind="cpu", platform="cpu", process_index=0)
    assert hardware_for([cpu]).matmul_efficiency == 1.0  # a measured peak already
