"""Mesh shapes as decisions of a space: every factorization of a device count over named axes.

    from paxsearch.search import factorizations, mesh_of
    MESHES = factorizations(8, ("data", "fsdp", "tensor"))        # ["1x1x8", "1x2x4", ..., "8x1x1"]
    mesh = pg.oneof(MESHES, name="mesh")
    MeshConfig(ici=mesh_of(mesh, ("data", "fsdp", "tensor")))    # a full shape over config.MESH_AXES

A decision's value is the text "AxBxC" (a JSON scalar, as PyGlove candidates must be), its sizes
in the order of the axes named beside it; mesh_of turns it into one entry per axis of
config.MESH_AXES (data, stage, fsdp, context, tensor), the axes not named being 1. Any subset of
the axes may be searched, e.g. factorizations(8, ("stage", "fsdp", "tensor")). No JAX here.
"""
from __future__ import annotations

from typing import Sequence

from ...trainer.config import MESH_AXES, mesh_shape

LEGACY_AXES = ("data", "fsdp", "tensor")


def _check_axes(axes: Sequence[str]) -> None:
    unknown = [a for a in axes if a not in MESH_AXES]
    if unknown or len(set(axes)) != len(axes) or not axes:
        raise ValueError(f"mesh axes {tuple(axes)} must be distinct names among {', '.join(MESH_AXES)}")


def factorizations(devices: int, axes: Sequence[str] = LEGACY_AXES, *,
                   limits: dict[str, Sequence[int]] | None = None) -> list[str]:
    """Every ordered factorization of `devices` over `axes` as "AxBx..." texts, in ascending
    order of the sizes (first axis slowest). `limits` keeps an axis to the sizes it lists,
    e.g. limits={"stage": (1, 2, 4)}."""
    _check_axes(axes)
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    limits = limits or {}
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    out: list[str] = []

    def extend(prefix: list[int], rest: int, i: int) -> None:
        if i == len(axes) - 1:
            if rest in limits.get(axes[i], (rest,)):
                out.append("x".join(map(str, prefix + [rest])))
            return
        for d in divisors:
            if rest % d == 0 and d in limits.get(axes[i], (d,)):
                extend(prefix + [d], rest // d, i + 1)

    extend([], devices, 0)
    return out


def mesh_of(text: str, axes: Sequence[str] = LEGACY_AXES) -> tuple[int, ...]:
    """A full shape over config.MESH_AXES from "AxBx..." sizes of `axes` (others 1)."""
    _check_axes(axes)
    sizes = [int(x) for x in str(text).split("x")]
    if len(sizes) != len(axes):
        raise ValueError(f"mesh {text!r} has {len(sizes)} sizes for the {len(axes)} axes {', '.join(axes)}")
    return mesh_shape(**dict(zip(axes, sizes, strict=True)))
