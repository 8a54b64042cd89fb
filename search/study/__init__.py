"""A study's inputs and where it lives: the space file (PyGlove decisions over a Fiddle config),
its STUDY settings, the storage and the study lock, config files, user modules to import.

The names below are imported on first use: a trial worker reads config files (configio: Fiddle)
and never a space file or the storage, so importing one submodule of this room must not import
PyGlove and Optuna."""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import load_export

if TYPE_CHECKING:  # `X as X`: re-exported names, for type checkers
    from .configio import ConfigFileError as ConfigFileError
    from .settings import SettingsError as SettingsError
    from .settings import StudySettings as StudySettings
    from .space import Space as Space
    from .space import SpaceError as SpaceError
    from .space import load_space as load_space
    from .storage import StorageError as StorageError
    from .storage import StudyLock as StudyLock
    from .storage import is_superseded as is_superseded
    from .storage import open_storage as open_storage
    from .user_imports import ImportFailed as ImportFailed

_HOMES: dict[str, tuple[str, str | None]] = {
    name: (module, name) for module, names in (
        ("configio", ["ConfigFileError"]), ("settings", ["SettingsError", "StudySettings"]),
        ("space", ["Space", "SpaceError", "load_space"]),
        ("storage", ["StorageError", "StudyLock", "is_superseded", "open_storage"]),
        ("user_imports", ["ImportFailed"])) for name in names}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    return load_export(__name__, _HOMES, name)
