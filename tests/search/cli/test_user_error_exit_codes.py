"""One user-error hierarchy: every error of the search layer that is the user's to fix derives
from search.errors.UserError, and cli.main alone maps them (and the trainer's ConfigError /
DataError) to exit status 2 with one line."""
import pytest

from paxsearch.search import cli
from paxsearch.search.driver.context import SetupError
from paxsearch.search.driver.loop import DriverError
from paxsearch.search.errors import UserError
from paxsearch.search.planning.targets import TargetError
from paxsearch.search.study.configio import ConfigFileError
from paxsearch.search.study.settings import SettingsError
from paxsearch.search.study.space import SpaceError
from paxsearch.search.study.storage import StorageError
from paxsearch.search.study.user_imports import ImportFailed
from paxsearch.search.tuning.tuners import TunerError

from ...search_util import TINY
from ...search_util import cli as run_cli


@pytest.mark.parametrize("cls", [ConfigFileError, DriverError, SettingsError, SpaceError, StorageError, SetupError,
                                 TargetError, TunerError, ImportFailed])
def test_search_errors_are_user_errors(cls):
    assert issubclass(cls, UserError)


def test_main_maps_a_search_error_to_exit_2(tmp_path, capsys):
    assert cli.main(["run", str(tmp_path / "missing_space.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("paxsearch: error: ") and "missing_space.py" in err[0]


def test_main_maps_a_trainer_config_error_to_exit_2(tmp_path, tiny_config_file):
    """train's unknown compiler flag set is the trainer's ConfigError, reaching main unwrapped."""
    path = tiny_config_file
    proc = run_cli("train", path, "--set", "flags=no_such_set", "--run-dir", tmp_path / "run", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "no_such_set" in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_run_with_a_bad_setting_is_one_line(tmp_path):
    proc = run_cli("run", TINY, "--run-dir", tmp_path / "run", "--tuner", "nosuch", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "unknown tuner 'nosuch'" in lines[0], proc.stderr
