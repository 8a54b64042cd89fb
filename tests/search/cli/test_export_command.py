"""`paxsearch export RUN --trial ... --to maxtext|maxtext-yaml|paxml` on a stored study (real
SQLite study in the run-folder layout; the trials store their config_dict as the driver does)."""
from __future__ import annotations

import dataclasses
import json

import optuna
import pytest

from paxsearch.search import cli
from paxsearch.trainer import presets
from paxsearch.trainer.config import MeshConfig, TrainConfig, mesh_shape, to_dict

optuna.logging.set_verbosity(optuna.logging.WARNING)


CHIP = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}


def config(**kw) -> TrainConfig:
    model = presets.replace("llama2-7b", n_layers=2, d_model=128, n_heads=2, head_dim=64, d_ff=256, seq_len=128,
                            vocab_size=512)
    return TrainConfig(**{"model": model, "mesh": MeshConfig(ici=mesh_shape(fsdp=-1)), "per_device_batch": 2,
                          "remat": "full", **kw})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Trial 0: planned for tpu:v5e-4, the best MFU; trial 1: learned positions (MaxText refuses it)."""
    path = tmp_path_factory.mktemp("export_run")
    storage = f"sqlite:///{path / 'study.db'}"
    study = optuna.create_study(study_name="exp", storage=storage, directions=["minimize", "maximize", "minimize"])
    study.set_user_attr("objectives", [{"name": n, "direction": d} for n, d in
                                       (("loss", "minimize"), ("mfu", "maximize"), ("memory", "minimize"))])
    study.set_user_attr("target", "tpu:v5e-4")
    learned = config(model=dataclasses.replace(config().model, position="learned"))
    planned = {"plan_target": "tpu:v5e-4", "plan": {"peak_bytes": 10**9, "compiler": CHIP}}
    for cfg, values, attrs in [(config(), [2.0, 0.5, 1e9], planned),
                               (learned, [2.0, 0.1, 1e9], {})]:
        study.add_trial(optuna.trial.create_trial(
            values=values, user_attrs={"config": "{}", "config_dict": to_dict(cfg), **attrs}))
    (path / "study.json").write_text(json.dumps({"study_name": "exp", "storage": storage}))
    return path


def export(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(["export", *map(str, argv)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_maxtext_best_trial(run, capsys):
    rc, out, err = export(capsys, run, "--trial", "mfu", "--to", "maxtext")
    assert rc == 0, err
    # the plan's compiler: a plan is only as good as the compiler it was made with
    assert "study exp, trial 0, target tpu:v5e-4; planned with jax 0.10.2, jaxlib 0.10.2, libtpu 0.0.42.1\n" in out
    assert "ici_fsdp_parallelism=4" in out and "per_device_batch_size=2" in out and "remat_policy=full" in out
    assert "compile_topology=v5e-4" in out
    assert "paxsearch: dropped data.task=" in err  # what the script drops is said on stderr too


def test_a_chosen_topology_names_the_slice_for_maxtext_and_says_how_to_create_it(run, capsys):
    rc, out, err = export(capsys, run, "--trial", "0", "--to", "maxtext", "--target", "tpu:v5p-1024@4x8x16")
    assert rc == 0, err
    assert "compile_topology=v5p-1024 " in out and "@" not in out.split("compile_topology=")[1].split()[0]
    assert "target tpu:v5p-1024@4x8x16" in out and "--topology=4x8x16" in out
    assert "ici_fsdp_parallelism=512" in out


def test_out_file_yaml_and_paxml(run, capsys, tmp_path):
    rc, out, err = export(capsys, run, "--trial", "0", "--to", "maxtext-yaml", "--out", tmp_path / "o.yml")
    assert rc == 0 and out == "" and "written to" in err
    assert "ici_fsdp_parallelism: 4" in (tmp_path / "o.yml").read_text()
    rc, out, _ = export(capsys, run, "--trial", "0", "--to", "paxml", "--target", "tpu:v5e-8")
    assert rc == 0 and "ICI_MESH_SHAPE = [1, 8, 1]" in out  # --target re-resolves the fsdp -1


def test_refusal_is_one_line(run, capsys, tmp_path):
    rc, out, err = export(capsys, run, "--trial", "1", "--to", "maxtext", "--out", tmp_path / "x.sh")
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and "position='learned'" in lines[0], err
    assert not (tmp_path / "x.sh").exists()
    rc, _, err = export(capsys, run, "--trial", "7", "--to", "paxml")
    assert rc == 2 and "no trial 7" in err
    rc, _, err = export(capsys, run, "--trial", "fastest", "--to", "paxml")
    assert rc == 2 and "'fastest'" in err
