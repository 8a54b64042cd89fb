"""What a user with write access to shared storage cannot do: make paxsearch write or delete
where the storage says (report folders, study names as folders, paths in stored configs),
make it print a password, or make a refused command leave something half-written."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import string
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import optuna
import pytest

from paxsearch.analysis.staging import staged_into
from paxsearch.analysis.tensorboard import export_tensorboard
from paxsearch.store import urls
from paxsearch.store.paths import UnsafeFolderName, folder_name, sanitized_folder_name

from ...analysis.study_builder import grid_specs, make_run
from ...search_util import TINY, cli, in_process

optuna.logging.set_verbosity(optuna.logging.WARNING)


def paxsearch(*args, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    """`paxsearch ARGS` in a subprocess run in `cwd` (relative defaults such as runs/ land there)."""
    return subprocess.run([sys.executable, "-m", "paxsearch.search.cli", *map(str, args)], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def one_line_error(proc, *words, jax_started: bool = False) -> str:
    """Exit status 2 and one line `paxsearch: error: ...` (after JAX's own start-up log lines,
    when the refusal needed the devices)."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    if jax_started:
        lines = [line for line in lines if line.startswith("paxsearch") or "Traceback" in line]
    assert len(lines) == 1 and lines[0].startswith("paxsearch: error: "), proc.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def files_under(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


# ------------------------------------------------------------ 1. report writes where the user says

def _shared_study_pointing_at(tmp_path: Path) -> tuple[str, Path]:
    """The issue's reproduction: a copy of a run's study.db whose trial 0 says its trial_dir is
    victim/x/0, and a victim folder with a TensorBoard run of its own."""
    run = make_run(tmp_path / "a", grid_specs()[:4])
    shared = tmp_path / "shared.db"
    shutil.copy(run / "study.db", shared)
    victim = tmp_path / "victim"
    (victim / "tensorboard" / "trial_99").mkdir(parents=True)
    (victim / "tensorboard" / "trial_99" / "f").write_text("keep me")
    with sqlite3.connect(shared) as db:
        db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE key = 'trial_dir' AND trial_id = "
                   "(SELECT trial_id FROM trials WHERE number = 0)", (json.dumps(str(victim / "x" / "0")),))
    return f"sqlite:///{shared}", victim


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_report_of_a_storage_url_never_writes_or_deletes_where_the_storage_says(tmp_path):
    url, victim = _shared_study_pointing_at(tmp_path)
    before = files_under(victim)
    work = tmp_path / "work"
    work.mkdir()

    proc = paxsearch("report", url, "--study", "sweep", "--out", tmp_path / "out", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "report.html").exists() and (tmp_path / "out" / "trials.csv").exists()
    assert (tmp_path / "out" / "tensorboard" / "trial_0").is_dir()
    assert files_under(victim) == before  # nothing written there, trial_99 kept

    # without --out: a folder named from the command line, under runs/ of the working folder
    proc = paxsearch("report", url, "--study", "sweep", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "runs" / "report-sweep" / "report.html").exists()
    assert files_under(victim) == before
    assert not list(tmp_path.glob(".*tmp-*")) and not list((work / "runs").glob(".*tmp-*"))


def test_report_of_a_storage_url_without_out_or_study_is_one_line(tmp_path):
    url, victim = _shared_study_pointing_at(tmp_path)
    before = files_under(victim)
    proc = paxsearch("report", url, cwd=tmp_path)
    one_line_error(proc, "--out")
    assert not (tmp_path / "runs").exists() and files_under(victim) == before


def test_report_study_name_from_the_command_line_is_one_plain_folder(tmp_path):
    assert sanitized_folder_name("../../etc") == "_.._etc"
    assert sanitized_folder_name("/abs/x") == "_abs_x"
    assert sanitized_folder_name("..") == "study" and sanitized_folder_name("") == "study"
    assert sanitized_folder_name("mesh_sweep-2.1") == "mesh_sweep-2.1"


def test_a_failed_write_leaves_the_output_as_it_was(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "report.html").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_into(out) as root:
            (root / "report.html").write_text("new")
            (root / "report").mkdir()
            raise RuntimeError("the report failed midway")
    assert (out / "report.html").read_text() == "old" and not (out / "report").exists()
    assert [p.name for p in out.iterdir()] == ["report.html"]
    with pytest.raises(RuntimeError):
        with staged_into(tmp_path / "fresh") as root:
            (root / "report.html").write_text("new")
            raise RuntimeError("the report failed midway")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no new folder, no temporary one


def test_a_failed_tensorboard_export_keeps_the_earlier_one(tmp_path):
    run = make_run(tmp_path / "run", grid_specs()[:4], with_tensorboard=True)
    logdir = export_tensorboard(run)
    before = files_under(logdir)
    assert "trial_0" in before
    (run / "trials" / "1" / "tb" / "dangling").symlink_to(tmp_path / "nowhere")  # copytree fails on it
    with pytest.raises(OSError):
        export_tensorboard(run)
    assert files_under(logdir) == before
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_trainer_scalars_are_never_read_from_a_folder_the_storage_names(tmp_path):
    url, victim = _shared_study_pointing_at(tmp_path)
    for tb in (victim / "x" / "0" / "tb", victim / "trials" / "0" / "tb"):  # the stored trial_dir, its run folder
        tb.mkdir(parents=True)
        (tb / "secret.txt").write_text("private")
    logdir = export_tensorboard(url, tmp_path / "tb", study_name="sweep")
    assert (logdir / "trial_0").is_dir() and not list(logdir.rglob("secret.txt"))


# ------------------------------------------------------------ 2. a study name is never a path

@pytest.mark.parametrize("name", ["", ".", "..", "../x", "/abs/x", "a/b", "a\\b", "a\x00b"])
def test_unsafe_study_names_are_refused_as_folder_names(name):
    with pytest.raises(UnsafeFolderName):
        folder_name(name)
    assert folder_name("mesh_sweep") == "mesh_sweep"


def _study_named(url: str, name: str, tmp_path: Path) -> None:
    """A paxsearch study whose space file is not on this machine; its stored copy does not load."""
    from paxsearch.search.driver.context import check_settings, study_attrs
    from paxsearch.search.study.space import load_space

    space = load_space(TINY)
    study = optuna.create_study(study_name=name, storage=url, directions=space.settings.directions)
    for key, value in study_attrs(space, space.settings, check_settings(space.settings, space)).items():
        study.set_user_attr(key, value)
    study.set_user_attr("space_file", str(tmp_path / "gone" / "tiny_space.py"))
    study.set_user_attr("space_source", "this is not python (\n")


@pytest.mark.parametrize("name", ["../../escape", "ABS"])
def test_worker_never_runs_outside_runs_for_a_study_name_from_storage(tmp_path, name):
    name = str(tmp_path / "escape") if name == "ABS" else name
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _study_named(url, name, tmp_path)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    proc = paxsearch("worker", "--storage", url, "--study", name, "--trials", "1", "--no-progress",
                     "--trust-stored-space", cwd=work)
    one_line_error(proc, "--run-dir")
    assert not (tmp_path / "escape").exists() and not (work / "runs").exists()


def test_the_stored_space_copy_never_overwrites_run_folder_files():
    from paxsearch.search.driver.context import stored_space_name

    assert stored_space_name("/elsewhere/tiny_space.py") == "tiny_space.py"
    for stored in ("/x/study.db", "/x/study.json", "/x/..", "", None, "/x/.hidden.py"):
        assert stored_space_name(stored) == "space.py"


def test_train_of_a_stored_trial_writes_only_where_the_user_says(tmp_path):
    from paxsearch.search.cli.main import build_parser
    from paxsearch.search.cli.train import without_stored_paths
    from paxsearch.trainer.config import CheckpointConfig, TrainConfig

    stored = TrainConfig(run_dir=str(tmp_path / "victim"), checkpoint=CheckpointConfig(directory="/victim/ckpt"))
    args = build_parser().parse_args(["train", str(tmp_path), "--trial", "0"])
    cfg = without_stored_paths(stored, args)
    assert cfg.run_dir is None and cfg.checkpoint.directory is None
    args = build_parser().parse_args(["train", str(tmp_path), "--trial", "0", "--set", "checkpoint.directory=/mine"])
    overridden = TrainConfig(run_dir=str(tmp_path / "victim"), checkpoint=CheckpointConfig(directory="/mine"))
    cfg = without_stored_paths(overridden, args)  # the user's own --set is kept, the stored run_dir is not
    assert cfg.checkpoint.directory == "/mine" and cfg.run_dir is None
    args = build_parser().parse_args(["train", str(tmp_path / "cfg.json")])
    assert without_stored_paths(stored, args) == stored  # the user's own file


# ------------------------------------------------------------ 3. passwords are never printed

SECRET = "SECRETTAIL"
RAW = f"postgresql://u:ab@cd:{SECRET}@127.0.0.1:5432/test"  # the URL: a raw password with @ and :
AMBIGUOUS = f"postgresql://u:ab@cd/x?{SECRET}@127.0.0.1:5432/test"  # read two ways: refused


def test_a_raw_password_with_at_and_colon_is_read_or_refused_never_echoed():
    parsed = urls.parse_url(RAW)
    assert (parsed.username, parsed.password, parsed.host, parsed.port) == ("u", f"ab@cd:{SECRET}", "127.0.0.1", 5432)
    with pytest.raises(urls.StorageUrlError) as e:
        urls.parse_url(AMBIGUOUS)
    assert SECRET not in str(e.value) and "URL-encode" in str(e.value) and "PGPASSWORD" in str(e.value)
    for url in (RAW, AMBIGUOUS):
        assert SECRET not in str(urls.mask_url(url))
        assert SECRET not in urls.scrub(f"failed: {url} ({SECRET}@127.0.0.1:5432)", url)


def test_url_encoded_passwords_of_any_printable_character_work():
    password = string.printable.strip()
    url = f"postgresql://u:{quote(password, safe='')}@127.0.0.1:5432/test"
    assert urls.parse_url(url).password == password
    assert urls.parse_url(urls.driver_url(url)).password == password
    assert password not in urls.mask_url(url) and "***" in urls.mask_url(url)


@pytest.mark.parametrize("command", [["ls", "--storage"], ["best"], ["worker", "--no-progress", "--storage"]])
@pytest.mark.parametrize("through_env", [False, True])
def test_cli_never_prints_a_password_it_cannot_read(tmp_path, command, through_env):
    env = {"PAXSEARCH_TEST_URL": AMBIGUOUS} if through_env else {}
    storage = "env:PAXSEARCH_TEST_URL" if through_env else AMBIGUOUS
    proc = paxsearch(*command, storage, cwd=tmp_path, env=env)
    line = one_line_error(proc, "URL-encode")
    assert SECRET not in proc.stdout + proc.stderr, line
    assert not list(tmp_path.iterdir())


@pytest.mark.postgres
def test_cli_reads_a_raw_password_with_at_and_colon_never_printing_it(tmp_path):
    """PostgreSQL trust auth accepts any password: the URL parses, connects, and its password
    is shown masked only; a database that does not exist is one line, masked too."""
    pytest.importorskip("psycopg2")
    good = f"postgresql://postgres:ab@cd:{SECRET}@127.0.0.1:5432/test"
    proc = paxsearch("ls", "--storage", good, cwd=tmp_path)
    if proc.returncode != 0 and "Connection refused" in proc.stderr:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432")
    assert proc.returncode == 0 and SECRET not in proc.stdout + proc.stderr, proc.stderr
    proc = paxsearch("worker", "--storage", good.replace("/test", "/no_such_db_paxsearch"), cwd=tmp_path,
                     env={"PAXSEARCH_TEST_URL": good})
    one_line_error(proc)
    assert SECRET not in proc.stdout + proc.stderr


# ------------------------------------------------------------ 4. a refused command writes nothing

def test_worker_on_a_missing_sqlite_file_creates_nothing(tmp_path):
    proc = paxsearch("worker", "--storage", "sqlite:///missing/study.db", "--no-progress", cwd=tmp_path)
    one_line_error(proc, "no such SQLite file")
    assert not list(tmp_path.iterdir())
    proc = paxsearch("ls", "--storage", "sqlite:///missing/study.db", cwd=tmp_path)
    one_line_error(proc, "no such SQLite file")
    assert not list(tmp_path.iterdir())


TRAIN_CONFIG = '''
import fiddle as fdl
from paxsearch.trainer.config import EvalConfig, LogConfig, MeshConfig, ModelConfig, TrainConfig


def config():
    return fdl.Config(
        TrainConfig,
        model=fdl.Config(ModelConfig, d_model=32, n_layers=1, n_heads=2, head_dim=16, d_ff=64, seq_len=32,
                         scan_layers=False),
        mesh=fdl.Config(MeshConfig, ici=(8, 1, 1)),
        per_device_batch=1, steps=2,
        eval=fdl.Config(EvalConfig, enabled=False),
        log=fdl.Config(LogConfig, every_steps=1),
    )
'''


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_a_refused_train_resume_leaves_the_run_folder_as_it_was(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(TRAIN_CONFIG)
    run = tmp_path / "run"
    # the first train in this process (its process is not the point); the refused resume in its
    # own, as --cpu-devices 4 must start JAX with 4 devices
    assert in_process("train", path, "--run-dir", run, "--steps", "2", "--checkpoint-every", "1") == 0
    before = files_under(run)
    env_text = (run / "env.json").read_text()
    proc = cli("train", path, "--run-dir", run, "--resume", "--steps", "3", "--cpu-devices", "4", check=False,
               timeout=600)
    one_line_error(proc, "8 devices", "4", jax_started=True)
    assert (run / "env.json").read_text() == env_text
    assert files_under(run) == before


def test_a_plan_cache_folder_from_storage_never_chooses_where_a_worker_writes(tmp_path):
    from paxsearch.search.driver.context import reopen

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    _study_named(url, "shared", tmp_path)
    study = optuna.load_study(study_name="shared", storage=url)
    study.set_user_attr("space_source", Path(TINY).read_text())
    study.set_user_attr("settings", {**study.user_attrs["settings"], "plan_cache": str(tmp_path / "victim")})
    ctx = reopen(url, "shared", str(tmp_path / "run"), {}, trust_stored_space=True)
    assert ctx.settings.plan_cache == "on"  # this machine's own folder, never the stored one
    study.set_user_attr("settings", {**study.user_attrs["settings"], "plan_cache": "off"})
    assert reopen(url, "shared", str(tmp_path / "run"), {}, trust_stored_space=True).settings.plan_cache == "off"
