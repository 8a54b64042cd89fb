"""Whole-stack host copies of an offload policy, in MaxText's own compiled step (a diagnostic).

MaxText 0.2.5's train step of Llama3.1-8B (the v6e-256 recipe's model: sequence 8192, 4 rows
per chip, flash attention, fsdp over the slice), remat `custom` with the named tensors offloaded,
compiled for v6e-256 with our `v6e_llama3` flag set through bench_maxtext_compile's driver; it
prints the roofline's figures of that step and how many copy-starts move a whole
[layers, rows, seq, d_model] stack to or from host memory (benchmarks/RESULTS.md, "MaxText's
2025 recipes planned": offloading the layer input and the attention output together makes the
compiler round-trip both stacks through HBM for a layout change).

    /work/mt312/bin/python benchmarks/diag_offload_relayout.py both     # decoder_layer_input + out_proj
    /work/mt312/bin/python benchmarks/diag_offload_relayout.py input    # decoder_layer_input only

A recipe of benchmarks/published.py RECIPES, as MaxText itself expresses it (its slice, rows per
chip, offloads, splash blocks and fused backward, our nearest flag set), with its memory:
    /work/mt312/bin/python benchmarks/diag_offload_relayout.py recipe "v6e-8 Llama3.1-8B" [rows per chip]

Needs the environment of bench_maxtext_compile.py (its docstring).
"""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_maxtext_compile as M  # noqa: E402

OFFLOADS = {"both": ["decoder_layer_input=offload", "out_proj=offload"], "input": ["decoder_layer_input=offload"],
            "out": ["out_proj=offload"]}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    which = argv[0] if argv else "both"
    if which == "recipe" and len(argv) >= 2:
        return recipe(argv[1], int(argv[2]) if len(argv) > 2 else None)
    if which not in OFFLOADS:
        print(f"diag_offload_relayout: unknown choice {which!r}; use one of {', '.join(OFFLOADS)}", file=sys.stderr)
        return 2
    from paxsearch.trainer import presets

    def argv_for(base_yml):
        return ["train_compile", base_yml, "run_name=peer", "compile_topology=v6e-256",
                "compile_topology_num_slices=1", "model_name=llama3.1-8b", "max_target_length=8192",
                "per_device_batch_size=4", "remat_policy=custom", *OFFLOADS[which], "attention=flash",
                "dtype=bfloat16", "weight_dtype=float32", "enable_dropout=false", "dataset_type=synthetic",
                "enable_checkpointing=false", "opt_type=adamw", "skip_jax_distributed_system=true",
                "ici_fsdp_parallelism=-1"]

    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"diag_offload_relayout_{which}.json")
    M.compile_maxtext_step("v6e-256 Llama3.1-8B", "tpu:v6e-256", "v6e_llama3", argv_for,
                           presets.get("llama3.1-8b"), 1024, out)
    with open(out) as f:
        res = json.load(f)
    hlo_path = out.replace(".json", ".hlo.txt")
    hlo = open(hlo_path).read() if os.path.exists(hlo_path) else ""
    stack = "[32,4,8192,4096]"
    copies = [line for line in hlo.splitlines()
              if "copy-start(" in line and "S(5)" in line and stack in line.split("copy-start(")[0]]
    print(json.dumps({"offloaded": OFFLOADS[which], "error": res.get("error"), "peak_bytes": res.get("peak_bytes"),
                      "predicted_step_time": res.get("predicted_step_time"),
                      "whole_stack_host_copies": len(copies)}))
    return 0


# our custom-policy tensor names that MaxText's remat knobs spell otherwise
MAXTEXT_NAMES = {"decoder_input": "decoder_layer_input"}
SPLASH_BLOCKS = ("q", "kv", "kv_compute", "q_dkv", "kv_dkv", "kv_dkv_compute", "q_dq", "kv_dq")


def recipe(name: str, rows: int | None) -> int:
    """MaxText's own step of recipe `name` (its knobs as MaxText takes them), compiled for its slice."""
    import published as P
    from paxsearch.search.planning import targets as T
    from paxsearch.trainer import presets, remat

    r = P.RECIPES_BY_NAME[name]
    model = presets.get(r.preset)
    rows = rows or r.maxtext_per_device_batch
    offloads = [f"{MAXTEXT_NAMES.get(t, t)}={c}" for t, c in remat.parse_custom(r.remat).items() if c != "recompute"]
    knobs = {k: v for k, v, _ in r.knobs}
    block = knobs.get("sa_block_q, sa_block_kv, sa_block_kv_compute, *_dkv, *_dq")  # one size for every block
    blocks = [f"sa_block_{k}={block}" for k in SPLASH_BLOCKS] if block else []
    fused = [f"sa_use_fused_bwd_kernel={knobs['sa_use_fused_bwd_kernel'].lower()}"] \
        if "sa_use_fused_bwd_kernel" in knobs else []
    slice_name = T.parse_target(r.target).slice_name

    def argv_for(base_yml):
        return ["train_compile", base_yml, "run_name=peer", f"compile_topology={slice_name}",
                "compile_topology_num_slices=1", f"model_name={r.preset}",
                f"max_target_length={model.seq_len}", f"per_device_batch_size={rows}",
                "remat_policy=custom", *offloads, "attention=flash", *blocks, *fused, "dtype=bfloat16",
                "weight_dtype=float32", "enable_dropout=false", "dataset_type=synthetic", "enable_checkpointing=false",
                "opt_type=adamw", "skip_jax_distributed_system=true", "ici_fsdp_parallelism=-1"]

    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"diag_recipe_maxtext_{slice_name}_{rows}.json")
    M.compile_maxtext_step(name, r.target, r.flags, argv_for, model, rows * r.chips, out)
    with open(out) as f:
        res = json.load(f)
    print(json.dumps({k: res.get(k) for k in ("name", "argv", "error", "predicted_oom", "memory", "peak_bytes",
                                              "hbm_bytes", "fits", "predicted_step_time", "compile_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
