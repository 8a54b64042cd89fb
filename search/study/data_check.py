"""Static check of a config's data source: the seqio task is registered (after the study's
--import modules ran), local text files exist and hold a line. The trainer's own DataError
text is the one line; the result is kept per distinct DataConfig, so a whole space costs one
TensorFlow import and one lookup per data source. The default synthetic task needs neither."""
from __future__ import annotations

import dataclasses
import json

from ...trainer.config import DataConfig

_DEFAULT_TASK = DataConfig().task  # paxsearch's synthetic corpus (trainer/synthetic_data.py: no seqio)
_seen: dict[str, str | None] = {}


def data_problem(data: DataConfig) -> str | None:
    """None when the trainer can read `data`'s source here, else the trainer's one-line reason."""
    if not data.text_files and data.task == _DEFAULT_TASK:
        return None
    key = json.dumps(dataclasses.asdict(data), sort_keys=True, default=str)
    if key not in _seen:
        from ...trainer import data as data_lib  # seqio and TensorFlow: only for a source of the user's
        from ...trainer.errors import DataError

        try:
            data_lib.data_vocab_size(data)
            _seen[key] = None
        except DataError as e:
            _seen[key] = str(e)
    return _seen[key]
