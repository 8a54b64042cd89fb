"""The search harness. Its rooms: cli/, study/, tuning/, planning/, trial/, workers/, driver/, gang/
(README.md, "Layout").

What a space file or a Python config imports from it, at this stable address:
    from paxsearch.search import intv, preset      # a ranged int decision; a preset ModelConfig
    from paxsearch.search import factorizations, mesh_of   # mesh shapes over named axes as decisions
    from paxsearch.search import configio          # loads / dumps of an exported config
They are loaded on first use, so that importing one room does not import them all."""
import importlib

_USER_API = {"intv": ("study.space", "intv"), "preset": ("study.space", "preset"), "configio": ("study.configio", None),
             "factorizations": ("study.meshes", "factorizations"), "mesh_of": ("study.meshes", "mesh_of")}

__all__ = sorted(_USER_API)


def load_export(package: str, homes: dict[str, tuple[str, str | None]], name: str):
    """`name` of `package`, imported on first use (a package's PEP 562 __getattr__): homes maps
    each exported name to (its submodule, its attribute there, or None for the submodule)."""
    if name not in homes:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, attr = homes[name]
    loaded = importlib.import_module(f"{package}.{module}")
    return loaded if attr is None else getattr(loaded, attr)


def __getattr__(name: str):
    return load_export(__name__, _USER_API, name)
