"""tests/ installs as paxsearch.tests: every folder of tests is a package listed in
pyproject.toml, and the helper entry points keep their module paths. The trainer imports nothing
of the rest of paxsearch (imports run one way: search -> planning -> trainer)."""
import os
import re
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


def _imported_modules(path: str, package: str) -> list[str]:
    """The absolute names of the modules a file imports (relative imports resolved from `package`)."""
    import ast

    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[:max(len(parts) - (node.level - 1), 0)] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            names.append(stem)
            names += [f"{stem}.{a.name}" for a in node.names]  # `from paxsearch import search`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # code handed to a child interpreter (python -c ...): its imports count too
            names += re.findall(r"(?:^|[;\n]\s*)(?:from|import)\s+(paxsearch(?:\.\w+)*)", node.value)
    return names


def test_the_trainer_imports_nothing_of_paxsearch_but_itself():
    """Imports run one way, search -> planning -> trainer: trainer/ is the training runtime and names
    no other paxsearch package (not the planner, nor search/, store/, analysis/), in any module, by
    relative or absolute import, or in code it hands a child interpreter."""
    trainer = os.path.join(REPO, "trainer")
    offending = []
    for root, dirs, files in os.walk(trainer):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__"))]
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, REPO)
            package = "paxsearch." + os.path.relpath(root, REPO).replace(os.sep, ".")
            for module in _imported_modules(path, package):
                if (module == "paxsearch" or module.startswith("paxsearch.")) and not (
                        module == "paxsearch.trainer" or module.startswith("paxsearch.trainer.")):
                    offending.append(f"{rel}: {module}")
    assert not offending, "trainer/ imports outside itself:\n" + "\n".join(offending)


def test_the_trainer_runs_without_the_rest_of_paxsearch():
    """The training runtime's entry points import with every other paxsearch package made unimportable."""
    code = ("import sys\n"
            "class Blocked:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.startswith(('paxsearch.search', 'paxsearch.store', 'paxsearch.analysis',\n"
            "                            'paxsearch.spaces')):\n"
            "            raise ImportError(f'blocked: {name}')\n"
            "sys.meta_path.insert(0, Blocked())\n"
            "import paxsearch.trainer.train, paxsearch.trainer.plan, paxsearch.trainer.flagsets\n"
            "import paxsearch.trainer.hardware, paxsearch.trainer.validate\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
