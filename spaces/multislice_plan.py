"""multislice_plan: what 1, 2 and 4 v5e-256 slices predict for MaxText's 16B model, with the
data axis over the data-center network (DCN), planned on a CPU machine without TPUs.

The target is `tpu:v5e-256,slices=auto`: the slice count is not the study's but each
trial's, prod(mesh.dcn) slices of v5e-256 (search/planning/targets.py Target.for_config). So one
study compiles the same step for 256, 512 and 1024 compile-only TPU devices
(jax.experimental.topologies with libtpu: pip install 'paxsearch[tpu]'), never runs it, and
records each trial's concrete target ("tpu:v5e-256,slices=4") in its plan.

Fixed, as MaxText's own v5e recipe for this model runs it (MaxText/configs/v5e/16b.sh:
global_parameter_scale=16, per_device_batch_size=6, remat_policy=full, attention flash,
max_target_length=2048; multi-slice runs add slices with dcn_data_parallelism=<slices> and
keep ici_fsdp_parallelism over the 256 chips of each slice):
  model             the maxtext-v5e-16b preset (trainer/presets.py, ~16.3B parameters)
  ici mesh          fsdp over the 256 chips of one slice: (1, 256, 1)
  per_device_batch  6 rows of 2048 tokens per chip, so the global batch grows with the slice
                    count (1,536 / 3,072 / 6,144 sequences), as in MaxText's multi-slice runs
  remat             "full" (the recipe's remat_policy=full)
Decision (a named PyGlove choice):
  slices            1, 2 or 4: mesh.dcn = (slices, 1, 1), the data axis across slices
Objectives: predicted MFU (higher) and compiled per-chip memory (lower).

What it shows: per-chip memory does not shrink with more slices (parameters and optimizer
state are sharded over fsdp inside a slice and replicated across slices; the per-chip batch
is fixed), and what the gradient all-reduce over DCN (25 Gbps a chip on v5e) costs per step
beside the compute, as predicted step time, predicted MFU and DCN collective time (every
step-time figure is the roofline's prediction over the optimized HLO, search/planning/roofline/;
per-chip memory is XLA's TPU compiler's own figure against 15.75 GiB usable HBM).
Run on 2026-12-01 (benchmarks/RESULTS.md, "Multi-slice planning"):

    slices  chips  global batch  memory/chip  step (pred.)  MFU (pred.)  DCN all-reduce / exposed
    1       256    1,536         9.83 GiB     8.884 s       70.8%        none
    2       512    3,072         11.88 GiB    8.930 s       70.5%        60 ms / 24 ms
    4       1024   6,144         11.77 GiB    8.973 s       70.1%        106 ms / 68 ms

The data axis over DCN is cheap for this model: the step is compute-bound (7.89 s of FLOPs
at the bf16 peak), so tokens/s are predicted to scale 1.99x on 2 slices and 3.96x on 4.
Per-chip memory rises by ~2 GiB once there is more than one slice (XLA's temporaries).

Compiler flags: the `paxml_multislice` flag set (trainer/flagsets.py: windowed einsums,
all-gather CSE threshold, async all-gather, latency-hiding scheduler) is what Paxml launches
its multi-slice runs with. This space keeps the compiler's defaults, so the slice count is
the only thing that changes between trials. The flag set is compared in a second study,
`paxsearch run spaces/multislice_plan.py --set flags=paxml_multislice --run-dir
runs/multislice_plan_paxml`. The roofline reads overlap from the compiled schedule, so
scheduler flags show in the prediction. Measured on 2026-12-01 (benchmarks/RESULTS.md):
predicted MFU about +1 point at every slice count, all of it from in-slice (ICI) fsdp
communication; the DCN all-reduce and the memory are unchanged.

Compile time (2-core development machine, shared): 139 s for one slice (256 devices) at
load ~1, and 275-470 s per trial under load 7-22 for 1, 2 and 4 slices. XLA compiles one
program per slice, so 4 slices (1024 devices) take no longer than one.

Run:  paxsearch run spaces/multislice_plan.py --workers 1   (grid, 3 trials: ~7 minutes on an
                                                             idle 2-core machine, 21 minutes loaded)
      paxsearch run spaces/multislice_plan.py --dry-run     (the space and its static feasibility)
      paxsearch report runs/multislice_plan                 (labelled "predicted"; trials.csv has
                                                             plan.target, plan.num_slices, plan.dcn_mesh)
"""
import fiddle as fdl
import pyglove as pg

from paxsearch.search import preset
from paxsearch.trainer.config import EvalConfig, MeshConfig, OptimizerConfig, TrainConfig

CHIPS_PER_SLICE = 256
SLICES = [1, 2, 4]

STUDY = dict(
    objectives=["mfu", "memory"],  # plan mode: predicted MFU, compiled memory
    tuner="grid",
    trials=len(SLICES),
    target=f"tpu:v5e-{CHIPS_PER_SLICE},slices=auto",  # each trial: prod(mesh.dcn) slices of v5e-256
    workers=1,  # one compile keeps about two cores busy; 4 slices hold 1024 compile-only devices
    count_flops=False,  # FLOPs come from the optimized HLO with loop trip counts
    timeout=1800,
)


def space():
    return fdl.Config(
        TrainConfig,
        model=preset("maxtext-v5e-16b"),
        mesh=fdl.Config(MeshConfig, ici=(1, CHIPS_PER_SLICE, 1), dcn=(pg.oneof(SLICES, name="slices"), 1, 1)),
        per_device_batch=6,
        remat="full",
        optimizer=fdl.Config(OptimizerConfig, peak_lr=3e-4, warmup_steps=100),
        steps=1000,
        eval=fdl.Config(EvalConfig, enabled=False),
    )
