"""Mesh decisions over named axes (search/study/meshes.py): every factorization of a device
count, turned into a full shape over (data, stage, fsdp, context, tensor)."""
import math

import pytest

from paxsearch.search import factorizations, mesh_of
from paxsearch.trainer import mesh as mesh_lib
from paxsearch.trainer.config import MeshConfig


def test_factorizations_over_the_old_axes_keep_mesh_sweeps_order():
    old = [f"{d}x{f}x{t}" for d in (1, 2, 4, 8) for f in (1, 2, 4, 8) for t in (1, 2, 4, 8) if d * f * t == 8]
    assert factorizations(8) == old  # the sweep's decision values (and their order) are unchanged


@pytest.mark.parametrize("devices,axes", [
    (8, ("stage", "fsdp", "tensor")), (16, ("data", "stage", "fsdp", "context", "tensor")), (12, ("stage", "fsdp"))])
def test_every_factorization_once_and_each_fills_the_devices(devices, axes):
    meshes = factorizations(devices, axes)
    assert len(set(meshes)) == len(meshes)
    # the count of ordered factorizations of n into k factors, counted independently
    count = sum(1 for _ in _ordered(devices, len(axes)))
    assert len(meshes) == count
    for text in meshes:
        shape = mesh_of(text, axes)
        assert math.prod(shape) == devices
        sizes = mesh_lib.axis_sizes(MeshConfig(ici=shape), devices)
        assert [sizes[a] for a in axes] == [int(x) for x in text.split("x")]


def _ordered(n, k):
    if k == 1:
        yield (n,)
        return
    for d in range(1, n + 1):
        if n % d == 0:
            for rest in _ordered(n // d, k - 1):
                yield (d, *rest)


def test_limits_and_bad_axes():
    meshes = factorizations(8, ("stage", "fsdp"), limits={"stage": (1, 2)})
    assert meshes == ["1x8", "2x4"]
    assert mesh_of("2x4", ("stage", "fsdp")) == (1, 2, 4, 1, 1)
    with pytest.raises(ValueError, match="must be distinct names among data, stage, fsdp, context, tensor"):
        factorizations(8, ("data", "pipeline"))
    with pytest.raises(ValueError, match="has 2 sizes for the 3 axes"):
        mesh_of("2x4", ("data", "fsdp", "tensor"))


def test_pipeline_space_searches_stage_microbatches_and_schedule(cli, tmp_path):
    """spaces/pipeline_sweep.py: stage (in the mesh decision), microbatches and schedule are
    decisions; every point the constraint keeps passes the static checks."""
    out = cli("run", "spaces/pipeline_sweep.py", "--dry-run", "--run-dir", tmp_path / "run").stdout
    assert "mesh: one of 1x1x8, 1x2x4" in out and "4x2x1" in out
    assert "microbatches: one of 4, 8" in out and "schedule: one of gpipe, circular" in out
    assert "23 point(s): 23 pass the static checks, 0 invalid" in out


def test_context_space_searches_context_sizes(cli, tmp_path):
    """spaces/context_sweep.py: the context size is part of the mesh decision; the one point
    whose chunks do not hold whole attention blocks is refused by the static checks."""
    out = cli("run", "spaces/context_sweep.py", "--dry-run", "--run-dir", tmp_path / "run").stdout
    assert "mesh: one of 1x1x8, 1x2x4" in out and "8x1x1" in out and "attention: one of dot_product, flash" in out
    assert "18 point(s): 17 pass the static checks, 1 invalid" in out
    assert "invalid  mesh=8x1x1 attention=flash  (blockwise attention with context=8" in out
