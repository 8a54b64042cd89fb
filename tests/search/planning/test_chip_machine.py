"""What the project's v5e chip showed (benchmarks/RESULTS.md, on-chip benchmark): its machine
names the chip /dev/vfio/3, not /dev/vfio/0; libtpu 0.0.42.1 (that machine's) refuses a
compile-only one-chip slice unless told the host's chips; and one program at a time holds a
chip, so a worker slot keeps one gang started where trials run on attached chips."""
import dataclasses

import pytest

from paxsearch.search.planning import topology
from paxsearch.search.planning.targets import parse_target
from paxsearch.search.workers.pool import MAX_FLAG_SETS_PER_SLOT, gangs_kept

from ...search_util import needs_libtpu


@pytest.mark.parametrize("entries, attached", [
    ((), False), (("vfio/vfio",), False), (("vfio/vfio", "vfio/3"), True), (("vfio/0",), True),
    (("accel0",), True), (("accel",), False),
])
def test_tpu_hardware_is_an_accel_device_or_a_numbered_vfio_group(tmp_path, entries, attached):
    for entry in entries:
        (tmp_path / entry).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / entry).write_text("")
    assert topology.has_tpu_hardware(str(tmp_path)) is attached


@pytest.mark.parametrize("name, bounds", [("v5e-1", (1, 1, 1)), ("v5e-4", None), ("v5e-16", None),
                                          ("v5p-8", None), ("v6e-1", (1, 1, 1))])
def test_a_slice_smaller_than_a_host_names_its_host_bounds(name, bounds):
    assert topology.parse_slice(name).chips_per_host_bounds == bounds


@needs_libtpu
def test_a_one_chip_slice_has_compile_only_devices():
    devices = topology.topology_devices("v5e-1")
    assert len(devices) == 1 and devices[0].device_kind == "TPU v5 lite"


def test_one_gang_per_slot_on_attached_chips_two_elsewhere():
    plan_only = parse_target("tpu:v5e-1")
    assert plan_only.plan_only or topology.has_tpu_hardware()  # this machine has no chip
    on_chip = dataclasses.replace(plan_only, plan_only=False)
    assert gangs_kept(on_chip) == 1
    assert gangs_kept(dataclasses.replace(on_chip, plan_only=True)) == MAX_FLAG_SETS_PER_SLOT
    assert gangs_kept(parse_target("cpu:8")) == MAX_FLAG_SETS_PER_SLOT


def test_more_than_one_worker_on_attached_chips_is_one_line():
    from paxsearch.search.errors import UserError
    from paxsearch.search.workers.pool import check_chip_workers

    on_chip = dataclasses.replace(parse_target("tpu:v5e-1"), plan_only=False)
    check_chip_workers(on_chip, 1)
    check_chip_workers(dataclasses.replace(on_chip, plan_only=True), 4)  # plans compile side by side
    with pytest.raises(UserError, match=r"--workers 2 with target tpu:v5e-1 .* use --workers 1"):
        check_chip_workers(on_chip, 2)
