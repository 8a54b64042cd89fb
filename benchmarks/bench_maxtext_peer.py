"""MaxText's compiled step beside ours for a pipelined and a context-parallel config (issue 19, section 7).

Question: do pipeline and context parallelism compile to MaxText's program (FLOPs, memory, step)?
Peer: MaxText 0.2.5's `train_compile` of the same config, on the same slice.

Each config is compiled ahead of time for a TPU slice on this CPU twice, in fresh processes of
one interpreter (one jax, one libtpu): MaxText 0.2.5's `train_compile` with the config's
pipeline or context-parallel settings, and our planner (search/planning/targets.py
compilation.plan_point, what a plan-only trial runs). Both are read the same way: XLA's
memory_analysis() for the memory, the optimized HLO through search/planning/roofline for the executed
FLOPs and the predicted step time. Goal (the issue): FLOPs within 1%, memory within 5%.

The model is MaxText's 16B test config (`maxtext-v5e-16b`: 32 layers, d_model 5120, 32 heads of
256, d_ff 32768, ReLU, tied embeddings, vocabulary 32768, seq 2048), bf16 activations over fp32
weights, AdamW, remat `full`, splash attention, on v5p-32 (16 chips):
- pipeline: stage 4 x fsdp 4, 8 microbatches, GPipe (8 layers a stage: MaxText's
  num_layers_per_pipeline_stage=8, one repeat), 2 rows per chip;
- context: context 4 x fsdp 4, load-balanced all-gather of keys and values (MaxText's default
  strategy), 1 row per chip.

Needs the environment of benchmarks/bench_maxtext_compile.py (MaxText and paxsearch with one jax):
    /work/mt312/bin/python benchmarks/bench_maxtext_peer.py            # both configs, both sides
    /work/mt312/bin/python benchmarks/bench_maxtext_peer.py --report   # re-print from --out
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field, replace

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
from paxsearch.benchmarks import bench_maxtext_compile

GiB = 2 ** 30


@dataclass(frozen=True)
class Peer:
    name: str
    target: str
    preset: str
    axes: dict  # our mesh axes by name (trainer/config.py mesh_shape); MaxText's ici_<axis>_parallelism
    per_device_batch: int  # MaxText's per_device_batch_size: rows per chip over all chips (stage and context too)
    maxtext: tuple[str, ...] = ()  # MaxText overrides beyond the mesh
    pipeline: dict = field(default_factory=dict)  # our PipelineConfig fields
    remat: str = "full"
    attention: str = "flash"
    flags: str = "default"

    @property
    def chips(self) -> int:
        return int(self.target.split("-")[-1]) // 2  # v5p-N names TensorCores: N / 2 chips

    @property
    def global_batch(self) -> int:  # ours is set to it (our per_device_batch counts the batch axes' devices only)
        return self.per_device_batch * self.chips


PEERS = (
    Peer("v5p-32 16B pipeline 4 x fsdp 4", "tpu:v5p-32", "maxtext-v5e-16b", {"stage": 4, "fsdp": 4}, 2,
         maxtext=("num_pipeline_microbatches=8", "num_layers_per_pipeline_stage=8"),
         pipeline={"microbatches": 8, "repeats": 1, "schedule": "gpipe"}),
    Peer("v5p-32 16B context 4 x fsdp 4", "tpu:v5p-32", "maxtext-v5e-16b", {"context": 4, "fsdp": 4}, 1,
         maxtext=("context_parallel_load_balance=true", "context_parallel_strategy=all_gather")),
)
BY_NAME = {p.name: p for p in PEERS}


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_").lower()


def model_of(peer: Peer):
    from paxsearch.trainer import presets

    return presets.get(peer.preset)


MAXTEXT_AXIS = {"stage": "pipeline"}  # our mesh axis -> MaxText's ici_<name>_parallelism


def maxtext_argv(peer: Peer, base_yml: str) -> list[str]:
    mesh = [f"ici_{MAXTEXT_AXIS.get(axis, axis)}_parallelism={size}" for axis, size in peer.axes.items()]
    return bench_maxtext_compile.maxtext_common_argv(base_yml, peer.target, model_of(peer), peer.per_device_batch,
                                                     peer.remat, peer.attention) + mesh + list(peer.maxtext)


def compile_ours(peer: Peer, out_path: str) -> None:
    """In this (fresh) process: plan the config as a plan-only trial does; write its figures."""
    from paxsearch.search.planning import targets
    from paxsearch.search.planning.compilation import plan_point
    from paxsearch.search.planning.method import PLAN_COMPILE_ENV
    from paxsearch.trainer import flagsets

    target = targets.parse_target(peer.target)
    os.environ.update(targets.target_env(target))  # before JAX starts, as a plan-only worker's are
    os.environ.update(flagsets.env_for(peer.flags, "tpu"))
    # compiled to the end, as MaxText's side is: the generated code measured, not bounded (hlo_passes)
    os.environ[PLAN_COMPILE_ENV] = "full"
    from paxsearch.trainer.config import MeshConfig, PipelineConfig, TrainConfig, mesh_shape

    cfg = TrainConfig(model=model_of(peer), mesh=MeshConfig(ici=mesh_shape(**peer.axes)),
                      per_device_batch=None, global_batch=peer.global_batch, remat=peer.remat, flags=peer.flags,
                      pipeline=PipelineConfig(**peer.pipeline))
    cfg = replace(cfg, model=replace(cfg.model, attention=peer.attention))
    res: dict = {"name": peer.name, "config": repr(cfg), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    t0 = time.perf_counter()
    try:
        _, plan = plan_point(cfg, target)
        res.update(plan=plan.to_stored())  # the result file holds the plan's stored form
    except BaseException as e:  # noqa: BLE001  recorded, not raised
        res.update(error=f"{type(e).__name__}: {str(e).strip()[:300]}", traceback=traceback.format_exc()[-3000:])
    res["compile_s"] = time.perf_counter() - t0
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1, default=str)


def run_side(peer: Peer, side: str, out: str, timeout: int) -> dict:
    cmd = [sys.executable, __file__, f"--{side}-config", peer.name, "--out", out]
    return bench_maxtext_compile.run_compile_child(peer.name, side, cmd,
                                                   os.path.join(out, f"{slug(peer.name)}.{side}.json"), out, timeout)


def figures(res: dict, side: str) -> dict:
    """peak, temp, argument bytes, executed FLOPs, predicted step time of one side's result."""
    if side == "ours":
        from paxsearch.store.plan import Plan

        plan = Plan.from_stored(res.get("plan")) or Plan()  # the result file holds the stored plan
        roof = plan.roofline or {}
        return {"peak": plan.peak_bytes, "temp": plan.temp_bytes, "args": plan.argument_bytes,
                "flops": roof.get("flops_per_step"), "step": roof.get("step_time_s"),
                "bubble": plan.pipeline_bubble, "compile_s": res.get("compile_s")}
    mem, roof = res.get("memory") or {}, res.get("roofline") or {}
    return {"peak": res.get("peak_bytes"), "temp": mem.get("temp"), "args": mem.get("argument"),
            "flops": roof.get("flops_per_step"), "step": roof.get("step_time_s"), "bubble": None,
            "compile_s": res.get("compile_s")}


def _ratio(a, b):
    return "-" if not a or not b else f"{a / b:.3f}"


def report(results: dict) -> str:
    lines = ["| config | side | peak GiB | temp GiB | argument GiB | executed FLOPs / chip | predicted step s | "
             "compile s |", "|---|---|---|---|---|---|---|---|"]
    ratios = ["| config | peak ours / MaxText | FLOPs ours / MaxText | step ours / MaxText |", "|---|---|---|---|"]
    for peer in PEERS:
        got = results.get(peer.name, {})
        f = {}
        for side, label in (("ours", "paxsearch"), ("maxtext", "MaxText 0.2.5")):
            res = got.get(side)
            if res is None:
                continue
            if res.get("error"):
                lines.append(f"| {peer.name} | {label} | **{res['error'][:200]}** | | | | | |")
                continue
            f[side] = x = figures(res, side)
            g = lambda b: "-" if b is None else f"{b / GiB:.2f}"  # noqa: E731
            lines.append(f"| {peer.name} | {label} | {g(x['peak'])} | {g(x['temp'])} | {g(x['args'])} | "
                         f"{x['flops']:.4e} | {x['step']:.3f} | {x['compile_s']:.0f} |")
        if len(f) == 2:
            o, m = f["ours"], f["maxtext"]
            ratios.append(f"| {peer.name} | {_ratio(o['peak'], m['peak'])} | {_ratio(o['flops'], m['flops'])} | "
                          f"{_ratio(o['step'], m['step'])} |")
    return "\n".join(lines) + "\n\n" + "\n".join(ratios)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_maxtext_peer"))
    ap.add_argument("--only", action="append", default=[], help="config name (repeatable); default both")
    ap.add_argument("--side", choices=("both", "maxtext", "ours"), default="both")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--fresh", action="store_true", help="compile again what --out holds")
    ap.add_argument("--report", action="store_true", help="print the table from --out; compile nothing")
    ap.add_argument("--ours-config", help=argparse.SUPPRESS)
    ap.add_argument("--maxtext-config", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.ours_config:
        compile_ours(BY_NAME[args.ours_config], os.path.join(out, f"{slug(args.ours_config)}.ours.json"))
        return 0
    if args.maxtext_config:
        peer = BY_NAME[args.maxtext_config]
        bench_maxtext_compile.compile_maxtext_step(peer.name, peer.target, peer.flags,
                                                   lambda yml: maxtext_argv(peer, yml), model_of(peer),
                                                   peer.global_batch,
                                                   os.path.join(out, f"{slug(peer.name)}.maxtext.json"))
        return 0
    unknown = [n for n in args.only if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown config {unknown}; choose from {sorted(BY_NAME)}")
    os.makedirs(out, exist_ok=True)
    results: dict = {}
    for peer in PEERS:
        if args.only and peer.name not in args.only:
            continue
        for side in ("ours", "maxtext"):
            path = os.path.join(out, f"{slug(peer.name)}.{side}.json")
            if os.path.exists(path) and not args.fresh:
                with open(path) as f:
                    results.setdefault(peer.name, {})[side] = json.load(f)
            elif not args.report and args.side in ("both", side):
                results.setdefault(peer.name, {})[side] = run_side(peer, side, out, args.timeout)
        print(report(results), "", sep="\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
