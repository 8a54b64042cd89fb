"""Host offload priced on the chip's PCIe link (search/planning/roofline/host.py): the roofline finds the
compiled step's transfers to and from host memory, counts the bytes the offloaded activations
make, prices them at the chip's host bandwidth per direction, and the schedule replay exposes
what the step does not hide."""
import dataclasses
import re

import pytest

from paxsearch.search.planning import hlo_passes, topology
from paxsearch.search.planning import roofline as R
from paxsearch.search.planning.predict import hardware_for
from paxsearch.trainer import hardware
from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, TrainConfig

from ..search_util import needs_libtpu

MODEL = ModelConfig(vocab_size=4096, d_model=1024, n_layers=4, n_heads=8, head_dim=128, d_ff=4096, seq_len=2048,
                    dtype="bfloat16")
ROWS = 2  # per device


@pytest.fixture(scope="module")
def v5e_8():
    return topology.topology_devices("v5e-8")


@pytest.fixture(scope="module")
def offload_hlo(v5e_8):
    return _hlo(v5e_8, "custom:decoder_input=offload,query_proj=offload")


def _hlo(devices, remat: str) -> str:
    cfg = TrainConfig(model=MODEL, mesh=MeshConfig(ici=(1, 8, 1)), per_device_batch=ROWS, remat=remat,
                      eval=EvalConfig(enabled=False))
    text = hlo_passes.build_plan_program(cfg, devices, "v5e-8").plan.hlo_text
    assert text
    return text


@needs_libtpu
def test_offloaded_activations_move_over_the_host_link_both_ways(v5e_8, offload_hlo):
    hw = hardware_for(v5e_8)
    assert hw.host_bandwidth == hardware.spec("v5e").host_bandwidth.value == 1.5e10
    roof = R.analyze(offload_hlo, hw, num_devices=8)
    host = [c for c in roof.collectives if c.link == "host"]
    d2h = sum(c.bytes_per_execution * c.executions for c in host if c.kind == "host-d2h")
    h2d = sum(c.bytes_per_execution * c.executions for c in host if c.kind == "host-h2d")
    # the layer input [rows, seq, d_model] and the query [rows, seq, heads, head_dim], bf16, every layer
    expected = 2 * ROWS * MODEL.seq_len * (MODEL.d_model + MODEL.n_heads * MODEL.head_dim) * MODEL.n_layers
    assert d2h == expected and h2d == expected
    assert sum(c.seconds for c in host) == pytest.approx((d2h + h2d) / 1.5e10)
    exposed = sum(c.exposed_s for c in host)
    assert 0 <= exposed <= sum(c.seconds for c in host)
    unpriced = R.analyze(offload_hlo, dataclasses.replace(hw, host_bandwidth=None), num_devices=8)
    assert not [c for c in unpriced.collectives if c.link == "host"]
    assert roof.step_time_s == pytest.approx(unpriced.step_time_s + exposed, rel=1e-6)


@needs_libtpu
def test_a_step_without_offload_moves_nothing_to_the_host(v5e_8):
    roof = R.analyze(_hlo(v5e_8, "full"), hardware_for(v5e_8), num_devices=8)
    assert not [c for c in roof.collectives if c.link == "host"]


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
@needs_libtpu
def test_the_collective_pipeliner_round_trips_two_offloaded_stacks_and_its_set_stops_it(monkeypatch):
    """libtpu 0.0.52, layer input and attention output both offloaded: the collective pipeliner
    makes the compiler copy both whole [layers, rows, seq, d_model] stacks from host memory to HBM
    and back between the forward and the backward (v6e, v5p, v4; not v5e); with the set
    `no_collective_pipeliner` no such copy is made, and the host link carries less."""
    from paxsearch.trainer import flagsets

    devices = topology.topology_devices("v6e-8")
    stack = re.compile(rf"bf16\[{MODEL.n_layers},{ROWS},{MODEL.seq_len},{MODEL.d_model}\]")
    copies, host_s, trips = {}, {}, {}
    for name in ("default", "no_collective_pipeliner"):
        for key, value in flagsets.env_for(name, "tpu").items():
            monkeypatch.setenv(key, value)
        cfg = TrainConfig(model=dataclasses.replace(MODEL, attention="flash"), mesh=MeshConfig(ici=(1, 8, 1)),
                          per_device_batch=ROWS, remat="custom:decoder_input=offload,out_proj=offload", flags=name,
                          eval=EvalConfig(enabled=False))
        text = hlo_passes.build_plan_program(cfg, devices, "v6e-8").plan.hlo_text
        copies[name] = sum(1 for line in text.splitlines()
                           if " copy-start(" in line and stack.search(line.split(" copy-start(")[0]))
        roof = R.analyze(text, hardware_for(devices), num_devices=8)
        host_s[name] = sum(c.seconds for c in roof.collectives if c.link == "host")
        trips[name] = (roof.host_round_trips, roof.host_round_trip_bytes, roof.to_dict()["host_round_trips"])
    assert copies == {"default": 4, "no_collective_pipeliner": 0}
    # the roofline names them: two stacks, each whole once per step, each way
    stack_bytes = MODEL.n_layers * ROWS * MODEL.seq_len * MODEL.d_model * 2
    assert trips == {"default": (2, 2 * stack_bytes, 2), "no_collective_pipeliner": (0, 0.0, 0)}
    assert 0 < host_s["no_collective_pipeliner"] < host_s["default"]
