"""Trainer runs that span processes: kill-and-resume from Orbax checkpoints, two hosts, the CLI."""
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from paxsearch.tests.trainer_util import tiny
from paxsearch.trainer.config import CheckpointConfig
from paxsearch.trainer.train import train

from ..search_util import in_process, refused

CONFIG_FILE = '''
import dataclasses
from paxsearch.tests.trainer_util import tiny

def config():
    cfg = tiny(steps={steps}, log_every=1)
    return dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, decay_steps=20))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _cfg_with_decay(steps, **kw):
    cfg = tiny(steps=steps, log_every=1, **kw)
    return dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, decay_steps=20))


@pytest.mark.slow  # a CLI train killed at step 10, then 20 steps twice
def test_killed_run_resumes_with_the_same_losses(tmp_path):
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(CONFIG_FILE.format(steps=400))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "paxsearch.search.cli", "train", str(cfg_file), "--run-dir", str(run_dir),
         "--checkpoint-every", "5"], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True)
    ckpt10 = run_dir / "checkpoints" / "10"
    deadline = time.time() + 300
    while not ckpt10.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt10.exists(), proc.stderr.read().decode()[-2000:]

    reference = {}
    train(_cfg_with_decay(20), report=lambda m: reference.__setitem__(m.step, m.loss))
    resumed = {}
    ckpt = CheckpointConfig(enabled=True, every_steps=5, keep=3)
    result = train(dataclasses.replace(_cfg_with_decay(20), run_dir=str(run_dir), checkpoint=ckpt),
                   report=lambda m: resumed.__setitem__(m.step, m.loss))
    assert 10 <= result.start_step < 20
    steps = sorted(resumed)
    assert steps[0] == result.start_step + 1 and steps[-1] == 20
    np.testing.assert_allclose([resumed[s] for s in steps], [reference[s] for s in steps], rtol=1e-5)


@pytest.mark.slow  # two jax.distributed processes and a reference train
def test_two_processes_match_one_process(tmp_path):
    port, out = _free_port(), tmp_path / "mp.json"
    procs = [subprocess.Popen([sys.executable, "-m", "paxsearch.tests.mp_train", str(i), "2", str(port), str(out)],
                              env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
    errs = [p.communicate(timeout=600)[1].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), errs[0][-3000:] + errs[1][-3000:]
    two = json.loads(out.read_text())
    assert two["mesh"] == {"data": 2, "stage": 1, "fsdp": 4, "context": 1, "tensor": 1}
    one = {}
    train(tiny(ici=(2, 4, 1)), report=lambda m: one.__setitem__(m.step, m.loss))
    np.testing.assert_allclose([two["losses"][str(s)] for s in (1, 2, 3)], [one[s] for s in (1, 2, 3)], rtol=1e-4)


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_tensorboard_scalars_readable_and_metrics_complete(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seen = []
    cfg = dataclasses.replace(tiny(steps=4, log_every=2), run_dir=str(tmp_path),
                              eval=dataclasses.replace(tiny().eval, enabled=True, max_batches=1))
    result = train(cfg, report=seen.append)
    final = seen[-1]
    for name, value in final.to_dict().items():
        assert value is not None and np.isfinite(value), name
    assert 0 < final.mfu < 1 and final.hfu > 0 and final.tokens_per_sec > 0
    assert final.compiled_peak_bytes == result.plan.peak_bytes > 0 and final.measured_peak_bytes > 0
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("train/loss", "train/mfu", "train/hfu", "train/tokens_per_sec", "train/learning_rate",
                "train/grad_norm", "train/param_norm", "train/measured_peak_bytes", "eval/loss"):
        assert tag in tags, tag
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 4]
    assert acc.Scalars("eval/loss")[-1].value == pytest.approx(result.eval_loss, rel=1e-6)


@pytest.mark.slow  # quick-loop budget (issue 18): a full compile or a whole CLI run; CI runs it
def test_cli_train_with_overrides_and_errors(tmp_path, capsys):
    """`paxsearch train` in this process (the command, not its process, is under test)."""
    cfg_file = tmp_path / "cfg.py"
    cfg_file.write_text(CONFIG_FILE.format(steps=3))
    args = ["train", cfg_file, "--run-dir", tmp_path / "r"]
    capsys.readouterr()
    code = in_process(*args, "--set", "model.d_model=32", "--steps", "2")
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "steps 0->2" in out and "MFU" in out
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert "32" in json.dumps(saved)
    refused(capsys, *args, words=("--resume",))
    assert refused(capsys, *args[:-1], tmp_path / "r2", "--set", "model.widht=3").startswith(
        "paxsearch: error: override 'model.widht': unknown field")
    refused(capsys, *args[:-1], tmp_path / "r3", "--set", "mesh.ici=(2,2,1)", words=("4 devices but 8 are available",))
