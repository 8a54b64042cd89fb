"""`paxsearch run/worker/resume/ls`: one clear error line and exit 2 for bad input; --dry-run."""
import os
import textwrap

import pytest

from paxsearch.search import cli

from ...search_util import TINY


def run_cli(capsys, *args):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("paxsearch: error: ")
    return lines[0]


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "syntax.py").write_text("def space(:\n    pass\n")
    (tmp_path / "nofn.py").write_text("STUDY = {}\n")
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    (tmp_path / "empty.db").write_bytes(b"")  # an empty SQLite database: a worker never creates one
    return tmp_path


@pytest.mark.parametrize("args,expected", [
    (["run", "{tmp}/missing.py"], "does not exist"),
    (["run", "{tmp}/syntax.py"], "syntax.py:1: syntax error"),
    (["run", "{tmp}/nofn.py"], "has no space function"),
    (["run", TINY, "--set", "meshh=8x1x1"], "unknown decision 'meshh' in --set"),
    (["run", TINY, "--tuner", "sgd"], "unknown tuner 'sgd'"),
    (["run", TINY, "--pruner", "median"], "needs a single objective"),
    (["run", TINY, "--target", "cpu:4"], "no point of the space can run on cpu:4"),
    (["run", TINY, "--run-dir", "{tmp}/r", "--storage", "postgresql://ann:hunter2@127.0.0.1:1/db"],
     "cannot open storage postgresql://ann:***@127.0.0.1:1/db"),
    (["run", TINY, "--run-dir", "{tmp}/r", "--storage", "sqlite:///{tmp}/junk.db"], "storage"),
    (["run", TINY, "--objective", "speed"], "objectives"),
    (["run", TINY, "--objective", "mfu,speed"], "objectives ['mfu', 'speed']: choose distinct names"),
    (["run", TINY, "--objective", "mfu", "--objective", "mfu"], "choose distinct names"),
    (["worker", "--storage", "sqlite:///{tmp}/empty.db", "--study", "x"], "no study 'x'"),
    (["resume", "{tmp}/nowhere"], "does not exist"),
])
def test_errors_are_one_line(capsys, bad_files, args, expected):
    args = [a.replace("{tmp}", str(bad_files)) for a in args]
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    line = error_line(err)
    assert expected in line
    assert "hunter2" not in out + err


def test_dry_run_prints_space_size_and_static_feasibility(capsys, tmp_path):
    space = tmp_path / "s.py"
    space.write_text(textwrap.dedent("""
        import fiddle as fdl
        import pyglove as pg
        from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig
        def space():
            mesh = pg.oneof(["8x1x1", "1x1x8", "4x4x1"], name="mesh")
            return fdl.Config(TrainConfig, model=fdl.Config(ModelConfig, n_heads=4),
                              mesh=fdl.Config(MeshConfig, ici=tuple(int(x) for x in mesh.split("x"))),
                              per_device_batch=pg.oneof([1, 2], name="per_device_batch"))
    """))
    code, out, err = run_cli(capsys, "run", space, "--dry-run")
    assert code == 0, err
    assert "size: 6 point(s)" in out
    assert "6 point(s): 2 pass the static checks, 4 invalid" in out
    assert "n_heads=4 does not divide over tensor=8" in out
    assert "has 16 devices but 8 are available" in out
    assert not os.path.exists("runs/s")  # a dry run writes nothing


def test_ls_lists_nothing_gracefully(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "ls", tmp_path)
    assert code == 0 and "no run folders" in out


def test_objectives_repeat_or_take_a_comma_list():
    """`--objective mfu --objective memory,time_to_train` is three objectives, in that order; a
    repeated flag no longer keeps only its last value."""
    from paxsearch.search.cli.common import cli_settings
    from paxsearch.search.cli.main import build_parser

    def objectives(*flags):
        args = build_parser().parse_args(["run", TINY, *flags])
        return cli_settings(args, for_new=True)["objectives"]

    assert objectives("--objective", "mfu", "--objective", "memory,time_to_train") == ("mfu", "memory", "time_to_train")
    assert objectives("--objective", " mfu , memory ") == ("mfu", "memory")
    assert objectives() is None  # the study's default: loss, mfu, memory
