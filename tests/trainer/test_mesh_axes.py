"""Mesh axes by name: (data, stage, fsdp, context, tensor, expert); a 3-entry shape still means
(data, fsdp, tensor), a 5-entry one (data, stage, fsdp, context, tensor); every axis sized in ICI
and DCN; static checks name the axis."""
import dataclasses

import jax
import pytest

from paxsearch.tests.trainer_util import tiny
from paxsearch.trainer import mesh as mesh_lib
from paxsearch.trainer import validate
from paxsearch.trainer.config import (
    MESH_AXES,
    MeshConfig,
    compact_shape,
    from_dict,
    full_shape,
    mesh_shape,
    to_dict,
)
from paxsearch.trainer.errors import ConfigError


def test_axes_by_name_expert_innermost():
    assert MESH_AXES == ("data", "stage", "fsdp", "context", "tensor", "expert")
    assert mesh_shape(stage=2, fsdp=-1) == (1, 2, -1, 1, 1)  # expert 1: the 5 entries of before the expert axis
    assert mesh_shape(expert=2, fsdp=4) == (1, 1, 4, 1, 1, 2)
    with pytest.raises(ValueError, match="unknown mesh axis experts"):
        mesh_shape(experts=2)


def test_three_entries_mean_data_fsdp_tensor():
    assert full_shape((2, 4, 1)) == (2, 1, 4, 1, 1, 1)
    assert full_shape((1, 2, 3, 4, 5)) == (1, 2, 3, 4, 5, 1)  # five entries: as before the expert axis
    assert full_shape((1, 2, 3, 4, 5, 6)) == (1, 2, 3, 4, 5, 6)
    assert compact_shape((2, 1, 4, 1, 1)) == (2, 4, 1)
    assert compact_shape((2, 1, 4, 1, 1, 1)) == (2, 4, 1)
    assert compact_shape((2, 2, 2, 1, 1)) == (2, 2, 2, 1, 1)  # a stage axis has no 3-entry form
    assert compact_shape((2, 2, 2, 1, 1, 1)) == (2, 2, 2, 1, 1)  # ... and expert 1 keeps its 5-entry form
    assert compact_shape((1, 1, 2, 1, 1, 4)) == (1, 1, 2, 1, 1, 4)
    assert mesh_lib.axis_sizes(MeshConfig(ici=(1, -1, 2), dcn=(2, 1, 1)), 16) == dict(
        data=2, stage=1, fsdp=4, context=1, tensor=2, expert=1)
    # the same mesh written over the five axes, and the six
    assert mesh_lib.axis_sizes(MeshConfig(ici=(1, 1, -1, 1, 2), dcn=(2, 1, 1, 1, 1)), 16) == dict(
        data=2, stage=1, fsdp=4, context=1, tensor=2, expert=1)
    assert mesh_lib.axis_sizes(MeshConfig(ici=(1, 1, -1, 1, 2, 1), dcn=(2, 1, 1, 1, 1, 1)), 16) == dict(
        data=2, stage=1, fsdp=4, context=1, tensor=2, expert=1)


def test_old_config_dict_reads_unchanged():
    """A dict exported before the named axes (3-entry lists) loads to the same mesh."""
    d = to_dict(tiny(ici=(2, 2, 2)))
    d["mesh"] = {"ici": [2, 2, 2], "dcn": [1, 1, 1], "rules": "default"}
    cfg = from_dict(d)
    assert cfg.mesh.ici == (2, 2, 2)
    assert mesh_lib.axis_sizes(cfg.mesh, 8) == dict(data=2, stage=1, fsdp=2, context=1, tensor=2, expert=1)


@pytest.mark.parametrize("ici,dcn,message", [
    ((1, 8), (1, 1, 1), "mesh shapes need 6 entries"),
    ((1, 1, 1, 1, 1, 1, 8), (1, 1, 1), "mesh shapes need 6 entries"),
    # a stage axis pipelines the layers (trainer/pipeline.py), which needs microbatches
    ((1, 2, 4, 1, 1), (1, 1, 1, 1, 1), "pipeline.microbatches=1 is not a multiple of stage=2"),
    ((1, 1, 4, 1, 1), (1, 2, 1, 1, 1), "pipeline.microbatches=1 is not a multiple of stage=2"),  # over DCN too
    # a context axis splits the sequence (trainer/context.py) into 2 x context chunks
    ((1, 1, 1, 8, 1), (1, 1, 1, 1, 1), "seq_len=72 does not split into 2 x context=16"),
    ((1, 1, 1, 4, 1), (1, 1, 1, 2, 1), "seq_len=72 does not split into 2 x context=16"),  # over DCN too
    ((1, 1, 3, 1, 1), (1, 1, 1, 1, 1), "has 3 devices but 8 are available"),
])
def test_bad_meshes_one_line(ici, dcn, message):
    model = dataclasses.replace(tiny().model, seq_len=72)  # 72 tokens: not 16 chunks
    with pytest.raises(ConfigError, match=message) as e:
        validate.check(tiny(ici=ici, dcn=dcn, model=model), 8, "cpu")
    assert "\n" not in str(e.value)


def test_context_axis_accepted_in_ici_and_dcn():
    for ici, dcn in (((1, 1, 4, 2, 1), (1, 1, 1, 1, 1)), ((1, 1, 4, 1, 1), (1, 1, 1, 2, 1))):
        validate.check(tiny(ici=ici, dcn=dcn), 8, "cpu")
        assert mesh_lib.axis_sizes(MeshConfig(ici=ici, dcn=dcn), 8)["context"] == 2


def test_mesh_built_over_six_named_axes():
    devices = jax.devices()
    mesh = mesh_lib.build_mesh(MeshConfig(ici=(2, 2, 2)), devices)
    assert mesh.axis_names == MESH_AXES
    assert dict(mesh.shape) == dict(data=2, stage=1, fsdp=2, context=1, tensor=2, expert=1)
    # DCN on every axis: one granule of simulated devices lays it out as outer factors
    mesh = mesh_lib.build_mesh(MeshConfig(ici=(1, 1, 2, 1, 2), dcn=(2, 1, 1, 1, 1)), devices)
    assert dict(mesh.shape) == dict(data=2, stage=1, fsdp=2, context=1, tensor=2, expert=1)
