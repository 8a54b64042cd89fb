"""Per-chip memory of each memory knob (issue 19, section 4), compiled for a TPU topology on
this CPU machine (plan mode, needs libtpu), against the same config without it.

Question: how much per-chip memory does each memory knob save on a TPU topology?
Peer: the same config without the knob.

    python benchmarks/bench_memory_knobs.py [v5e-4 [NAME_SUBSTRING]]    # e.g. v5e-4 16384: the larger rows

Prints a Markdown table: argument, temp, host temp and peak bytes per chip (XLA's memory_analysis of
the compiled step) and the peak's change against the base config. The configs are those of
tests/trainer/test_memory_knobs_tpu.py: a 6.3M-parameter Llama-style model (d_model 256,
2 layers, vocabulary 4096, seq 256), bf16 activations, fp32 parameters, data parallelism over
the 4 chips, 4 rows per chip, remat 'full'; vocab tiling and custom remat also on a larger
model (vocabulary 16384, seq 1024, 6 layers), where the TPU compiler does hold the logits (up to
64 MiB of bfloat16 logits per chip it fuses the loss into the unembedding and tiling has
nothing to remove) and the saved activations outweigh the offload's staging buffers.
"""
import dataclasses
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from paxsearch.search.planning import topology  # noqa: E402
from paxsearch.trainer import remat
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig  # noqa: E402
from paxsearch.trainer.plan import build_program  # noqa: E402

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


def main(slice_name: str = "v5e-4", only: str = "") -> None:
    devices = topology.topology_devices(slice_name)
    mib = lambda b: f"{b / 2 ** 20:.1f}"
    print(f"| config ({slice_name}) | argument MiB | temp MiB | host temp MiB | peak MiB | peak vs base | compile s |")
    print("|---|---|---|---|---|---|---|")
    base_peak = None
    for name, cfg in VARIANTS.items():
        if only not in name:
            continue
        t = time.perf_counter()
        plan = build_program(cfg, devices, count_flops=False).plan
        base_peak = base_peak or plan.peak_bytes  # the first row printed
        m = plan.memory
        change = (plan.peak_bytes / base_peak - 1) * 100
        print(f"| {name} | {mib(m.argument_bytes)} | {mib(m.temp_bytes)} | {mib(m.host_temp_bytes)} | "
              f"{mib(plan.peak_bytes)} | {change:+.1f}% | {time.perf_counter() - t:.0f} |", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
