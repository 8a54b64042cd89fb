"""Space files, settings and storage URLs: fast unit tests (no JAX run)."""
import math
import os
import textwrap

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from paxsearch.search.study import storage
from paxsearch.search.study.settings import SettingsError, StudySettings, parse_bytes
from paxsearch.search.study.space import SpaceError, load_space
from paxsearch.search.tuning import tuners

from ...search_util import REPO, TINY

MESH_SWEEP = os.path.join(REPO, "spaces", "mesh_sweep.py")
MODEL_SIZE = os.path.join(REPO, "spaces", "model_size.py")


def write(tmp_path, text, name="s.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


SPACE = """
import fiddle as fdl
import pyglove as pg
from paxsearch.search.study.space import intv
from paxsearch.trainer.config import MeshConfig, ModelConfig, OptimizerConfig, TrainConfig
STUDY = dict(trials=5, objectives=["mfu"], memory_budget="1GiB")

def constraint(d):
    return not (d["mesh"] == "1x8x1" and d["layers"] == 3)

def space():
    mesh = pg.oneof(["8x1x1", "1x8x1"], name="mesh")
    return fdl.Config(TrainConfig,
        model=fdl.Config(ModelConfig, n_layers=intv(1, 3, name="layers")),
        mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in mesh.split("x"))),
        optimizer=fdl.Config(OptimizerConfig, peak_lr=pg.floatv(1e-4, 1e-2, scale="log", name="lr")))
"""


def test_space_decisions_settings_and_configs(tmp_path):
    space = load_space(write(tmp_path, SPACE))
    assert [d.name for d in space.decisions] == ["mesh", "layers", "lr"]
    assert [d.kind for d in space.decisions] == ["choice", "int", "float"]
    assert space.settings.trials == 5 and space.settings.objectives == ("mfu",)
    assert space.settings.memory_budget == 2**30
    assert not space.finite and space.size() is None
    cfg = space.config({"mesh": "1x8x1", "layers": 2, "lr": 0.005})
    assert cfg.mesh.ici == (1, 8, 1) and cfg.model.n_layers == 2 and cfg.optimizer.peak_lr == 0.005
    assert space.excluded({"mesh": "1x8x1", "layers": 3, "lr": 0.001})
    dists = tuners.distributions(space)
    assert dists["mesh"] == CategoricalDistribution(["8x1x1", "1x8x1"])
    assert dists["layers"] == IntDistribution(1, 3)
    assert dists["lr"] == FloatDistribution(1e-4, 1e-2, log=True)
    point = {"mesh": "8x1x1", "layers": 3, "lr": 0.001}
    assert space.from_dna(space.to_dna(point)) == point


def test_set_fixes_decisions_and_overrides_fields(tmp_path):
    space = load_space(write(tmp_path, SPACE))
    space.apply_sets(["mesh=1x8x1", "lr=0.002", "steps=7", "model.d_model=64"])
    assert [d.name for d in space.decisions] == ["layers"]
    assert space.finite and space.size() == 2  # layers 1, 2 (3 excluded with 1x8x1)
    cfg = space.config({"layers": 1})
    assert cfg.mesh.ici == (1, 8, 1) and cfg.steps == 7 and cfg.model.d_model == 64
    with pytest.raises(SpaceError, match="unknown decision 'meshh'"):
        space.apply_sets(["meshh=8x1x1"])
    with pytest.raises(SpaceError, match="not one of its values"):
        space.apply_sets(["mesh=4x4x1"])


@pytest.mark.parametrize("text,match", [
    ("def space(:\n  pass\n", r"s.py:1: syntax error"),
    ("x = 1\n", "has no space function"),
    ("import pyglove as pg\ndef space():\n    return pg.oneof([1, 2])\n", "cannot trace"),
    ("import pyglove as pg\ndef space():\n    return pg.oneof([(1, 2)], name='m')\n", "JSON scalars"),
    ("STUDY = dict(tuner='sgd')\ndef space():\n    pass\n", "unknown tuner 'sgd'"),
    ("STUDY = dict(budget=3)\ndef space():\n    pass\n", "unknown setting"),
])
def test_space_file_errors(tmp_path, text, match):
    with pytest.raises(SpaceError, match=match):
        load_space(write(tmp_path, text))


def test_missing_space_file(tmp_path):
    with pytest.raises(SpaceError, match="does not exist"):
        load_space(str(tmp_path / "nope.py"))


def test_shipped_spaces_trace_without_devices():
    sweep = load_space(MESH_SWEEP)
    assert [d.name for d in sweep.decisions] == ["mesh", "model_size", "attention", "rules", "per_device_batch",
                                                 "remat", "flags"]
    meshes = sweep.decision("mesh").values
    assert len(meshes) == 10 and all(math.prod(map(int, m.split("x"))) == 8 for m in meshes)
    assert sweep.size() == 1080 and sweep.settings.trials >= 12 and sweep.settings.tokens == 8192
    size = load_space(MODEL_SIZE)
    assert {d.kind for d in size.decisions} == {"choice", "int", "float"}
    assert load_space(TINY).size() == 6


def test_settings_parse():
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("1.5GB") == 1_500_000_000 and parse_bytes(1000) == 1000
    with pytest.raises(SettingsError):
        parse_bytes("lots")
    s = StudySettings().replace(objectives=("mfu",), trials=3)
    assert s.directions == ["maximize"]
    with pytest.raises(SettingsError, match="objectives"):
        StudySettings().replace(objectives=("speed",))
    # evolution is single-objective: several objectives are refused, not silently cut to the first
    with pytest.raises(SettingsError, match="tuner evolution optimizes one objective.*--objective NAME"):
        StudySettings().replace(tuner="evolution")
    assert StudySettings().replace(tuner="evolution", objectives=("mfu",)).tuner == "evolution"
    assert StudySettings().plan_compile == "passes"
    assert StudySettings().replace(plan_compile="full").plan_compile == "full"
    with pytest.raises(SettingsError, match="plan_compile='all' must be one of passes, full"):
        StudySettings().replace(plan_compile="all")


def test_storage_urls_never_show_passwords():
    url = "postgresql://bob:s3cret@db.example:5432/studies"
    assert storage.mask_url(url) == "postgresql://bob:***@db.example:5432/studies"
    assert "s3cret" not in storage.scrub(f"failed to connect to {url} (password s3cret)", url)
    with pytest.raises(storage.StorageError) as e:
        storage.open_storage("postgresql://bob:s3cret@127.0.0.1:1/none")
    assert "s3cret" not in str(e.value) and "***" in str(e.value)


def test_a_space_file_of_the_flat_layout_names_the_new_import(tmp_path):
    """Space files written before search/ had rooms import paxsearch.search.space: one line with the fix."""
    old = tmp_path / "old_space.py"
    old.write_text("from paxsearch.search.space import preset\n\ndef space():\n    return preset('llama3-8b')\n")
    with pytest.raises(SpaceError, match="import intv and preset from paxsearch.search") as e:
        load_space(str(old))
    assert "\n" not in str(e.value)
    new = tmp_path / "new_space.py"
    new.write_text("import pyglove as pg\nfrom paxsearch.search import preset\n\n"
                   "def space():\n    return preset('llama3-8b', n_layers=pg.oneof([1, 2], name='layers'))\n")
    assert load_space(str(new)).size() == 2
