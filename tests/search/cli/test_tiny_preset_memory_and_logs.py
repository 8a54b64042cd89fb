"""Issue 21 §3: the README's preset example trains `llama-tiny`; `train` refuses in one line,
writing nothing, a config larger than a device's memory; third-party logs are quiet unless
--verbose; `run --dry-run` of a TPU space needs no libtpu."""
from __future__ import annotations

import os
import re
import shlex
import textwrap
from unittest import mock

import pytest

from paxsearch.search.study import configio
from paxsearch.trainer import presets

from ...search_util import REPO, cli, refused

README = os.path.join(REPO, "README.md")
LLAMA_PLAN = os.path.join(REPO, "spaces", "llama_plan.py")
# what TensorFlow, absl (seqio's and Orbax's Python logs) and glog-style native logs look like
NOISE = re.compile(r"absl|tensorflow|WARNING:|INFO:|^[IWE]\d{4} ")


def readme_tiny_command() -> list[str]:
    """The arguments of the README's `paxsearch train ... model=llama-tiny` example."""
    with open(README) as f:
        lines = [line.split("#")[0] for line in f if line.strip().startswith("paxsearch train")
                 and "model=llama-tiny" in line]
    assert lines, "the README shows no `paxsearch train` of llama-tiny"
    return shlex.split(lines[0])[1:]


def noise(stderr: str) -> list[str]:
    """Lines of stderr other than the progress bar's that look like a third-party log."""
    lines = re.split(r"[\r\n]+", stderr)
    return [line for line in lines if line.strip() and not line.startswith("train:") and NOISE.search(line)]


@pytest.fixture(scope="module")
def tiny_trained(tmp_path_factory):
    """The README's llama-tiny command, 2 steps, into a folder of its own."""
    run = tmp_path_factory.mktemp("llama_tiny") / "run"
    with mock.patch.dict(os.environ):
        os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as in a user's shell: the CLI's default decides
        proc = cli(*readme_tiny_command(), "--steps", "2", "--run-dir", run, timeout=600)
    return run, proc


@pytest.mark.slow  # a whole `paxsearch train` (imports, compiles, 2 steps, eval, checkpoint): ~40 s idle
def test_the_readme_preset_example_trains_llama_tiny(tiny_trained):
    run, proc = tiny_trained
    assert "steps 0->2" in proc.stdout and f"params {presets.source('llama-tiny').published_params:,}" in proc.stdout
    cfg = configio.build(configio.loads((run / "config.json").read_text()))
    assert cfg.model == presets.get("llama-tiny")
    assert any(p.name.isdigit() for p in (run / "checkpoints").iterdir())


@pytest.mark.slow
def test_third_party_logs_are_quiet_by_default(tiny_trained):
    _, proc = tiny_trained
    assert noise(proc.stderr) == [], proc.stderr[-3000:]


@pytest.mark.slow
def test_verbose_shows_third_party_logs(tmp_path, monkeypatch):
    """The same run with --verbose shows what the default hides (XLA's native start-up lines, e.g.
    PjRt's device count; no longer seqio's absl warning: the synthetic corpus needs no seqio), so
    the quiet run above is quiet because of the default, not by chance. Neither run inherits the
    session's TF_CPP_MIN_LOG_LEVEL (tests/conftest.py): the CLI sets it."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    proc = cli("--verbose", *readme_tiny_command(), "--steps", "1", "--run-dir", tmp_path / "run", timeout=600)
    assert any(re.match(r"^[IWE]\d{4} .*pjrt", line) for line in noise(proc.stderr)), proc.stderr[-3000:]


def test_no_config_needs_no_trial_and_names_its_folder_after_the_preset(capsys, tmp_path):
    from paxsearch.search.cli.train import default_run_dir

    assert default_run_dir(None, None, ["model=llama-tiny", "steps=3"]) == os.path.join("runs", "train-llama-tiny")
    assert default_run_dir(None, None, []) == os.path.join("runs", "train-default")
    refused(capsys, "train", "--trial", "3", "--run-dir", tmp_path / "x", words=("--trial needs the run folder",))
    assert not (tmp_path / "x").exists()


def test_device_memory_is_what_the_search_holds_a_cpu_trial_against():
    from paxsearch.search.cli.train import device_memory
    from paxsearch.search.trial.execute import default_memory_budget

    memory = device_memory()
    assert memory.bytes == default_memory_budget()[0]
    assert "host RAM" in memory.source and "8 local CPU devices" in memory.source


def _gib(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"([\d.]+) GiB", text)]


def test_parameters_and_moments_above_a_device_are_refused_before_compiling(capsys, tmp_path, tiny_config_file):
    """llama2-70b on the tiny config's data-parallel mesh: ~1 TiB of state per device. Refused
    analytically, in one line, with nothing written."""
    line = refused(capsys, "train", tiny_config_file, "--set", "model=llama2-70b", "--set", "model.seq_len=256",
                   "--run-dir",
                   tmp_path / "x", words=("does not fit a device here", "analytic, not compiled",
                                          "68,976,648,192 parameters", "host RAM"))
    need, limit = _gib(line)[:2]
    assert need > limit
    assert not (tmp_path / "x").exists()


def test_a_compiled_step_above_a_device_is_refused_before_anything_is_allocated(capsys, tmp_path,
                                                                                  tiny_config_file):
    """Small parameters (the analytic check passes) and a huge activation: 16 rows of 8192 tokens
    per device with the S x S attention scores in memory. XLA's memory analysis of the compiled
    step says tens of GiB per device; refused in one line before any array is made or any file
    written."""
    line = refused(capsys, "train", tiny_config_file, "--set", "model.seq_len=8192", "--set",
                   "model.attention='dot_product'", "--set", "per_device_batch=16", "--run-dir", tmp_path / "x",
                   words=("does not fit a device here", "compiled step needs", "XLA's memory analysis", "host RAM"))
    need, limit = _gib(line)[:2]
    assert need > limit
    assert not (tmp_path / "x").exists()


HIDE_LIBTPU = textwrap.dedent('''
    """libtpu not installed, as far as this interpreter can tell: no module spec, no distribution."""
    import sys


    class HideLibtpu:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, fullname, path=None, target=None):
            if fullname.split(".")[0] == "libtpu":
                return None
            find = getattr(self.finder, "find_spec", None)
            return find(fullname, path, target) if find else None

        def find_distributions(self, context=None):
            find = getattr(self.finder, "find_distributions", None)
            return (d for d in (find(context) if find else ()) if (d.metadata["Name"] or "").lower() != "libtpu")

        def __getattr__(self, name):
            return getattr(self.finder, name)


    sys.meta_path[:] = [HideLibtpu(f) for f in sys.meta_path]
''')


def test_a_dry_run_of_a_tpu_space_needs_no_libtpu(tmp_path):
    """The CLI in a subprocess whose import system finds no libtpu (a sitecustomize on PYTHONPATH):
    the dry run of spaces/llama_plan.py works and says a real run needs libtpu; a real run refuses
    in one line, as before."""
    (tmp_path / "sitecustomize.py").write_text(HIDE_LIBTPU)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    proc = cli("run", LLAMA_PLAN, "--dry-run", env=env, timeout=300)
    assert "libtpu is not installed" in proc.stdout and "96 point(s): 96 pass the static checks" in proc.stdout
    proc = cli("run", LLAMA_PLAN, "--trials", "1", "--run-dir", tmp_path / "run", env=env, check=False, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines == ["paxsearch: error: TPU targets need libtpu: pip install 'paxsearch[tpu]'"]
    assert not (tmp_path / "run").exists()
