"""One line, non-zero exit and no traceback for what the user's filesystem does (issue 22,
defects 5 and 9): a run folder that is a file or lies under one, a read-only or full
filesystem, space files that are not regular files, too large, not UTF-8 or exit at import;
a report on a full disk leaves no half-written output; a corrupt latest Orbax checkpoint under
`train --resume` falls back to the newest good step, or is refused in one line.

Read-only and full filesystems are real ones: a small tmpfs mounted in a user and mount
namespace of the command's own (`unshare -rm`), so the test holds for root, whom permission
bits do not stop. Where this machine forbids such namespaces the test is skipped, saying so."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ...analysis.study_builder import grid_specs, make_run
from ...search_util import REPO, TINY, refused
from ...space_factory import write_config


def error_lines(proc) -> list[str]:
    """The paxsearch lines of a subprocess's stderr, after checking it holds no traceback of ours."""
    assert "paxsearch/search" not in proc.stderr or "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("paxsearch")]


# ------------------------------------------------------------------ space files (defect 9)

def test_a_device_or_fifo_as_space_file_is_one_line_without_reading(tmp_path):
    fifo = tmp_path / "space.py"
    os.mkfifo(fifo)
    for path in ("/dev/zero", fifo):
        proc = subprocess.run([sys.executable, "-m", "paxsearch.search.cli", "run", str(path), "--dry-run"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert error_lines(proc) == [f"paxsearch: error: space file '{path}' is not a regular file (a device, "
                                     "FIFO or socket); pass a space file on disk"]


def test_space_files_too_large_not_utf8_or_exiting_are_one_line(capsys, tmp_path):
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(17 * 2**20)  # sparse: nothing is really written
    refused(capsys, "run", big, "--dry-run", words=("big.py", "bytes"))
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# caf\xe9\ndef space():\n    pass\n")
    refused(capsys, "run", latin, "--dry-run", words=("latin.py:1", "not UTF-8", "0xe9"))
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\n")
    refused(capsys, "run", exits, "--dry-run", words=("exits.py", "sys.exit(0)"))
    nul = tmp_path / "nul.py"
    nul.write_bytes(b"x = 1\x00\n")
    refused(capsys, "run", nul, "--dry-run", words=("nul.py",))


# ------------------------------------------------------------------ run folders (defect 5)

def test_a_run_folder_that_is_a_file_or_under_one_is_one_line(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    refused(capsys, "run", TINY, "--run-dir", afile, words=("is a file",))
    refused(capsys, "run", TINY, "--run-dir", afile / "sub", words=("lies under", "afile"))
    refused(capsys, "run", TINY, "--run-dir", tmp_path / "run", "--storage", f"sqlite:///{afile}/s.db",
            words=("afile", "is a file"))
    assert afile.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def _unshare_ok() -> str | None:
    if not shutil.which("unshare"):
        return "no unshare(1) here"
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"user+mount namespaces are not allowed here ({probe.stderr.strip()})"


def in_small_fs(mount: Path, options: str, *args, after: str = "", timeout=600) -> subprocess.CompletedProcess:
    """`paxsearch ARGS` with a tmpfs (`options`, e.g. size=8k or ro) mounted at `mount`, in a
    namespace of its own (the mount is gone when the command ends); `after`, a shell command
    run in that namespace once paxsearch ended (its exit status is kept)."""
    why = _unshare_ok()
    if why:
        pytest.skip(why)
    mount.mkdir(parents=True, exist_ok=True)
    cmd = " ".join(shlex.quote(str(a)) for a in [sys.executable, "-m", "paxsearch.search.cli", *args])
    script = f"mount -t tmpfs -o {options} tmpfs {mount} && {{ {cmd}; rc=$?; {after} exit $rc; }}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", script],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_a_new_run_folder_on_a_read_only_filesystem_is_one_line(tmp_path):
    ro = tmp_path / "ro"
    proc = in_small_fs(ro, "size=64k,ro", "run", TINY, "--run-dir", ro / "run", "--no-progress")
    assert proc.returncode == 2 and error_lines(proc) == [
        f"paxsearch: error: run folder '{ro / 'run'}' is on a read-only filesystem; pass another --run-dir"], \
        proc.stderr[-2000:]


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_a_full_disk_under_run_is_one_line_naming_the_file(tmp_path):
    """The study lives elsewhere; the run folder's disk fills at the first trial's config.json.
    The trial in flight is marked interrupted and queued again (issue 22), not left RUNNING
    until the next `resume`."""
    import optuna
    from optuna.trial import TrialState

    full = tmp_path / "full"
    proc = in_small_fs(full, "size=4k", "run", TINY, "--run-dir", full / "run", "--storage",
                       f"sqlite:///{tmp_path}/study.db", "--trials", "1", "--no-progress")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert error_lines(proc) == [f"paxsearch: error: No space left on device: {full}/run/trials/0/config.json; "
                                 "free some space or use a --run-dir on another disk"], proc.stderr[-3000:]
    trials = optuna.load_study(study_name="tiny_space", storage=f"sqlite:///{tmp_path}/study.db").get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs["failure_kind"] == "interrupted" and trials[0].user_attrs["superseded"] is True
    assert "No space left on device" in trials[0].user_attrs["failure_message"]
    assert trials[1].user_attrs["requeued_from"] == 0


def test_a_report_on_a_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path):
    run = make_run(tmp_path / "a", grid_specs()[:6])
    out = tmp_path / "full"
    proc = in_small_fs(out, "size=12k", "report", run, "--out", out / "report", "--no-tensorboard",
                       after=f"echo LISTING; ls -A {out};")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = error_lines(proc)
    assert len(lines) == 1 and "No space left on device" in lines[0], proc.stderr[-3000:]
    assert proc.stdout.split("LISTING")[-1].split() == []  # no report/, no temporary folder left behind


# ------------------------------------------------------------------ checkpoints (defect 5)

def _garble(step_dir: Path) -> None:
    for path in step_dir.rglob("*"):
        if path.is_file() and path.parent.name == "d":  # the array data files of an OCDBT checkpoint
            path.write_bytes(os.urandom(64))


@pytest.mark.slow
def test_a_corrupt_latest_checkpoint_falls_back_to_the_newest_good_step(tmp_path):
    config = write_config(tmp_path / "tiny.py")
    run = tmp_path / "run"
    train = [sys.executable, "-m", "paxsearch.search.cli", "train", config, "--run-dir", str(run)]
    subprocess.run(train + ["--steps", "2", "--checkpoint-every", "1"], cwd=REPO, check=True, capture_output=True)
    shutil.copytree(run, tmp_path / "copy")
    _garble(run / "checkpoints" / "2")

    proc = subprocess.run(train + ["--steps", "3", "--resume"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "could not be read" in proc.stderr and "resuming from step 1" in proc.stderr, proc.stderr[-3000:]
    assert "steps 1->3" in proc.stdout
    assert "Event loop is closed" not in proc.stderr, proc.stderr[-3000:]  # the abandoned reads of step 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["1", "2.unreadable", "3"]

    copy = tmp_path / "copy"
    for step in ("1", "2"):
        _garble(copy / "checkpoints" / step)
    proc = subprocess.run([*train[:-1], str(copy), "--steps", "3", "--resume"], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = error_lines(proc)
    assert len(lines) == 1 and "no checkpoint in" in lines[0] and "can be read" in lines[0], proc.stderr[-3000:]
    assert proc.stderr.strip() == lines[0]  # only that line: no tracebacks of the reads a failed restore left
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["1", "2"]  # nothing moved when none is good
