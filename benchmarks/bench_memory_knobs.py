"""Per-chip memory with and without a memory knob, compiled for a TPU topology on this CPU
machine (plan mode, needs libtpu; issue 19, sections 2-4).

Question: how much per-chip memory does each memory knob save on a TPU topology, context
parallelism on one long-sequence step, and pipeline stages on a 70B (with its predicted MFU)?
Peer: the same config without the knob (context: the same chips splitting the heads instead of
the sequence; pipeline: the same model without a pipeline on the same chips).

The first word picks the knob (default knobs):

    python benchmarks/bench_memory_knobs.py [knobs] [v5e-4 [NAME_SUBSTRING]]   # e.g. v5e-4 16384: the larger rows
    python benchmarks/bench_memory_knobs.py context [v5e-8 [SEQ_LEN [NAME_SUBSTRING]]]
    python benchmarks/bench_memory_knobs.py pipeline [--baseline]               # v5p-128, stage 4
    python benchmarks/bench_memory_knobs.py pipeline --stages 0                 # only the unpipelined row

knobs: a Markdown table of argument, temp, host temp and peak bytes per chip (XLA's
memory_analysis of the compiled step) and the peak's change against the base config. The
configs are those of tests/trainer/test_memory_knobs_tpu.py: a 6.3M-parameter Llama-style model
(d_model 256, 2 layers, vocabulary 4096, seq 256), bf16 activations, fp32 parameters, data
parallelism over the 4 chips, 4 rows per chip, remat 'full'; vocab tiling and custom remat also
on a larger model (vocabulary 16384, seq 1024, 6 layers), where the TPU compiler does hold the
logits (up to 64 MiB of bfloat16 logits per chip it fuses the loss into the unembedding and
tiling has nothing to remove) and the saved activations outweigh the offload's staging buffers.

context: a Llama-style model (d_model 1024, 4 layers, 8 heads of 128, SwiGLU 4096, vocabulary
32768), bf16 activations, fp32 parameters, splash attention, remat 'full', a global batch of 2
sequences: the batch axes can use at most 2 chips, so the other 6 split either the heads
(tensor) or the sequence (context, load-balanced, trainer/context.py). A Markdown table of
argument, temp and peak bytes per chip and the compile time.

pipeline: a pipelined Llama 2 70B planned for a v5p slice (search/planning/compilation.plan_point):
the TPU compiler's per-chip memory, the bubble and the roofline's predicted MFU, one JSON line
per config. Minutes per compile.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from paxsearch.trainer import remat  # noqa: E402
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig, mesh_shape  # noqa: E402

MiB = 2 ** 20

# ---------------------------------------------------------------------------------------------- knobs
MODEL = ModelConfig(vocab_size=4096, d_model=256, n_layers=2, n_heads=4, head_dim=64, d_ff=1024, seq_len=256,
                    dtype="bfloat16", param_dtype="float32", mlp="gated", activation="silu", position="rope")
BASE = TrainConfig(model=MODEL, mesh=MeshConfig(ici=(4, 1, 1)), per_device_batch=4, remat="full")
QKV_INPUT = ("decoder_input", "query_proj", "key_proj", "value_proj")
BIG = dataclasses.replace(MODEL, vocab_size=16384, seq_len=1024, n_layers=6)
BIG_NAME = "vocab 16384, seq 1024, 6 layers"
VARIANTS = {
    "base (remat full)": BASE,
    "optimizer.zero1": dataclasses.replace(BASE, optimizer=dataclasses.replace(BASE.optimizer, zero1=True)),
    "optimizer.offload_state": dataclasses.replace(
        BASE, optimizer=dataclasses.replace(BASE.optimizer, offload_state=True)),
    "offload_params": dataclasses.replace(BASE, offload_params=True),
    "model.vocab_tiles=4": dataclasses.replace(BASE, model=dataclasses.replace(MODEL, vocab_tiles=4)),
    BIG_NAME: dataclasses.replace(BASE, model=BIG),
    f"{BIG_NAME}, vocab_tiles=4": dataclasses.replace(BASE, model=dataclasses.replace(BIG, vocab_tiles=4)),
    "grad_accum_steps=2": dataclasses.replace(BASE, grad_accum_steps=2),
    "custom: input+qkv=device": dataclasses.replace(BASE, remat=remat.custom(**dict.fromkeys(QKV_INPUT, "device"))),
    "custom: input+qkv=offload": dataclasses.replace(
        BASE, remat=remat.custom(**dict.fromkeys(QKV_INPUT, "offload"))),
    f"{BIG_NAME}, custom: input+qkv=device": dataclasses.replace(
        BASE, model=BIG, remat=remat.custom(**dict.fromkeys(QKV_INPUT, "device"))),
    f"{BIG_NAME}, custom: input+qkv=offload": dataclasses.replace(
        BASE, model=BIG, remat=remat.custom(**dict.fromkeys(QKV_INPUT, "offload"))),
}

# -------------------------------------------------------------------------------------------- context
CONTEXT_MODEL = ModelConfig(vocab_size=32768, d_model=1024, n_layers=4, n_heads=8, head_dim=128, d_ff=4096,
                            seq_len=16384, dtype="bfloat16", param_dtype="float32", mlp="gated", activation="silu",
                            position="rope", attention="flash")
CONTEXT_MESHES = {
    "fsdp 2 x tensor 4": mesh_shape(fsdp=2, tensor=4),
    "fsdp 2 x context 2 x tensor 2": mesh_shape(fsdp=2, context=2, tensor=2),
    "fsdp 2 x context 4": mesh_shape(fsdp=2, context=4),
}


def selected(names, only: str, mode: str) -> list[str]:
    """The names holding `only`, or exit naming them all (a filter that matches nothing is a typo)."""
    chosen = [n for n in names if only in n]
    if not chosen:
        raise SystemExit(f"bench_memory_knobs {mode}: no row holds {only!r}; rows: {'; '.join(names)}")
    return chosen


def knobs(args) -> None:
    from paxsearch.search.planning import topology
    from paxsearch.trainer.plan import build_program

    names = selected(VARIANTS, args.only, "knobs")
    devices = topology.topology_devices(args.slice)
    print(f"| config ({args.slice}) | argument MiB | temp MiB | host temp MiB | peak MiB | peak vs base | compile s |")
    print("|---|---|---|---|---|---|---|")
    base_peak = None
    for name in names:
        t = time.perf_counter()
        plan = build_program(VARIANTS[name], devices, count_flops=False).plan
        base_peak = base_peak or plan.peak_bytes  # the first row printed
        m = plan.memory
        change = (plan.peak_bytes / base_peak - 1) * 100
        print(f"| {name} | {m.argument_bytes / MiB:.1f} | {m.temp_bytes / MiB:.1f} | {m.host_temp_bytes / MiB:.1f} | "
              f"{plan.peak_bytes / MiB:.1f} | {change:+.1f}% | {time.perf_counter() - t:.0f} |", flush=True)


def context(args) -> None:
    from paxsearch.search.planning import topology
    from paxsearch.trainer.plan import build_program

    names = selected(CONTEXT_MESHES, args.only, "context")
    model = dataclasses.replace(CONTEXT_MODEL, seq_len=args.seq_len) if args.seq_len else CONTEXT_MODEL
    devices = topology.topology_devices(args.slice)
    print(f"{args.slice}, seq_len {model.seq_len}, global batch 2, remat full\n")
    print("| mesh | argument MiB | temp MiB | peak MiB | compile s |")
    print("|---|---|---|---|---|")
    for name in names:
        cfg = TrainConfig(model=model, mesh=MeshConfig(ici=CONTEXT_MESHES[name]), per_device_batch=None,
                          global_batch=2, remat="full")
        t0 = time.perf_counter()
        plan = build_program(cfg, devices, count_flops=False).plan
        m = plan.memory
        print(f"| {name} | {m.argument_bytes / MiB:.0f} | {m.temp_bytes / MiB:.0f} | {plan.peak_bytes / MiB:.0f} "
              f"| {time.perf_counter() - t0:.0f} |", flush=True)


def pipeline_rows(args, chips: int) -> list[tuple[str, TrainConfig]]:
    """(name, config) of the pipelined 70B (unless --stages 0) and of its unpipelined peer (with
    --baseline or --stages 0): the same global batch, fsdp over every chip."""
    from paxsearch.trainer import presets
    from paxsearch.trainer.config import PipelineConfig

    if args.stages < 0 or (args.stages and chips % args.stages):
        raise SystemExit(f"bench_memory_knobs pipeline: --stages {args.stages} does not divide the {chips} chips "
                         f"of {args.target} (0: only the unpipelined config)")
    model = presets.replace("llama2-70b", seq_len=args.seq_len, attention="flash", dtype="bfloat16")
    rows = []
    if args.stages:
        rows.append((f"stage={args.stages} fsdp={chips // args.stages} M={args.microbatches} R={args.repeats}",
                     TrainConfig(model=model, mesh=MeshConfig(ici=mesh_shape(stage=args.stages, fsdp=-1)),
                                 per_device_batch=args.per_device_batch, remat="full",
                                 pipeline=PipelineConfig(args.microbatches, args.repeats,
                                                         "circular" if args.repeats > 1 else "gpipe"))))
    if args.baseline or not args.stages:
        rows.append((f"fsdp={chips}", TrainConfig(
            model=model, mesh=MeshConfig(ici=mesh_shape(fsdp=-1)), remat="full",
            per_device_batch=max(1, args.per_device_batch // max(args.stages, 1)))))
    return rows


def pipeline(args) -> None:
    from paxsearch.search.planning.compilation import plan_point
    from paxsearch.search.planning.targets import parse_target

    target = parse_target(args.target)
    for name, cfg in pipeline_rows(args, target.num_devices):
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


MODES = {"knobs": knobs, "context": context, "pipeline": pipeline}


def parse(argv: list[str]) -> argparse.Namespace:
    """The mode and its options; a first word that is no mode is the knobs mode's slice (the
    command before the modes: bench_memory_knobs.py v5e-4 16384)."""
    if not argv or (argv[0] not in MODES and argv[0] not in ("-h", "--help")):
        argv = ["knobs", *argv]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = ap.add_subparsers(dest="mode", required=True)
    k = modes.add_parser("knobs", help="each memory knob against the base config")
    k.add_argument("slice", nargs="?", default="v5e-4")
    k.add_argument("only", nargs="?", default="", help="only the rows whose name holds this")
    c = modes.add_parser("context", help="context parallelism against tensor on one long-sequence step")
    c.add_argument("slice", nargs="?", default="v5e-8")
    c.add_argument("seq_len", nargs="?", type=int, default=None, help=f"default {CONTEXT_MODEL.seq_len}")
    c.add_argument("only", nargs="?", default="", help="only the meshes whose name holds this")
    p = modes.add_parser("pipeline", help="a pipelined Llama 2 70B against the same model without a pipeline")
    p.add_argument("--target", default="tpu:v5p-128")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages (0: only the unpipelined config)")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--per-device-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--baseline", action="store_true", help="also plan the unpipelined config (fsdp only)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    MODES[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
