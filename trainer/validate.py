"""The one static validation of a config: every check that needs no compilation, on a given
number of devices of a platform. ConfigError (one line naming the problem and the fix).

Called once per process that sees a config: by build_program in a worker (trainer/plan.py),
and by the search driver before it hands the config to a worker."""
from __future__ import annotations

from . import accumulate, flagsets, placement, quant, vocab_tiling
from . import attention as attention_lib
from . import context as context_lib
from . import mesh as mesh_lib
from . import moe as moe_lib
from . import pipeline as pipeline_lib
from . import remat as remat_lib
from .config import TrainConfig


def check(cfg: TrainConfig, num_devices: int, platform: str, process_count: int = 1, chip: str | None = None) -> None:
    """Mesh size and divisibility, model names and family, sharding rules, the pipeline's
    stages / microbatches / repeats, the context split of the sequence, gradient-accumulation
    microbatches, vocab tiles, the quantization, ZeRO-1 and offload, the remat policy and the MoE grouped matmul
    (megablox: TPU only) on `platform`, the compiler flag set's name and that it applies to the TPU generation
    `chip` ("v6e"; None: unknown)."""
    mesh_lib.check_config(cfg, num_devices, process_count)
    accumulate.check(cfg, num_devices)
    sizes = mesh_lib.axis_sizes(cfg.mesh, num_devices)
    # the pipeline splits what one step's forward sees: global batch / gradient-accumulation microbatches
    pipeline_lib.check(cfg, sizes, mesh_lib.global_batch_size(cfg, num_devices) // max(cfg.grad_accum_steps, 1))
    vocab_tiling.check(cfg.model)
    moe_lib.check_train(cfg)
    moe_lib.grouped_matmul(cfg.model, platform)  # megablox is a TPU kernel: refused on any other platform
    quant.check(cfg.model)
    context_lib.check(cfg, sizes, attention_lib.implementation(cfg.model, platform))
    placement.check(cfg, sizes["data"], platform)
    remat_lib.check_policy(cfg.remat, platform)
    flagsets.check_target(cfg.flags, platform, chip)
