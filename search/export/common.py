"""What both exports share: the refusal, the visible notes of what was dropped, the mesh by axis."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...trainer.config import MESH_AXES, TrainConfig, full_shape
from ...trainer.mesh import BATCH_AXES
from ..errors import UserError


class ExportRefused(UserError):
    """The config has a knob that changes the model's math and that the other trainer cannot
    express: one line naming the knob and the fix."""


@dataclass
class Notes:
    """Knobs an export left out or approximated: each becomes a comment line in the output (and a
    line on stderr), never silently dropped."""

    lines: list[str] = field(default_factory=list)

    def drop(self, knob: str, why: str) -> None:
        self.lines.append(f"dropped {knob}: {why}")

    def approx(self, knob: str, why: str) -> None:
        self.lines.append(f"approximated {knob}: {why}")


def axis_sizes(cfg: TrainConfig, num_devices: int) -> tuple[dict[str, int], dict[str, int]]:
    """({axis: ICI size}, {axis: DCN size}) over MESH_AXES, the -1 ICI entry filled in for
    `num_devices` devices; ExportRefused when the mesh does not fill them."""
    ici, dcn = list(full_shape(cfg.mesh.ici)), list(full_shape(cfg.mesh.dcn))
    if len(ici) != len(MESH_AXES) or len(dcn) != len(MESH_AXES):
        raise ExportRefused(f"mesh ici={tuple(cfg.mesh.ici)} dcn={tuple(cfg.mesh.dcn)} is not one entry per axis "
                            f"({', '.join(MESH_AXES)}); fix the stored config")
    if -1 in ici:
        known = math.prod(i for i in ici if i != -1) * math.prod(dcn)
        ici[ici.index(-1)] = num_devices // known if known and num_devices % known == 0 else 0
    if math.prod(ici) * math.prod(dcn) != num_devices:
        raise ExportRefused(f"mesh ici={tuple(cfg.mesh.ici)} dcn={tuple(cfg.mesh.dcn)} does not fill {num_devices} "
                            "devices; pass --target with the device count the trial was planned for")
    return dict(zip(MESH_AXES, ici, strict=True)), dict(zip(MESH_AXES, dcn, strict=True))


def global_batch(cfg: TrainConfig, ici: dict[str, int], dcn: dict[str, int]) -> int:
    """Rows per optimizer step: global_batch, or per_device_batch x the batch axes (data x fsdp x
    expert, trainer/mesh.py BATCH_AXES)."""
    if cfg.global_batch is not None:
        return int(cfg.global_batch)
    return int(cfg.per_device_batch or 0) * math.prod(ici[a] * dcn[a] for a in BATCH_AXES)
