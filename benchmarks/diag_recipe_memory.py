"""Where a recipe's compiled step holds its memory: one compile-only TPU compile of a recipe's
nearest config (benchmarks/published.py RECIPES), in this process, with the compiler's own words.

Prints the analytic state per chip (parameters, gradients + AdamW moments), then either the compiled
memory_analysis() (arguments, outputs, aliases, temporaries, host temporaries) and the
largest buffers of the optimized HLO's buffer assignment (an XLA dump), or, when the TPU
compiler refuses the step for memory, its whole RESOURCE_EXHAUSTED message, which lists the
largest program allocations in HBM with their shapes and HLO names.

    python benchmarks/diag_recipe_memory.py "v6e-256 Llama3.1-8B"
    python benchmarks/diag_recipe_memory.py "v6e-256 Llama3.1-8B" --set remat=full --set model.vocab_tiles=8
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import published as P  # noqa: E402

GiB = 2 ** 30


def _override(cfg, item: str):
    """`remat=...`, `flags=...`, `model.<field>=...`: a TrainConfig with that field replaced."""
    import ast
    name, text = item.split("=", 1)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    if name.startswith("model."):
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **{name[len("model."):]: value}))
    if name.startswith("optimizer."):
        opt = dataclasses.replace(cfg.optimizer, **{name[len("optimizer."):]: value})
        return dataclasses.replace(cfg, optimizer=opt)
    return dataclasses.replace(cfg, **{name: value})


def largest_buffers(dump: str, top: int) -> list[str]:
    """The `top` largest allocations of the dump's buffer assignment, as its lines print them."""
    files = sorted(glob.glob(os.path.join(dump, "*jit_train_step*buffer-assignment.txt")), key=os.path.getsize)
    if not files:
        return [f"(no buffer assignment in {dump}: {os.listdir(dump)[:8]})"]
    text = open(files[-1]).read()
    allocs = re.findall(r"^allocation (\d+): size (\d+)(.*)$", text, flags=re.M)
    allocs.sort(key=lambda a: -int(a[1]))
    out = []
    for idx, size, rest in allocs[:top]:
        # the allocation's values: the lines after it, up to the next allocation
        block = text.split(f"allocation {idx}: size {size}", 1)[1].split("\nallocation ", 1)[0]
        values = [v.strip() for v in block.splitlines()[1:4] if v.strip()]
        out.append(f"{int(size) / GiB:8.3f} GiB  alloc {idx}{rest[:100]}\n            " + "\n            ".join(
            v[:200] for v in values))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe", choices=list(P.RECIPES_BY_NAME))
    ap.add_argument("--set", action="append", default=[], help="field=value on the recipe's config (repeatable)")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    r = P.RECIPES_BY_NAME[args.recipe]
    cfg = P.recipe_config(r)
    for item in args.set:
        cfg = _override(cfg, item)

    from paxsearch.search.planning import topology as topo
    from paxsearch.trainer import flagsets, flops
    os.environ.update(flagsets.env_for(cfg.flags, "tpu"))
    os.environ.update(topo.compile_only_env(topo.parse_slice(r.target.split(":")[1])))
    os.environ["JAX_PLATFORMS"] = "cpu"
    from paxsearch.trainer.plan import build_program
    from paxsearch.trainer.state_memory import dtype_bytes, train_state_bytes

    n = flops.param_count(cfg.model)
    print(f"{r.name}: remat={cfg.remat} flags={cfg.flags} vocab_tiles={cfg.model.vocab_tiles} "
          f"global_batch={cfg.global_batch} mesh={cfg.mesh.ici}")
    state = train_state_bytes(n, dtype_bytes(cfg.model.param_dtype), r.chips)
    print(f"analytic state per chip: params {n:,} x (parameter, gradient, 2 AdamW moments: "
          f"4 x {dtype_bytes(cfg.model.param_dtype)} B) / {r.chips} = {state / GiB:.3f} GiB")
    devices = topo.topology_devices(r.target.split(":")[1])
    dump = tempfile.mkdtemp(prefix="diag_dump_")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
    t0 = time.perf_counter()
    try:
        program = build_program(cfg, devices, count_flops=False)
    except Exception as e:  # the compiler's OOM: its message names the largest allocations
        print(f"compile failed after {time.perf_counter() - t0:.0f} s: {type(e).__name__}")
        print(getattr(e, "error_message", None) or str(e))
        return 1
    m = program.plan.memory
    print(f"compiled in {time.perf_counter() - t0:.0f} s; per chip GiB: arguments {m.argument_bytes / GiB:.3f}, "
          f"outputs {m.output_bytes / GiB:.3f}, aliases {m.alias_bytes / GiB:.3f}, "
          f"temporaries {m.temp_bytes / GiB:.3f}, "
          f"host temporaries {m.host_temp_bytes / GiB:.3f}; peak {m.peak_bytes / GiB:.3f}")
    print("largest allocations (buffer assignment):")
    print("\n".join(largest_buffers(dump, args.top)))
    print(f"(dump: {dump})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
