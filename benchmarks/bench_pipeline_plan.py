"""A pipelined Llama 2 70B planned for a v5p slice on a CPU machine (no TPUs): the TPU
compiler's per-chip memory, the bubble and the roofline's predicted MFU, beside the same
model without a pipeline on the same chips.

Question: what do pipeline stages do to a 70B's per-chip memory and predicted MFU on a v5p slice?
Peer: the same model without a pipeline on the same chips.

    JAX_PLATFORMS=cpu python benchmarks/bench_pipeline_plan.py                  # v5p-128, stage 4
    JAX_PLATFORMS=cpu python benchmarks/bench_pipeline_plan.py --stages 0       # only the unpipelined row

Prints one JSON line per config. Needs libtpu (the `tpu` extra). Minutes per compile.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="tpu:v5p-128")
    ap.add_argument("--stages", type=int, default=4, help="pipeline stages (0: only the unpipelined config)")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--per-device-batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--baseline", action="store_true", help="also plan the unpipelined config (fsdp only)")
    args = ap.parse_args()

    from paxsearch.search.planning import targets
    from paxsearch.search.planning.compilation import plan_point
    from paxsearch.trainer import presets
    from paxsearch.trainer.config import MeshConfig, PipelineConfig, TrainConfig, mesh_shape

    target = targets.parse_target(args.target)
    chips = target.num_devices
    model = presets.replace("llama2-70b", seq_len=args.seq_len, attention="flash", dtype="bfloat16")
    rows = []
    if args.stages:
        rows.append((f"stage={args.stages} fsdp={chips // args.stages} M={args.microbatches} R={args.repeats}",
                     TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(stage=args.stages, fsdp=-1)),
                                 per_device_batch=args.per_device_batch, remat="full",
                                 pipeline=PipelineConfig(args.microbatches, args.repeats,
                                                         "circular" if args.repeats > 1 else "gpipe"))))
    if args.baseline or not args.stages:
        # the same global batch without a pipeline: fsdp over every chip
        rows.append((f"fsdp={chips}", TrainConfig(
            model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=-1)), remat="full",
            per_device_batch=max(1, args.per_device_batch // max(args.stages, 1)))))
    for name, cfg in rows:
        t0 = time.perf_counter()
        try:
            _, plan = plan_point(cfg, target)
            stored = plan.to_stored()  # the printed JSON: the plan's stored keys
            out = {k: stored.get(k) for k in ("peak_bytes", "hbm_bytes", "fits", "global_batch", "pipeline_bubble",
                                            "predicted_mfu", "predicted_step_time", "xla_flops_per_step",
                                            "model_flops_per_step", "mesh_shape")}
        except Exception as e:  # a refusal for memory is a result too
            out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        out.update(config=name, target=target.name, wall_s=round(time.perf_counter() - t0, 1))
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
