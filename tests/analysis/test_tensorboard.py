"""export_tensorboard, read back with TensorBoard's own HParams backend and event reader."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paxsearch.analysis import export_tensorboard, load

from .study_builder import SPACE, grid_specs, make_run

# Runs in a child process: TensorBoard's readers load TensorFlow when it is installed, which
# is slow; the child uses TensorBoard's supported TF-free mode (tensorboard.compat.notf),
# without touching the test process.
READER = textwrap.dedent("""
    import json, sys, types
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import (api_pb2, backend_context, get_experiment,
                                             list_session_groups)
    from tensorboard.util import tensor_util

    logdir = sys.argv[1]
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    hparams = backend_context.Context(
        base_plugin.TBContext(logdir=logdir, data_provider=provider, multiplexer=mux))
    request = context.RequestContext()
    experiment = get_experiment.Handler(request, hparams, "",
                                        api_pb2.GetExperimentRequest()).run()
    groups = list_session_groups.Handler(request, hparams, "", api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=100000,
        allowed_statuses=[api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE,
                          api_pb2.STATUS_RUNNING, api_pb2.STATUS_UNKNOWN])).run()
    result = {"hparams": [h.name for h in experiment.hparam_infos],
              "metrics": [m.name.tag for m in experiment.metric_infos], "groups": {}}
    for group in groups.session_groups:
        result["groups"][group.name] = {
            "hparams": {k: getattr(v, v.WhichOneof("kind")) for k, v in group.hparams.items()},
            "metrics": {m.name.tag: m.value for m in group.metric_values},
            "status": [s.status for s in group.sessions]}
    trainer = EventAccumulator(logdir + "/trial_0")
    trainer.Reload()
    result["trial_0_tags"] = sorted(trainer.Tags()["tensors"])
    result["trial_0_train_loss"] = [float(tensor_util.make_ndarray(e.tensor_proto))
                                    for e in trainer.Tensors("train/loss")]
    print(json.dumps(result))
""")


def read_back(logdir: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", READER, str(logdir)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    specs = grid_specs()[:16]
    run = make_run(tmp_path_factory.mktemp("tb") / "run", specs, with_tensorboard=True)
    logdir = export_tensorboard(run)
    return run, logdir, load.load_trials(run), read_back(logdir)


def test_every_completed_trial_has_hparams_and_metrics(exported):
    run, logdir, frame, seen = exported
    assert logdir == run / "tensorboard"
    assert sorted(seen["hparams"]) == sorted(SPACE)
    assert {"score/loss", "score/mfu", "score/memory_bytes"} <= set(seen["metrics"])
    completed = frame[frame["state"] == "COMPLETE"]
    assert len(completed) > 0
    for row in completed.to_dict("records"):
        group = seen["groups"][f"trial_{row['number']}"]
        assert group["status"] == [1]  # STATUS_SUCCESS
        assert group["hparams"]["mesh"] == row["d.mesh"]
        assert group["hparams"]["per_device_batch"] == row["d.per_device_batch"]
        metrics = group["metrics"]
        assert metrics["score/loss"] == pytest.approx(row["loss"], rel=1e-6)
        assert metrics["score/mfu"] == pytest.approx(row["mfu"], rel=1e-6)
        assert metrics["score/memory_bytes"] == pytest.approx(row["memory_bytes"], rel=1e-6)


def test_failed_trials_are_sessions_with_failure_status(exported):
    _, _, frame, seen = exported
    failed = frame[frame["state"] == "FAIL"]
    assert len(failed) > 0
    for number in failed["number"]:
        group = seen["groups"][f"trial_{number}"]
        assert group["status"] == [2]  # STATUS_FAILURE
        assert "score/mfu" not in group["metrics"]
    assert len(seen["groups"]) == len(frame)


def test_trainer_scalars_are_copied_into_the_trial_run(exported):
    _, _, frame, seen = exported
    assert {"train/loss", "train/mfu", "score/loss"} <= set(seen["trial_0_tags"])
    assert seen["trial_0_train_loss"] == pytest.approx([frame.loc[0, "loss"] + 0.1,
                                                        frame.loc[0, "loss"] + 0.05])


def test_export_again_replaces_previous_runs(exported, tmp_path):
    run, logdir, _, _ = exported
    files_before = sorted(p.name for p in logdir.rglob("events.out.tfevents.*"))
    export_tensorboard(run)
    files_after = sorted(p.name for p in logdir.rglob("events.out.tfevents.*"))
    assert len(files_after) == len(files_before)


def test_analysis_imports_neither_tensorflow_nor_jax_nor_the_trainer(tmp_path):
    run = make_run(tmp_path / "run", grid_specs()[:3])
    code = ("import sys; from paxsearch.analysis import export_tensorboard, best_trial; "
            f"export_tensorboard({str(run)!r}); best_trial({str(run)!r}, 'knee'); "
            "print(sorted(m for m in ('tensorflow', 'jax', 'paxsearch.trainer') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
