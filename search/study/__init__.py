"""A study's inputs and where it lives: the space file (PyGlove decisions over a Fiddle config),
its STUDY settings, the storage and the study lock, config files, user modules to import."""
from .configio import ConfigFileError
from .settings import SettingsError, StudySettings
from .space import Space, SpaceError, load_space
from .storage import StorageError, StudyLock, is_superseded, open_storage
from .user_imports import ImportFailed

__all__ = ["ConfigFileError", "ImportFailed", "SettingsError", "Space", "SpaceError", "StorageError", "StudyLock",
           "StudySettings", "is_superseded", "load_space", "open_storage"]
