"""model.grouped_matmul="megablox" (the Pallas megablox kernel) runs on TPU only: the static checks
(trainer/validate.check, which the driver runs on every point before planning it) refuse it on
any other target in one line naming the fix, and pass it on a TPU target; no compile."""
from __future__ import annotations

import dataclasses

import pytest

from paxsearch.search.driver import dryrun
from paxsearch.search.driver.context import check_settings
from paxsearch.search.study.space import load_space
from paxsearch.trainer import presets, validate
from paxsearch.trainer.config import MeshConfig, TrainConfig, mesh_shape
from paxsearch.trainer.errors import ConfigError

MEGABLOX = dataclasses.replace(presets.get("moe-tiny"), grouped_matmul="megablox")
REFUSAL = "model.grouped_matmul='megablox' is a TPU kernel (Pallas) and cannot run on {}; use grouped_matmul='auto'"


def test_validate_refuses_megablox_off_tpu_and_passes_it_on_tpu():
    cfg = TrainConfig(model=MEGABLOX, mesh=MeshConfig(ici=mesh_shape(fsdp=-1)), per_device_batch=1)
    for platform in ("cpu", "gpu"):
        with pytest.raises(ConfigError) as e:
            validate.check(cfg, 8, platform)
        assert str(e.value).startswith(REFUSAL.format(platform)) and "\n" not in str(e.value)
    validate.check(cfg, 8, "tpu", chip="v5e")
    for gmm in ("auto", "ragged_dot"):  # the others run everywhere
        validate.check(dataclasses.replace(cfg, model=dataclasses.replace(MEGABLOX, grouped_matmul=gmm)), 8, "cpu")


@pytest.mark.parametrize("target, ok", [("cpu:8", False), ("tpu:v5e-8", True)])
def test_dry_run_removes_megablox_points_on_a_cpu_target(make_space, target, ok):
    # d_model and the experts' width in multiples of 128, as megablox's tiles need (moe.check)
    model = dict(n_experts=4, experts_per_token=2, mlp="gated", activation="silu", grouped_matmul="megablox",
                 d_model=128, d_ff=256)
    space = load_space(make_space("megablox", study=dict(target=target, objectives=["mfu", "memory"]),
                                  decisions=dict(per_device_batch=[1]), mesh="8x1x1", model=model))
    lines: list[str] = []
    dryrun.dry_run(space, space.settings, check_settings(space.settings, space), emit=lines.append)
    (checked,) = [line for line in lines if line.startswith(("  ok", "  invalid"))]
    if ok:
        assert checked.startswith("  ok"), checked
    else:
        assert checked.startswith("  invalid") and REFUSAL.format("cpu") in checked, checked
