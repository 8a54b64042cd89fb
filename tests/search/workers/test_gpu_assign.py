"""`--workers K --target gpu:N`: each worker its own N GPUs by CUDA_VISIBLE_DEVICES, set in the
environment its processes start with; more than the visible GPUs is one line, nothing written."""
import json

import pytest

from paxsearch.search.planning.targets import parse_target
from paxsearch.search.workers import gpu_assign
from paxsearch.search.workers.pool import WorkerSlot

from ...search_util import TINY, cli


def test_visible_gpus_from_cuda_visible_devices():
    assert gpu_assign.visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1, 7"}) == ["3", "1", "7"]
    assert gpu_assign.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    uuids = "GPU-8f2c,GPU-11aa"
    assert gpu_assign.visible_gpus({"CUDA_VISIBLE_DEVICES": uuids}) == ["GPU-8f2c", "GPU-11aa"]


def test_eight_gpus_as_eight_one_gpu_or_two_four_gpu_workers():
    visible = [str(i) for i in range(8)]
    assert gpu_assign.assign(8, 1, 1, visible) == [[str(i)] for i in range(8)]
    assert gpu_assign.assign(2, 4, 4, visible) == [["0,1,2,3"], ["4,5,6,7"]]
    # a 4-GPU trial over 2 local processes: each process its own pair
    assert gpu_assign.assign(2, 4, 2, visible) == [["0,1", "2,3"], ["4,5", "6,7"]]
    assert gpu_assign.assign(1, 2, 2, ["5", "2", "7"]) == [["5,2"]]  # in CUDA_VISIBLE_DEVICES order
    with pytest.raises(gpu_assign.GpuAssignError, match="needs 12 GPUs and 8 are visible"):
        gpu_assign.assign(3, 4, 4, visible)
    with pytest.raises(gpu_assign.GpuAssignError, match="none are visible"):
        gpu_assign.assign(1, 1, 1, None)


def test_each_worker_process_starts_with_its_own_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    target = parse_target("gpu:2")
    plan = gpu_assign.for_target(target, workers=4, processes=2)
    envs = []
    for k in range(4):
        gang = WorkerSlot(target, 2, str(tmp_path), k, (), plan[k]).gang("default")
        base = gang.distributed_base(target.devices_per_process(2))
        envs.append([gang.process_env(i, 1, base) for i in gang.local_process_ids()])
    seen = [[e["CUDA_VISIBLE_DEVICES"] for e in per_worker] for per_worker in envs]
    assert seen == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    for per_worker in envs:  # and the jax.distributed settings each process of the worker gets
        ids = [json.loads(e["PAXSEARCH_WORKER"])["distributed"]["process_id"] for e in per_worker]
        assert ids == [0, 1]
        assert all("JAX_PLATFORMS" not in e for e in per_worker)  # the test's own =cpu is not passed on
    assert gpu_assign.for_target(parse_target("cpu:8"), 4, 1) is None


def test_too_many_gpus_is_one_line_and_nothing_written(tmp_path):
    run = tmp_path / "gpus"
    proc = cli("run", TINY, "--target", "gpu:4", "--workers", "3", "--run-dir", run, check=False,
               env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert err == ["paxsearch: error: --workers 3 x --target gpu:4 needs 12 GPUs and 8 are visible "
                   "(0,1,2,3,4,5,6,7); use --workers 2 or a smaller gpu:N"]
    assert not run.exists()
