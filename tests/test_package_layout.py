"""tests/ installs as paxsearch.tests: every folder of tests is a package listed in
pyproject.toml, and the helper entry points keep their module paths."""
import os
import subprocess
import sys
import tomllib

from .search_util import HERE, REPO


def test_every_test_folder_is_a_listed_package():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    folders = []
    for root, dirs, files in os.walk(HERE):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        if any(name.startswith("test_") and name.endswith(".py") for name in files):
            folders.append(os.path.relpath(root, HERE))
    assert len(folders) > 10, folders
    for rel in folders:
        assert os.path.exists(os.path.join(HERE, rel, "__init__.py")), f"tests/{rel} has no __init__.py"
        name = "paxsearch.tests" + ("" if rel == "." else "." + rel.replace(os.sep, "."))
        assert name in listed, f"{name} is missing from pyproject.toml [tool.setuptools] packages"


def test_helper_entry_points_run_as_modules():
    """`python -m paxsearch.tests.fault_driver` (search_util.cli's fault seam) still runs."""
    out = subprocess.run([sys.executable, "-m", "paxsearch.tests.fault_driver", "0:nan", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "run" in out.stdout, out.stderr[-2000:]
