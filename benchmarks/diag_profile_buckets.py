"""The planner's step of the v6e-8 Llama3.1-8B recipe, split the way an XProf op profile splits a
step (a diagnostic): matmul fusions ("convolution fusion"), the splash-attention kernels, the other
on-chip ops (loop fusions, reductions, copies), and the exposed transfers (collectives over ICI, host
offload over PCIe), each in seconds per step and chip, beside a measured profile's buckets.

The measured profile: MaxText's Qwen3-8B on a v6e-8 with the recipe's knobs (batch 3 per chip,
sequence 8192, flash 2048 blocks with the fused backward, decoder input and q/k/v/out_proj offloaded,
the recipe's flags), 45.3% MFU by MaxText's count, 6,942 tokens/s per chip (a 3.540 s step):
github.com/vlasenkoalexey/tpu_performance_autoresearch_wiki
wiki/analyses/2026-06-02-maxtext-vs-jax-qwen3-8b-mfu-gap.md ("Profile teardown": conv fusion 48.3%,
splash attention 33.2%, loop fusion 7.2%, reduce-scatter 4.0%, all-gather 1.9%, data formatting 1.8%,
host-offload copies <0.1%, idle 0.3%). `--model qwen3` plans Qwen3-8B's dims (36 layers, d_ff 12288,
vocabulary 151936; no QK norm: the trainer has none) in place of Llama3.1-8B's.

    python benchmarks/diag_profile_buckets.py --model qwen3
    python benchmarks/diag_profile_buckets.py --model llama   # the recipe's own model
    python benchmarks/diag_profile_buckets.py --flags v6e_llama3_no_collective_matmul   # the recipe's flags alone

Needs the tpu extra (libtpu).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import published as P  # noqa: E402

RECIPE = "v6e-8 Llama3.1-8B"
STEP_S = 3 * 8192 / 6942  # the profiled run's step: 3 rows of 8192 tokens per chip at 6,942 tokens/s per chip
COLLECTIVE_SHARES = {"reduce-scatter": 0.040, "all-gather": 0.019}  # the profile's collective buckets
PROFILE = {"matmul fusions": 0.483, "splash kernels": 0.332, "other on-chip ops": 0.072 + 0.018,
           "exposed ICI collectives": sum(COLLECTIVE_SHARES.values()), "exposed host transfers": 0.001}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("llama", "qwen3"), default="qwen3")
    ap.add_argument("--flags", default=None, help="flag set (default: the recipe's + no_collective_pipeliner)")
    args = ap.parse_args(argv)
    r = P.RECIPES_BY_NAME[RECIPE]
    cfg = P.recipe_config(r)
    if args.model == "qwen3":
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=36, d_ff=12288,
                                                                 vocab_size=151936))
    cfg = dataclasses.replace(cfg, flags=args.flags or f"{r.flags}+no_collective_pipeliner")
    from paxsearch.search.planning import topology as topo
    from paxsearch.trainer import flagsets
    os.environ.update(flagsets.env_for(cfg.flags, "tpu"))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from paxsearch.search.planning import hlo_passes
    from paxsearch.search.planning import roofline as R
    from paxsearch.search.planning.predict import hardware_for
    from paxsearch.search.planning.roofline import cost, hlo, model

    slice_name = r.target.split(":")[1]
    devices = topo.topology_devices(slice_name)
    program = hlo_passes.build_plan_program(cfg, devices, slice_name)
    plan = program.plan
    hw = hardware_for(devices)
    module = hlo.parse_module(plan.hlo_text)
    graph = hlo.call_graph(module)
    buckets = {"matmul fusions": 0.0, "splash kernels": 0.0, "other on-chip ops": 0.0}
    for comp, ins, mult in model._running_ops(module, graph):
        costs = cost.op_costs(module, comp, ins, hw, estimate=False)
        if costs is None:
            continue
        key = ("splash kernels" if cost.splash_matmuls(ins) else
               "matmul fusions" if cost.uses_mxu(module, ins) else "other on-chip ops")
        buckets[key] += costs[2] * mult
    roof = R.analyze(plan.hlo_text, hw, mesh=program.mesh, num_devices=plan.num_devices)  # as planning/predict.py
    buckets["exposed ICI collectives"] = sum(c.exposed_s for c in roof.collectives if c.link != "host")
    buckets["exposed host transfers"] = sum(c.exposed_s for c in roof.collectives if c.link == "host")
    total = sum(buckets.values())
    print(f"{r.name} as {args.model}, flags {cfg.flags}: predicted step {roof.step_time_s:.3f} s "
          f"(buckets sum {total:.3f} s), peak {plan.memory.peak_bytes / 2 ** 30:.2f} GiB; the profiled run's step "
          f"{STEP_S:.3f} s")
    print("| bucket | predicted s | measured s (share x step) | predicted / measured |")
    print("|---|---|---|---|")
    for k, v in buckets.items():
        m = PROFILE[k] * STEP_S
        print(f"| {k} | {v:.3f} | {m:.3f} | {v / m:.2f} |")
    # the profile's collective buckets are the ops' own time, overlapped or not: ours by kind, all and exposed
    for kind, share in COLLECTIVE_SHARES.items():
        mine = [c for c in roof.collectives if c.link == "ici" and c.kind == kind]
        print(f"{kind} over ICI: {sum(c.seconds for c in mine):.3f} s in all, {sum(c.exposed_s for c in mine):.3f} s "
              f"exposed; the profile's {kind} bucket {share * STEP_S:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
