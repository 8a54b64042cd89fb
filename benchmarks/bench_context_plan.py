"""Per-chip memory of one long-sequence step with and without context parallelism (issue 19,
section 3), compiled for a TPU topology on this CPU machine (plan mode, needs libtpu).

Question: how much per-chip memory does context parallelism save on one long-sequence step?
Peer: the same step with the same chips splitting the heads (tensor) instead of the sequence.

    python benchmarks/bench_context_plan.py [v5e-8 [SEQ_LEN [NAME_SUBSTRING]]]

A Llama-style model (d_model 1024, 4 layers, 8 heads of 128, SwiGLU 4096, vocabulary 32768),
bf16 activations, fp32 parameters, splash attention, remat 'full', a global batch of 2
sequences: the batch axes can use at most 2 chips, so the other 6 split either the heads
(tensor) or the sequence (context, load-balanced, trainer/context.py). Prints a Markdown
table: argument, temp and peak bytes per chip (XLA's memory_analysis of the compiled step)
and the compile time.
"""
import dataclasses
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from paxsearch.search.planning import topology  # noqa: E402
from paxsearch.trainer.config import MeshConfig, ModelConfig, TrainConfig, mesh_shape  # noqa: E402
from paxsearch.trainer.plan import build_program  # noqa: E402

MODEL = ModelConfig(vocab_size=32768, d_model=1024, n_layers=4, n_heads=8, head_dim=128, d_ff=4096, seq_len=16384,
                    dtype="bfloat16", param_dtype="float32", mlp="gated", activation="silu", position="rope",
                    attention="flash")
MESHES = {
    "fsdp 2 x tensor 4": mesh_shape(fsdp=2, tensor=4),
    "fsdp 2 x context 2 x tensor 2": mesh_shape(fsdp=2, context=2, tensor=2),
    "fsdp 2 x context 4": mesh_shape(fsdp=2, context=4),
}
MiB = 2 ** 20


def main(argv: list[str]) -> int:
    chip = argv[0] if argv else "v5e-8"
    model = dataclasses.replace(MODEL, seq_len=int(argv[1])) if len(argv) > 1 else MODEL
    devices = topology.topology_devices(chip)
    print(f"{chip}, seq_len {model.seq_len}, global batch 2, remat full\n")
    print("| mesh | argument MiB | temp MiB | peak MiB | compile s |")
    print("|---|---|---|---|---|")
    only = argv[2] if len(argv) > 2 else ""
    for name, ici in MESHES.items():
        if only not in name:
            continue
        cfg = TrainConfig(model=model, mesh=MeshConfig(ici=ici), per_device_batch=None, global_batch=2, remat="full")
        t0 = time.perf_counter()
        plan = build_program(cfg, devices, count_flops=False).plan
        m = plan.memory
        print(f"| {name} | {m.argument_bytes / MiB:.0f} | {m.temp_bytes / MiB:.0f} | {plan.peak_bytes / MiB:.0f} "
              f"| {time.perf_counter() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
