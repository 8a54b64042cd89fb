"""Export a study as one TensorBoard log directory with HParams data.

Layout (default RUN/tensorboard/):
  events.out.tfevents.*        the HParams experiment: decisions as hparams, scores as metrics
  trial_<n>/                   one run per trial: a copy of RUN/trials/<n>/tb/ (the trainer's
                               own scalars, e.g. train/loss) plus an event file with the
                               trial's hparams (session start/end) and its final scores under
                               score/<name> and plan/<name>.
Events are written with TensorBoard's protos and record writer only, so TensorFlow is never
imported.
"""
from __future__ import annotations

import math
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pandas as pd
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2, summary_v2
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.summary.writer.record_writer import RecordWriter

from .load import Source, decision_columns, open_study, study_info, trials_frame
from .staging import staged_into

# DataFrame column -> scalar tag of the final figure written for each trial.
METRIC_TAGS = {
    "loss": "score/loss", "mfu": "score/mfu", "memory_bytes": "score/memory_bytes",
    "time_to_train": "score/time_to_train",
    "eval_loss": "score/eval_loss", "hfu": "score/hfu", "tokens_per_sec": "score/tokens_per_sec",
    "step_time": "score/step_time", "measured_peak_bytes": "score/measured_peak_bytes",
    "plan.peak_bytes": "plan/peak_bytes", "plan.predicted_mfu": "plan/predicted_mfu",
    "plan.predicted_step_time": "plan/predicted_step_time",
}
_STATUS = {"COMPLETE": api_pb2.STATUS_SUCCESS, "FAIL": api_pb2.STATUS_FAILURE,
           "PRUNED": api_pb2.STATUS_FAILURE, "RUNNING": api_pb2.STATUS_RUNNING}


class _EventFile:
    """One events.out.tfevents file written with TensorBoard's RecordWriter (no TensorFlow)."""

    def __init__(self, directory: Path, suffix: str):
        directory.mkdir(parents=True, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{suffix}")
        self._file = open(directory / name, "wb")
        self._records = RecordWriter(self._file)
        self.add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def add(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def summary(self, summary: summary_pb2.Summary, step: int, wall_time: float) -> None:
        self.add(event_pb2.Event(wall_time=wall_time, step=step, summary=summary))

    def close(self) -> None:
        self._file.close()


def _hparam_value(raw):
    """Decision values as TensorBoard accepts them (bool, int, float, str); None dropped."""
    if raw is None or (isinstance(raw, float) and math.isnan(raw)):
        return None
    if isinstance(raw, np.generic):
        raw = raw.item()
    return raw if isinstance(raw, (bool, int, float, str)) else str(raw)


def _hparams_by_trial(frame: pd.DataFrame) -> dict[int, dict]:
    """number -> {decision: value}; a decision with mixed value types becomes text."""
    values = {column: frame[column].map(_hparam_value) for column in decision_columns(frame)}
    for column, series in values.items():
        kinds = {type(v) for v in series if v is not None}
        if len(kinds) > 1 and kinds != {int, float}:
            values[column] = series.map(lambda v: None if v is None else str(v))
    by_trial = {}
    for position, number in enumerate(frame["number"]):
        by_trial[int(number)] = {column[2:]: series.iloc[position]
                                 for column, series in values.items()
                                 if series.iloc[position] is not None}
    return by_trial


def _experiment_summary(frame: pd.DataFrame, hparams: dict[int, dict],
                        predicted: bool) -> summary_pb2.Summary:
    names = sorted({name for values in hparams.values() for name in values})
    infos = []
    for name in names:
        seen = sorted({v[name] for v in hparams.values() if name in v}, key=str)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in seen)
        if all(isinstance(v, str) for v in seen) or all(isinstance(v, bool) for v in seen) \
                or numeric:
            domain = summary_v2.Discrete([float(v) for v in seen] if numeric else seen)
        else:
            domain = None
        infos.append(summary_v2.HParam(name, domain))
    note = " (predicted: plan-only, compiled not run)" if predicted else ""
    metrics = [summary_v2.Metric(tag, description=f"final {column}{note}")
               for column, tag in METRIC_TAGS.items()
               if column in frame and pd.to_numeric(frame[column], errors="coerce").notna().any()]
    return summary_v2.hparams_config_pb(infos, metrics, time_created_secs=time.time())


def _session_end_summary(state: str, end_time: float) -> summary_pb2.Summary:
    data = plugin_data_pb2.HParamsPluginData(session_end_info=plugin_data_pb2.SessionEndInfo(
        status=_STATUS.get(state, api_pb2.STATUS_UNKNOWN), end_time_secs=end_time))
    summary = summary_pb2.Summary()
    summary.value.add(tag=metadata.SESSION_END_INFO_TAG,
                      metadata=metadata.create_summary_metadata(data),
                      tensor=metadata.NULL_TENSOR)
    return summary


def _timestamp(raw, default: float) -> float:
    """Seconds since the epoch of Optuna's naive local datetimes."""
    if raw is None or pd.isna(raw):
        return default
    return pd.Timestamp(raw).to_pydatetime().timestamp()


def _trainer_tb(row: dict, run_dir: Path | None) -> Path | None:
    """RUN/trials/<n>/tb of a run folder the caller named; None for a study read from storage
    (a path stored in the study is never read: whoever writes the storage could name any folder)."""
    if run_dir is None:
        return None
    return run_dir / "trials" / str(int(row["number"])) / "tb"


def _write_trial(run: Path, row: dict, hparams: dict, trainer_tb: Path | None) -> None:
    if trainer_tb is not None and trainer_tb.is_dir():
        shutil.copytree(trainer_tb, run, dirs_exist_ok=True)
    now = time.time()
    start = _timestamp(row.get("datetime_start"), now)
    end = _timestamp(row.get("datetime_complete"), now)
    steps = row.get("steps")
    step = int(steps) if isinstance(steps, (int, float)) and math.isfinite(steps) else 0
    events = _EventFile(run, f"paxsearch_trial_{row['number']}")
    events.summary(summary_v2.hparams_pb(hparams, trial_id=f"trial_{row['number']}",
                                         start_time_secs=start), 0, start)
    for column, tag in METRIC_TAGS.items():
        raw = row.get(column)
        if isinstance(raw, (int, float, np.number)) and math.isfinite(raw):
            events.summary(scalar_summary.scalar_pb(tag, float(raw)), step, end)
    events.summary(_session_end_summary(row["state"], end), step, end)
    events.close()


def export_tensorboard(source: Source, out_dir: str | os.PathLike | None = None,
                       study_name: str | None = None) -> Path:
    """Write every trial of the study into one TensorBoard log directory; returns it.

    out_dir defaults to RUN/tensorboard for a run folder; a study read from a storage URL needs
    out_dir. The log directory is written beside itself and then replaces an earlier export as a
    whole (analysis/staging.py): nothing outside it is touched, a failure leaves the old one.
    """
    opened = open_study(source, study_name)
    if out_dir is None and opened.run_dir is None:
        raise ValueError("a study read from a storage URL has no run folder here; pass out_dir (--out DIR)")
    logdir = Path(out_dir) if out_dir is not None else opened.run_dir / "tensorboard"
    frame = trials_frame(opened.study)
    info = study_info(opened, frame=frame)
    hparams = _hparams_by_trial(frame)
    with staged_into(logdir.parent) as root:
        staged = root / logdir.name
        experiment = _EventFile(staged, "paxsearch_experiment")
        experiment.summary(_experiment_summary(frame, hparams, info["predicted"]), 0, time.time())
        experiment.close()
        for row in frame.to_dict("records"):
            _write_trial(staged / f"trial_{row['number']}", row, hparams[int(row["number"])],
                         _trainer_tb(row, opened.run_dir))
    return logdir
