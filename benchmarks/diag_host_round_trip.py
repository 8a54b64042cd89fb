"""Host round trips of offloaded stacks, per TPU slice and compiler flag set (a diagnostic).

A small step (4 layers, d_model 1024, sequence 2048, 2 rows per chip, fsdp over the slice, flash
attention) with the layer input and the attention output both offloaded to host, planned through
the HLO passes for each slice and flag set; prints how many buffers the compiled step copies from
host memory to HBM and back only for a relayout (search/planning/roofline/host.host_round_trips) and the
compile-only plan's temporaries. benchmarks/RESULTS.md, "The collective pipeliner and the
offloaded stacks".

    python benchmarks/diag_host_round_trip.py                                  # v6e-8 v5p-8 v4-8 v5e-8
    python benchmarks/diag_host_round_trip.py --slices v6e-8 --sets default,no_collective_pipeliner

Needs the tpu extra (libtpu).
"""
from __future__ import annotations

import argparse
import os
import time

REMAT = "custom:decoder_input=offload,out_proj=offload"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slices", default="v6e-8,v5p-8,v4-8,v5e-8")
    ap.add_argument("--sets", default="default,no_collective_pipeliner")
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from paxsearch.search.planning import hlo_passes, topology
    from paxsearch.search.planning.roofline import hlo, host
    from paxsearch.trainer import flagsets
    from paxsearch.trainer.config import EvalConfig, MeshConfig, ModelConfig, TrainConfig

    model = ModelConfig(vocab_size=4096, d_model=1024, n_layers=4, n_heads=8, head_dim=128, d_ff=4096, seq_len=2048,
                        dtype="bfloat16", attention="flash")
    base = dict(os.environ)
    print("| slice | flag set | host round trips | GB each way | temporaries MiB | plan s |")
    print("|---|---|---|---|---|---|")
    for slice_name in args.slices.split(","):
        devices = topology.topology_devices(slice_name)
        for name in args.sets.split(","):
            os.environ.clear()
            os.environ.update(base)
            os.environ.update(flagsets.env_for(name, "tpu"))
            cfg = TrainConfig(model=model, mesh=MeshConfig(ici=(1, len(devices), 1)), per_device_batch=2, remat=REMAT,
                              flags=name, eval=EvalConfig(enabled=False))
            t0 = time.perf_counter()
            plan = hlo_passes.build_plan_program(cfg, devices, slice_name).plan
            trips = host.host_round_trips(hlo.parse_module(plan.hlo_text))
            print(f"| {slice_name} | {name} | {len(trips)} | {sum(b for _, b in trips) / 1e9:.3f} "
                  f"| {plan.memory.temp_bytes / 2 ** 20:.0f} | {time.perf_counter() - t0:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
