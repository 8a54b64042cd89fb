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


def __getattr__(name: str):
    if name not in _USER_API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = _USER_API[name]
    loaded = importlib.import_module(f"{__name__}.{module}")
    return loaded if attr is None else getattr(loaded, attr)
